package node

import (
	"context"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/rules"
)

// ringlimit_lease_seconds_remaining: +Inf without leases (a single
// member may always answer), then what is left of the lease, 0 once it
// has run out; a shorter grant never shortens it (SetLeaseUntil).
func TestLeaseSeconds(t *testing.T) {
	if got := leaseSeconds(nil); got != 0 {
		t.Errorf("leaseSeconds(no owner) = %v, want 0", got)
	}
	synctest.Test(t, func(t *testing.T) {
		o := newOwner(t, "a")
		start := time.Now()
		for _, step := range []struct {
			at     time.Duration // since start
			lease  bool          // EnableLease
			grant  time.Duration // SetLeaseUntil(start+grant) when > 0
			want   float64
			reason string
		}{
			{0, false, 0, math.Inf(1), "no lease needed"},
			{0, true, 0, 0, "lease needed, none granted"},
			{0, true, 3 * time.Second, 3, "granted"},
			{time.Second, true, 0, 2, "a second later"},
			{time.Second, true, 2 * time.Second, 2, "a shorter grant does not shorten it"},
			{2500 * time.Millisecond, true, 0, 0.5, "half a second left"},
			{4 * time.Second, true, 0, 0, "run out"},
			{4 * time.Second, false, 0, math.Inf(1), "alone again"},
		} {
			time.Sleep(time.Until(start.Add(step.at)))
			o.EnableLease(step.lease)
			if step.grant > 0 {
				o.SetLeaseUntil(start.Add(step.grant))
			}
			if got := leaseSeconds(o); got != step.want {
				t.Errorf("at %v (%s): leaseSeconds = %v, want %v", step.at, step.reason, got, step.want)
			}
			if got := o.Serving(); got != (step.want > 0) {
				t.Errorf("at %v (%s): Serving = %v, want %v (lease %v)", step.at, step.reason, got, step.want > 0, step.want)
			}
		}
	})
}

func TestMembersByState(t *testing.T) {
	m := func(id string, s fsm.MemberState) fsm.Member { return fsm.Member{ID: id, State: s} }
	for _, tc := range []struct {
		st   *fsm.State
		want [4]int // active, draining, down, dead
	}{
		{nil, [4]int{}},
		{&fsm.State{}, [4]int{}},
		{&fsm.State{Members: []fsm.Member{m("a", fsm.Active)}}, [4]int{1, 0, 0, 0}},
		{&fsm.State{Members: []fsm.Member{m("a", fsm.Active), m("b", fsm.Dead), m("c", fsm.Active), m("d", fsm.Draining), m("e", fsm.Down)}}, [4]int{2, 1, 1, 1}},
	} {
		if got := membersByState(tc.st); got != tc.want {
			t.Errorf("membersByState(%v) = %v, want %v", tc.st, got, tc.want)
		}
	}
}

// ringlimit_members reports every state, 0 included, from the state of the
// member's published view.
func TestMembersCollector(t *testing.T) {
	n := &Node{}
	c := n.stateCollectors()[1]
	want := func(active, draining, down, dead int) string {
		return "# HELP ringlimit_members Members of the cluster by state (active, draining, down, dead), as this member's view has them.\n" +
			"# TYPE ringlimit_members gauge\n" +
			"ringlimit_members{state=\"active\"} " + strconv.Itoa(active) + "\n" +
			"ringlimit_members{state=\"dead\"} " + strconv.Itoa(dead) + "\n" +
			"ringlimit_members{state=\"down\"} " + strconv.Itoa(down) + "\n" +
			"ringlimit_members{state=\"draining\"} " + strconv.Itoa(draining) + "\n"
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(0, 0, 0, 0)), "ringlimit_members"); err != nil {
		t.Errorf("no view: %v", err)
	}
	n.snap.Store(&snapshot{st: &fsm.State{Members: []fsm.Member{{ID: "a", State: fsm.Active}, {ID: "b", State: fsm.Active}, {ID: "c", State: fsm.Dead}}}})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(2, 0, 0, 1)), "ringlimit_members"); err != nil {
		t.Errorf("a, b active, c dead: %v", err)
	}
}

// A rules file that cannot be read or is invalid is a refused load
// (last_load_ok 0, loads_total{result="error"}); content already applied
// (the data dir's marker) is a good one. WatchRulesFile counts a read
// error once, not at every tick.
func TestRulesFileMetrics(t *testing.T) {
	dir := t.TempDir()
	n := &Node{log: slog.New(slog.DiscardHandler), m: newNodeMetrics(), cfg: Config{DataDir: dir, Registerer: prometheus.NewRegistry()}}
	loads := func(result string) float64 { return testutil.ToFloat64(n.m.rulesFileLoads.WithLabelValues(result)) }
	check := func(what string, ok, good, bad float64) {
		t.Helper()
		if got := testutil.ToFloat64(n.m.rulesFileOK); got != ok {
			t.Errorf("%s: last_load_ok = %v, want %v", what, got, ok)
		}
		if g, b := loads("ok"), loads("error"); g != good || b != bad {
			t.Errorf("%s: loads ok=%v error=%v, want %v, %v", what, g, b, good, bad)
		}
	}
	path := filepath.Join(dir, "rules.yaml")
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); n.WatchRulesFile(ctx, path, time.Second) }()
		synctest.Wait()
		check("missing file", 0, 0, 1)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		check("missing file, three ticks later", 0, 0, 1)
		cancel()
		<-done
	})

	valid := []byte("rules:\n  - {name: r, algorithm: gcra, limit: 10, period: 1s}\n")
	written, err := rules.Parse(valid)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, appliedFile), []byte(rules.Fingerprint(written)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if retry := n.applyRulesFile(t.Context(), path, valid); retry {
		t.Fatal("applyRulesFile(already applied) asks for a retry")
	}
	check("already applied", 1, 1, 1)
	if retry := n.applyRulesFile(t.Context(), path, []byte("rules:\n  - {name: r, algorithm: nope, limit: 1, period: 1s}\n")); retry {
		t.Fatal("applyRulesFile(invalid) asks for a retry")
	}
	check("invalid", 0, 1, 2)
}

// Changed content of the rules file is applied only once it reads the
// same twice, rulesFileSettle apart: a file caught in the middle of its
// write (here half written, and still a valid document with one rule of
// two) is never applied, which removed the other rule from the whole
// cluster for an interval.
func TestRulesFileAppliedOnceSettled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	one := "rules:\n  - {name: a, algorithm: gcra, limit: 10, period: 1s}\n"
	two := one + "  - {name: b, algorithm: gcra, limit: 10, period: 1s}\n"
	write := func(doc string) {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(two)
	synctest.Test(t, func(t *testing.T) {
		n := &Node{log: slog.New(slog.DiscardHandler), m: newNodeMetrics(), cfg: Config{Registerer: prometheus.NewRegistry()}}
		var applied []string
		apply := func(_ context.Context, _ string, data []byte) bool {
			applied = append(applied, string(data))
			return false
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); n.watchRulesFile(ctx, path, time.Second, apply) }()
		time.Sleep(rulesFileSettle(time.Second) + time.Millisecond)
		synctest.Wait()
		if len(applied) != 1 || applied[0] != two {
			t.Fatalf("at start: applied %q, want the file once", applied)
		}
		time.Sleep(850 * time.Millisecond)                                     // 49 ms before the next tick
		write(one)                                                             // the write begins...
		time.Sleep(50 * time.Millisecond)                                      // ...the tick reads it...
		write(two + "  - {name: c, algorithm: gcra, limit: 10, period: 1s}\n") // ...and it ends
		time.Sleep(time.Second)
		synctest.Wait()
		if len(applied) != 2 || strings.Count(applied[1], "name:") != 3 {
			t.Fatalf("after a write read half-way: applied %q, want the whole new file once", applied)
		}
		cancel()
		<-done
	})
}

// A rules file that cannot be put in force at start (no leader yet, say)
// is tried again soon, then less often, up to every 200 ms: each try
// parses it again and may forward it to the leader, and at a fixed 50 ms
// a 10,000-rule file took most of a core while a start waited (audit).
func TestRulesFileRetriesAtStartBackOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - {name: a, algorithm: gcra, limit: 10, period: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		n := &Node{log: slog.New(slog.DiscardHandler), m: newNodeMetrics(), cfg: Config{Registerer: prometheus.NewRegistry()}}
		var tries []time.Duration
		start := time.Now()
		apply := func(context.Context, string, []byte) bool {
			tries = append(tries, time.Since(start))
			return true // not in force yet
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); n.watchRulesFile(ctx, path, time.Second, apply) }()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		cancel()
		<-done
		// The first try after the settle read (100 ms), then 50, 100,
		// then every 200 ms: 50 in 10 s, where 50 ms every time made 199.
		if len(tries) < 45 || len(tries) > 52 {
			t.Fatalf("%d tries in 10 s: %v; want about 50 (backing off to every 200 ms)", len(tries), tries)
		}
		for i := 3; i < len(tries); i++ {
			if gap := tries[i] - tries[i-1]; gap != 200*time.Millisecond {
				t.Fatalf("tries %v: gap %v after the third, want 200ms", tries, gap)
			}
		}
	})
}
