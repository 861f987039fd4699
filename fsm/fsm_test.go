package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

var testConfig = Config{Partitions: 64, ReplicationFactor: 16, Load: 1.25, Seed: 0x9e3779b97f4a7c15}

var (
	ruleLogin = limiter.Rule{Name: "login", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Minute, FailureMode: limiter.FailClosed}
	ruleAPI   = limiter.Rule{Name: "api", Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second, Burst: 200}
)

func member(id string, port string) Member {
	return Member{ID: id, HTTP: "10.0.0." + id[1:] + ":8080", Raft: "10.0.0." + id[1:] + ":" + port, Peer: "10.0.0." + id[1:] + ":8082", Voter: true}
}

// tb is what the helpers need of *testing.T, *testing.F and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// must returns an encoder's command, failing the test on error.
func must(t tb) func([]byte, error) []byte {
	return func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		return b
	}
}

// applyAt applies data at index and returns the response as an error.
func applyAt(t tb, f *FSM, index uint64, data []byte) error {
	t.Helper()
	resp := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data})
	if resp == nil {
		return nil
	}
	err, ok := resp.(error)
	if !ok {
		t.Fatalf("Apply response %T %v, want error or nil", resp, resp)
	}
	if err == nil {
		t.Fatalf("Apply returned a typed nil error")
	}
	return err
}

type step struct {
	name    string
	cmd     []byte
	wantErr error // errors.Is; nil = success
	check   func(t *testing.T, s *State, index uint64)
}

// runSteps applies steps at indexes 1, 2, … and checks each.
func runSteps(t *testing.T, f *FSM, steps []step) {
	t.Helper()
	for i, st := range steps {
		index := uint64(i + 1)
		before := f.State()
		err := applyAt(t, f, index, st.cmd)
		if st.wantErr == nil && err != nil || st.wantErr != nil && !errors.Is(err, st.wantErr) {
			t.Fatalf("step %d %s: Apply(%s) = %v, want %v", index, st.name, st.cmd, err, st.wantErr)
		}
		if err != nil && f.State() != before {
			t.Fatalf("step %d %s: failed command changed the state", index, st.name)
		}
		if err := checkState(f.State()); err != nil {
			t.Fatalf("step %d %s: state breaks an invariant: %v", index, st.name, err)
		}
		if st.check != nil {
			st.check(t, f.State(), index)
		}
	}
}

func unchanged(t *testing.T, prev **State) func(*testing.T, *State, uint64) {
	return func(t *testing.T, s *State, _ uint64) {
		if s != *prev {
			t.Errorf("no-op command published a new state")
		}
	}
}

func TestCommands(t *testing.T) {
	m := must(t)
	n1, n2 := member("n1", "8081"), member("n2", "8081")
	n1moved := n1
	n1moved.HTTP = "10.0.1.1:8080"
	var saved *State
	save := func(t *testing.T, s *State, _ uint64) { saved = s }
	f := New()
	runSteps(t, f, []step{
		{"add before init", m(AddMember(n1)), ErrNotInitialized, nil},
		{"rules before init", m(PutRules(nil)), ErrNotInitialized, nil},
		{"remove before init", m(RemoveMember("n1")), ErrNotInitialized, nil},
		{"state before init", m(SetMemberState("n1", Down)), ErrNotInitialized, nil},
		{"init", m(Init(testConfig)), nil, func(t *testing.T, s *State, i uint64) {
			want := &State{Initialized: true, Config: testConfig, MembershipIndex: i}
			if !reflect.DeepEqual(s, want) {
				t.Errorf("state = %+v, want %+v", s, want)
			}
		}},
		{"init again", m(Init(Config{Partitions: 8, ReplicationFactor: 2, Load: 2, Seed: 1})), ErrInitialized, func(t *testing.T, s *State, _ uint64) {
			if s.Config != testConfig {
				t.Errorf("second Init overwrote the config: %+v", s.Config)
			}
		}},
		{"add n2", m(AddMember(n2)), nil, func(t *testing.T, s *State, i uint64) {
			want := n2
			want.State, want.Since = Active, i
			if !reflect.DeepEqual(s.Members, []Member{want}) || s.MembershipIndex != i {
				t.Errorf("members = %+v at %d, want [%+v] at %d", s.Members, s.MembershipIndex, want, i)
			}
		}},
		{"add n1 sorts", m(AddMember(n1)), nil, func(t *testing.T, s *State, i uint64) {
			if len(s.Members) != 2 || s.Members[0].ID != "n1" || s.Members[1].ID != "n2" || s.Members[0].Since != i {
				t.Errorf("members = %+v", s.Members)
			}
			saved = s
		}},
		{"add n1 again is a no-op", m(AddMember(n1)), nil, unchanged(t, &saved)},
		{"add n1 ignores state and since", m(AddMember(Member{ID: n1.ID, HTTP: n1.HTTP, Raft: n1.Raft, Peer: n1.Peer, Voter: true, State: Dead, Since: 99})), nil, unchanged(t, &saved)},
		{"add n1 new address", m(AddMember(n1moved)), nil, func(t *testing.T, s *State, i uint64) {
			got, ok := s.Member("n1")
			if !ok || got.HTTP != n1moved.HTTP || got.Since != i || got.State != Active || s.MembershipIndex != i {
				t.Errorf("n1 = %+v (epoch %d), want HTTP %s since %d", got, s.MembershipIndex, n1moved.HTTP, i)
			}
		}},
		{"n1 draining", m(SetMemberState("n1", Draining)), nil, func(t *testing.T, s *State, i uint64) {
			got, _ := s.Member("n1")
			if got.State != Draining || got.Since != i || s.MembershipIndex != i {
				t.Errorf("n1 = %+v (epoch %d)", got, s.MembershipIndex)
			}
			if a := s.Active(); len(a) != 1 || a[0].ID != "n2" {
				t.Errorf("Active() = %+v, want [n2]", a)
			}
			saved = s
		}},
		{"n1 draining again is a no-op", m(SetMemberState("n1", Draining)), nil, unchanged(t, &saved)},
		{"invalid state", []byte(`{"v":1,"op":"set_member_state","id":"n1","state":"sleeping"}`), ErrInvalid, nil},
		{"state of a stranger", m(SetMemberState("ghost", Down)), ErrUnknownMember, nil},
		{"add reactivates", m(AddMember(n1moved)), nil, func(t *testing.T, s *State, i uint64) {
			if got, _ := s.Member("n1"); got.State != Active || got.Since != i {
				t.Errorf("n1 = %+v, want active since %d", got, i)
			}
		}},
		{"remove n2", m(RemoveMember("n2")), nil, func(t *testing.T, s *State, i uint64) {
			if _, ok := s.Member("n2"); ok || len(s.Members) != 1 || s.MembershipIndex != i {
				t.Errorf("members = %+v (epoch %d)", s.Members, s.MembershipIndex)
			}
		}},
		{"remove n2 again", m(RemoveMember("n2")), ErrUnknownMember, nil},
		{"put rules", m(PutRules([]limiter.Rule{ruleLogin, ruleAPI})), nil, func(t *testing.T, s *State, i uint64) {
			if !reflect.DeepEqual(s.Rules, []limiter.Rule{ruleLogin, ruleAPI}) || s.RulesIndex != i {
				t.Errorf("rules = %+v at %d", s.Rules, s.RulesIndex)
			}
			if s.MembershipIndex == i {
				t.Errorf("a rules write moved the ring epoch")
			}
			if e := s.EffectiveRules(); len(e) != 3 || e[0] != rules.Default() {
				t.Errorf("EffectiveRules = %+v", e)
			}
			saved = s
		}},
		{"put invalid rules", []byte(`{"v":1,"op":"put_rules","rules":[{"name":"x","algorithm":"gcra","limit":0,"period_ns":1000000000,"burst":0,"failure_mode":"open"}]}`),
			rules.ErrInvalid, func(t *testing.T, s *State, _ uint64) {
				if s != saved {
					t.Errorf("invalid rules changed the state")
				}
			}},
		{"put duplicate rules", []byte(`{"v":1,"op":"put_rules","rules":[` +
			`{"name":"x","algorithm":"gcra","limit":1,"period_ns":1000000000,"burst":0,"failure_mode":"open"},` +
			`{"name":"x","algorithm":"gcra","limit":2,"period_ns":1000000000,"burst":0,"failure_mode":"open"}]}`), rules.ErrInvalid, nil},
		{"put unknown algorithm", []byte(`{"v":1,"op":"put_rules","rules":[{"name":"x","algorithm":"magic","limit":1,"period_ns":1000000000}]}`), ErrMalformed, nil},
		{"put no rules", m(PutRules(nil)), nil, func(t *testing.T, s *State, i uint64) {
			if s.Rules != nil || s.RulesIndex != i {
				t.Errorf("rules = %+v at %d, want none at %d", s.Rules, s.RulesIndex, i)
			}
		}},
		{"unknown op", []byte(`{"v":1,"op":"reboot"}`), ErrUnknownOp, nil},
		{"version 2", []byte(`{"v":2,"op":"put_rules","rules":[]}`), ErrVersion, nil},
		{"no version", []byte(`{"op":"put_rules","rules":[]}`), ErrVersion, nil},
		{"garbage", []byte("\x00\x01garbage"), ErrMalformed, nil},
		{"empty", nil, ErrMalformed, nil},
		{"not an object", []byte(`[1,2]`), ErrMalformed, nil},
		{"unknown field", []byte(`{"v":1,"op":"remove_member","id":"n1","force":true}`), ErrMalformed, nil},
		{"another op's field", []byte(`{"v":1,"op":"remove_member","id":"n1","rules":[]}`), ErrMalformed, nil},
		{"trailing data", []byte(`{"v":1,"op":"remove_member","id":"n1"} {}`), ErrMalformed, nil},
		{"wrong type", []byte(`{"v":1,"op":"remove_member","id":7}`), ErrMalformed, nil},
		{"empty member id", []byte(`{"v":1,"op":"add_member","member":{"id":"","http":"a:1","raft":"a:2","peer":"a:3"}}`), ErrInvalid, nil},
		{"member without address", []byte(`{"v":1,"op":"add_member","member":{"id":"n9","http":"a:1","raft":"a:2"}}`), ErrInvalid, nil},
		{"id with a space", []byte(`{"v":1,"op":"add_member","member":{"id":"n 1","http":"a:1","raft":"a:2","peer":"a:3"}}`), ErrInvalid, nil},
		{"save", m(SetMemberState("n1", Down)), nil, save},
	})
	if saved == nil || len(saved.Members) != 1 || saved.Members[0].State != Down {
		t.Fatalf("final state = %+v", saved)
	}
}

func TestInitErrors(t *testing.T) {
	bad := []struct {
		name string
		cmd  string
	}{
		{"no config", `{"v":1,"op":"init"}`},
		{"zero partitions", `{"v":1,"op":"init","config":{"partitions":0,"replication_factor":16,"load":1.25,"seed":1}}`},
		{"replication factor 1", `{"v":1,"op":"init","config":{"partitions":8,"replication_factor":1,"load":1.25,"seed":1}}`},
		{"load 1", `{"v":1,"op":"init","config":{"partitions":8,"replication_factor":2,"load":1,"seed":1}}`},
		{"seed 0", `{"v":1,"op":"init","config":{"partitions":8,"replication_factor":2,"load":1.5,"seed":0}}`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			f := New()
			if err := applyAt(t, f, 1, []byte(tt.cmd)); !errors.Is(err, ErrInvalid) {
				t.Errorf("Apply = %v, want ErrInvalid", err)
			}
			if f.State().Initialized {
				t.Errorf("invalid Init initialized the cluster")
			}
		})
	}
}

func TestEncoderErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"Init zero", second(Init(Config{})), ErrInvalid},
		{"Init no seed", second(Init(Config{Partitions: 8, ReplicationFactor: 2, Load: 2})), ErrInvalid},
		{"PutRules invalid", second(PutRules([]limiter.Rule{{Name: "x"}})), rules.ErrInvalid},
		{"PutRules duplicate", second(PutRules([]limiter.Rule{ruleAPI, ruleAPI})), rules.ErrInvalid},
		{"AddMember empty", second(AddMember(Member{})), ErrInvalid},
		{"AddMember long id", second(AddMember(Member{ID: strings.Repeat("x", MaxIDLen+1), HTTP: "a:1", Raft: "a:2", Peer: "a:3"})), ErrInvalid},
		{"RemoveMember empty", second(RemoveMember("")), ErrInvalid},
		{"SetMemberState bad state", second(SetMemberState("n1", "resting")), ErrInvalid},
		{"SetMemberState empty id", second(SetMemberState("", Down)), ErrInvalid},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, tt.err, tt.want)
		}
	}
}

func second(_ []byte, err error) error { return err }

func TestMemberLimit(t *testing.T) {
	m := must(t)
	f := New()
	cfg := Config{Partitions: 2, ReplicationFactor: 2, Load: 1.5, Seed: 7}
	runSteps(t, f, []step{
		{"init", m(Init(cfg)), nil, nil},
		{"n1", m(AddMember(member("n1", "1"))), nil, nil},
		{"n2", m(AddMember(member("n2", "1"))), nil, nil},
		{"n3 is one too many", m(AddMember(member("n3", "1"))), ErrInvalid, nil},
		{"n2 may still move", m(AddMember(member("n2", "2"))), nil, nil},
	})
}

func TestErrorMessages(t *testing.T) {
	m := must(t)
	f := New()
	applyAt(t, f, 1, m(Init(testConfig)))
	tests := []struct {
		cmd  string
		want string
	}{
		{`{"v":1,"op":"put_rules","rules":[{"name":"login","algorithm":"gcra","limit":1,"period_ns":0}]}`, `rule "login": period: must be > 0, got 0s`},
		{`{"v":1,"op":"remove_member","id":"ghost"}`, `fsm: unknown member "ghost"`},
		{`{"v":3,"op":"init"}`, `fsm: unsupported command version 3 (want 1)`},
		{`{"v":1,"op":"reboot"}`, `fsm: unknown command "reboot"`},
		{`{"v":1,"op":"init","config":{"partitions":1,"replication_factor":2,"load":2,"seed":1}}`, `fsm: cluster already initialized`},
	}
	for _, tt := range tests {
		if err := applyAt(t, f, 2, []byte(tt.cmd)); err == nil || err.Error() != tt.want {
			t.Errorf("Apply(%s) = %v, want %s", tt.cmd, err, tt.want)
		}
	}
}

func TestStateAccessors(t *testing.T) {
	s := &State{Members: []Member{
		{ID: "a", State: Active}, {ID: "b", State: Dead}, {ID: "c", State: Active}, {ID: "d", State: Draining},
	}}
	for _, id := range []string{"a", "b", "c", "d"} {
		if m, ok := s.Member(id); !ok || m.ID != id {
			t.Errorf("Member(%q) = %+v, %v", id, m, ok)
		}
	}
	for _, id := range []string{"", "0", "bb", "e"} {
		if m, ok := s.Member(id); ok {
			t.Errorf("Member(%q) = %+v, true", id, m)
		}
	}
	if a := s.Active(); len(a) != 2 || a[0].ID != "a" || a[1].ID != "c" {
		t.Errorf("Active() = %+v", a)
	}
	if a := (&State{}).Active(); a != nil {
		t.Errorf("empty Active() = %+v", a)
	}
	if r := testConfig.Ring(); r.Validate() != nil || r.Partitions != 64 {
		t.Errorf("Ring() = %+v", r)
	}
}

// memSink is an in-memory raft.SnapshotSink.
type memSink struct {
	bytes.Buffer
	failWrite         bool
	closed, cancelled bool
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.failWrite {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}
func (s *memSink) ID() string            { return "mem" }
func (s *memSink) Cancel() error         { s.cancelled = true; return nil }
func (s *memSink) Close() error          { s.closed = true; return nil }
func (s *memSink) reader() io.ReadCloser { return io.NopCloser(bytes.NewReader(s.Bytes())) }

// snapshotOf persists f's snapshot into memory.
func snapshotOf(t tb, f *FSM) *memSink {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("Persist: closed %v, cancelled %v", sink.closed, sink.cancelled)
	}
	return sink
}

// populated returns an FSM with config, members and rules.
func populated(t tb) *FSM {
	m := must(t)
	f := New()
	for i, cmd := range [][]byte{
		m(Init(testConfig)),
		m(AddMember(member("n2", "8081"))),
		m(AddMember(member("n1", "8081"))),
		m(AddMember(member("n3", "8081"))),
		m(SetMemberState("n3", Dead)),
		m(PutRules([]limiter.Rule{ruleLogin, ruleAPI, rules.Default()})),
	} {
		if err := applyAt(t, f, uint64(10+i), cmd); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestSnapshotRestore(t *testing.T) {
	for _, f := range []*FSM{New(), populated(t)} {
		sink := snapshotOf(t, f)
		g := New()
		if err := g.Restore(sink.reader()); err != nil {
			t.Fatalf("Restore: %v\n%s", err, sink.Bytes())
		}
		if !reflect.DeepEqual(g.State(), f.State()) {
			t.Errorf("restored %+v\nwant     %+v", g.State(), f.State())
		}
	}
	// Restore discards what was there.
	f := populated(t)
	if err := f.Restore(snapshotOf(t, New()).reader()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.State(), &State{}) {
		t.Errorf("Restore(empty) left %+v", f.State())
	}
}

func TestSnapshotIsImmutable(t *testing.T) {
	f := populated(t)
	snap, _ := f.Snapshot()
	want := snapshotOf(t, f).String()
	applyAt(t, f, 100, must(t)(RemoveMember("n1")))
	applyAt(t, f, 101, must(t)(PutRules(nil)))
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	if sink.String() != want {
		t.Errorf("snapshot changed after Apply:\n%s\nwant\n%s", sink.String(), want)
	}
}

func TestPersistCancels(t *testing.T) {
	snap, _ := populated(t).Snapshot()
	sink := &memSink{failWrite: true}
	if err := snap.Persist(sink); err == nil {
		t.Fatal("Persist to a failing sink succeeded")
	}
	if !sink.cancelled || sink.closed {
		t.Errorf("Persist on error: cancelled %v, closed %v; want Cancel only", sink.cancelled, sink.closed)
	}
}

func TestRestoreRejects(t *testing.T) {
	good := snapshotOf(t, populated(t)).String()
	replace := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("snapshot %s has no %s", good, old)
		}
		return strings.Replace(good, old, new, 1)
	}
	tests := []struct {
		name string
		snap string
	}{
		{"empty", ""},
		{"garbage", "\x89PNG"},
		{"truncated", good[:len(good)/2]},
		{"trailing data", good + "{}"},
		{"version 2", replace(`"v":1`, `"v":2`)},
		{"no version", replace(`"v":1,`, ``)},
		{"unknown field", replace(`"v":1,`, `"v":1,"extra":1,`)},
		{"bad config", replace(`"partitions":64`, `"partitions":0`)},
		{"unsorted members", replace(`"id":"n1"`, `"id":"n9"`)},
		{"duplicate members", replace(`"id":"n1"`, `"id":"n2"`)},
		{"bad member state", replace(`"state":"dead"`, `"state":"zombie"`)},
		{"member changed in the future", replace(`"since":12`, `"since":999`)},
		{"invalid rules", replace(`"limit":5`, `"limit":0`)},
		{"unknown algorithm", replace(`"sliding_log"`, `"quantum"`)},
		{"uninitialized with members", replace(`"initialized":true`, `"initialized":false`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := populated(t)
			before := f.State()
			ch, cancel := f.Watch()
			defer cancel()
			err := f.Restore(io.NopCloser(strings.NewReader(tt.snap)))
			if !errors.Is(err, ErrSnapshot) {
				t.Errorf("Restore = %v, want ErrSnapshot", err)
			}
			if f.State() != before {
				t.Errorf("failed Restore changed the state")
			}
			if len(ch) != 0 {
				t.Errorf("failed Restore notified")
			}
		})
	}
}

func TestWatch(t *testing.T) {
	m := must(t)
	f := New()
	ch1, cancel1 := f.Watch()
	ch2, cancel2 := f.Watch()
	defer cancel2()
	pending := func(ch <-chan struct{}) int {
		n := 0
		for {
			select {
			case <-ch:
				n++
			default:
				return n
			}
		}
	}
	// Three changes coalesce into one notification.
	applyAt(t, f, 1, m(Init(testConfig)))
	applyAt(t, f, 2, m(AddMember(member("n1", "1"))))
	applyAt(t, f, 3, m(PutRules([]limiter.Rule{ruleAPI})))
	if n1, n2 := pending(ch1), pending(ch2); n1 != 1 || n2 != 1 {
		t.Errorf("after 3 changes: %d and %d notifications, want 1 and 1", n1, n2)
	}
	// Failed commands and no-ops do not notify.
	applyAt(t, f, 4, m(Init(testConfig)))
	applyAt(t, f, 5, m(AddMember(member("n1", "1"))))
	applyAt(t, f, 6, []byte("junk"))
	if n := pending(ch1); n != 0 {
		t.Errorf("after failed and no-op commands: %d notifications, want 0", n)
	}
	// A notification comes after the state it announces.
	applyAt(t, f, 7, m(SetMemberState("n1", Draining)))
	<-ch1
	if got, _ := f.State().Member("n1"); got.State != Draining {
		t.Errorf("notified before the state was published: %+v", got)
	}
	// Cancel stops notifications, to this subscriber only; twice is fine.
	cancel1()
	cancel1()
	pending(ch2)
	applyAt(t, f, 8, m(RemoveMember("n1")))
	if n1, n2 := pending(ch1), pending(ch2); n1 != 0 || n2 != 1 {
		t.Errorf("after cancel: %d and %d notifications, want 0 and 1", n1, n2)
	}
	// Restore notifies.
	if err := f.Restore(snapshotOf(t, populated(t)).reader()); err != nil {
		t.Fatal(err)
	}
	if n := pending(ch2); n != 1 {
		t.Errorf("after Restore: %d notifications, want 1", n)
	}
}

// A watcher woken by a change finds the entry that made it in Applied,
// as it finds its state. A node's leader, woken so, sends its followers
// the commit of what Applied counts (announceCommit): Applied was stored
// after the watchers were told, and a woken leader that read it first
// sent nothing, so a write whose caller had given up reached the
// followers only at Raft's next idle replication (clustertest's
// TestGivenUpWriteReachesFollowersAtOnce, 1 run in 30–45 under load).
// The test holds the watchers' lock, so Apply stops where it tells them.
func TestAppliedBeforeWatchersAreTold(t *testing.T) {
	m := must(t)
	f := New()
	applyAt(t, f, 1, m(Init(testConfig)))
	before, put := f.State(), m(PutRules([]limiter.Rule{ruleAPI}))
	f.subMu.Lock()
	done := make(chan any)
	go func() { done <- f.Apply(&raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: put}) }()
	for f.State() == before { // published: Apply now waits for the lock
		runtime.Gosched()
	}
	applied := f.Applied()
	f.subMu.Unlock()
	if resp := <-done; resp != nil {
		t.Fatalf("Apply(PutRules) = %v", resp)
	}
	if applied != 2 {
		t.Errorf("Applied() = %d when entry 2's state was published, before its watchers were told; want 2", applied)
	}
}

func TestResult(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		fut  raft.ApplyFuture
		want error
	}{
		{fakeFuture{}, nil},
		{fakeFuture{resp: boom}, boom},
		{fakeFuture{err: raft.ErrNotLeader, resp: boom}, raft.ErrNotLeader},
		{fakeFuture{resp: "not an error"}, nil},
	}
	for _, tt := range tests {
		if got := Result(tt.fut); got != tt.want {
			t.Errorf("Result(%+v) = %v, want %v", tt.fut, got, tt.want)
		}
	}
}

type fakeFuture struct {
	err  error
	resp any
}

func (f fakeFuture) Error() error  { return f.err }
func (f fakeFuture) Response() any { return f.resp }
func (f fakeFuture) Index() uint64 { return 0 }

// TestConcurrentReaders runs readers and watchers against a writer; run
// with -race.
func TestConcurrentReaders(t *testing.T) {
	m := must(t)
	f := New()
	applyAt(t, f, 1, m(Init(testConfig)))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, cancel := f.Watch()
			defer cancel()
			for {
				select {
				case <-done:
					return
				case <-ch:
				default:
				}
				s := f.State()
				for _, mem := range s.Active() {
					if got, ok := s.Member(mem.ID); !ok || got != mem {
						t.Errorf("Member(%q) = %+v, %v", mem.ID, got, ok)
						return
					}
				}
				_ = s.EffectiveRules()
			}
		}()
	}
	for i := range 200 {
		id := fmt.Sprintf("n%d", i%7)
		var cmd []byte
		switch i % 3 {
		case 0:
			cmd = m(AddMember(member(id, "1")))
		case 1:
			cmd = m(SetMemberState(id, Draining))
		case 2:
			cmd = m(PutRules([]limiter.Rule{ruleAPI}))
		}
		applyAt(t, f, uint64(i+2), cmd)
		if i == 100 {
			if err := f.Restore(snapshotOf(t, f).reader()); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
}

// WrittenRules reads back what a PutRules command writes, and nothing
// from any other command or bytes.
func TestWrittenRules(t *testing.T) {
	rs := []limiter.Rule{{Name: "login", Algorithm: limiter.SlidingLog, Limit: 8, Period: time.Minute, Burst: 8}}
	put, err := PutRules(rs)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := WrittenRules(put); !ok || !reflect.DeepEqual(got, rs) {
		t.Fatalf("WrittenRules(PutRules(%v)) = %v, %v", rs, got, ok)
	}
	if got, ok := WrittenRules(mustCmd(PutRules(nil))); !ok || len(got) != 0 {
		t.Fatalf("WrittenRules(PutRules(nil)) = %v, %v; want no rules, true", got, ok)
	}
	add := mustCmd(AddMember(Member{ID: "n1", HTTP: "h:1", Raft: "h:2", Peer: "h:3"}))
	for name, data := range map[string][]byte{
		"another command": add,
		"not json":        []byte("{"),
		"another version": bytes.Replace(put, []byte(`"v":1`), []byte(`"v":2`), 1),
		"unknown field":   bytes.Replace(put, []byte(`{"v"`), []byte(`{"x":1,"v"`), 1),
	} {
		if got, ok := WrittenRules(data); ok {
			t.Errorf("%s: WrittenRules = %v, true; want false", name, got)
		}
	}
}

func mustCmd(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
