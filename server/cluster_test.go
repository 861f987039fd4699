package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
)

// These tests run real members in one process: real Raft over loopback
// TCP, the real data plane, real HTTP listeners. Sockets are not fake
// time, so they wait for conditions (eventually), never for a fixed while.

// Budgets of the members these tests start, sized for a loaded -race run
// on a 2-core CI machine (several members and packages at once), not for
// a quiet one: the tests assert exact counts and no degraded answer, so a
// budget that runs out under load fails them though nothing is wrong.
//
// Raft's heartbeat and election timeout is the product's default. At
// 300ms (a 150ms leader lease) the first leader lost its leadership under
// load in 2 of 5 runs, while it promoted the joined members to voters: a
// promotion cut short that way is not retried (the member stays a
// non-voter, and a test waiting for five voters waits in vain), and the
// test's checks met a leader change. The router waits seconds, not the
// default 250ms, for an owner.
const (
	testRaftTimeout   = time.Second
	testRouterTimeout = 5 * time.Second
)

func listen(t testing.TB) Listeners {
	t.Helper()
	var ls Listeners
	for _, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		*l = ln
	}
	return ls
}

func startMember(t *testing.T, id, dir, join string) *Server {
	t.Helper()
	s, err := startMemberOn(t, id, dir, join, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startMemberOn starts member id over dir on ls, advertising ls's
// addresses, with the tests' settings; it stops at the test's cleanup.
func startMemberOn(t testing.TB, id, dir, join string, ls Listeners) (*Server, error) {
	s, err := Start(Config{
		ID: id, HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
		DataDir: dir, Join: []string{join}, Ring: ring.Config{Partitions: 128, ReplicationFactor: 64, Load: 1.25},
		RaftTimeout: testRaftTimeout,
		Router:      router.Config{Timeout: testRouterTimeout, RefreshWait: 2 * time.Second},
		Logger:      testLogger(),
	}, ls)
	if err != nil {
		return nil, err
	}
	shutdownAtCleanup(t, s)
	return s, nil
}

// testLogger writes the members' logs to stderr when SERVERTEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SERVERTEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func shutdownAtCleanup(t testing.TB, s *Server) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
}

// eventually polls cond until it holds or 20s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startCluster starts n members, the first bootstrapping, the others
// joining through it, and waits until every member sees n active owners
// and the joined members are promoted to voters.
func startCluster(t *testing.T, n int) []*Server {
	t.Helper()
	var ss []*Server
	for i := range n {
		join := ""
		if i > 0 {
			join = ss[0].cfg.HTTPAdvertise
		}
		ss = append(ss, startMember(t, fmt.Sprintf("n%d", i+1), t.TempDir(), join))
	}
	waitSettled(t, ss, n)
	waitPromoted(t, ss)
	return ss
}

// waitPromoted waits until every member's cluster state lists as many
// voters as the cluster will have (members join as non-voters and are
// promoted once caught up, up to node.MaxVoters): a test's load then does
// not run into the promotions' Raft configuration changes.
func waitPromoted(t testing.TB, ss []*Server) {
	t.Helper()
	want := min(len(ss), node.MaxVoters)
	eventually(t, fmt.Sprintf("%d voters", want), func() bool {
		for _, s := range ss {
			voters := 0
			for _, m := range s.Node.State().Members {
				if m.Voter {
					voters++
				}
			}
			if voters != want {
				return false
			}
		}
		return true
	})
}

func waitSettled(t testing.TB, ss []*Server, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d members settled", n), func() bool {
		var epoch uint64
		for i, s := range ss {
			v := s.Node.View()
			if v == nil || s.Node.Ready() != nil || len(v.Ring.Members()) != n {
				return false
			}
			if i > 0 && v.Ring.Epoch() != epoch {
				return false
			}
			epoch = v.Ring.Epoch()
		}
		return true
	})
}

func putRules(t *testing.T, ss []*Server, rs ...limiter.Rule) {
	t.Helper()
	if _, err := ss[len(ss)-1].Node.PutRules(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rules everywhere", func() bool {
		for _, s := range ss {
			v := s.Router.View()
			for _, r := range rs {
				r.Burst = r.Capacity() // the cluster stores the canonical form
				if v == nil || v.Rules[r.Name] == nil || *v.Rules[r.Name] != r {
					return false
				}
			}
		}
		return true
	})
}

func check(t *testing.T, s *Server, rule, key string) router.Result {
	t.Helper()
	out := make([]router.Result, 1)
	if err := s.Router.Check(context.Background(), []router.Request{{Rule: rule, Key: key, Cost: 1}}, out); err != nil {
		t.Error(err)
	}
	return out[0]
}

func TestThreeNodesAdmitTheLimitNotThreeTimesIt(t *testing.T) {
	ss := startCluster(t, 3)
	putRules(t, ss,
		limiter.Rule{Name: "log50", Algorithm: limiter.SlidingLog, Limit: 50, Period: time.Hour},
		limiter.Rule{Name: "five", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour},
		limiter.Rule{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 20, Period: time.Second, Burst: 40},
	)
	counts := map[string]int{}
	for _, s := range ss {
		counts[s.Node.ID()] = len(s.Node.View().Ring.PartitionsOf(s.Node.ID()))
	}
	t.Logf("partitions per member: %v", counts)

	t.Run("one key, 300 concurrent checks, limit 50", func(t *testing.T) {
		var allowed, degraded atomic.Int64
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := check(t, ss[i%3], "log50", "hot-key")
				if r.Allowed {
					allowed.Add(1)
				}
				if r.Degraded {
					degraded.Add(1)
				}
			}()
		}
		wg.Wait()
		if allowed.Load() != 50 || degraded.Load() != 0 {
			t.Fatalf("admitted %d (degraded %d), want exactly 50 and none degraded", allowed.Load(), degraded.Load())
		}
	})

	t.Run("200 keys x 10 checks, limit 5", func(t *testing.T) {
		var mu sync.Mutex
		perKey := map[string]int{}
		var wg sync.WaitGroup
		for k := range 200 {
			for i := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("tenant-%d", k)
					if check(t, ss[(k+i)%3], "five", key).Allowed {
						mu.Lock()
						perKey[key]++
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		for k := range 200 {
			if got := perKey[fmt.Sprintf("tenant-%d", k)]; got != 5 {
				t.Fatalf("tenant-%d admitted %d, want exactly 5", k, got)
			}
		}
	})

	t.Run("token bucket stays within burst + rate·T", func(t *testing.T) {
		start := time.Now()
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 150 {
					if check(t, ss[(w+i)%3], "tb", "bucket").Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		bound := 40 + int64(20*elapsed.Seconds()) + 1
		t.Logf("token bucket: %d admitted in %v (bound %d)", allowed.Load(), elapsed, bound)
		if allowed.Load() > bound || allowed.Load() < 40 {
			t.Fatalf("admitted %d in %v, want between the burst 40 and %d", allowed.Load(), elapsed, bound)
		}
	})
}

// A member joins while checks flow: partitions change owners mid-stream.
// Every check gets exactly one decision; the new owners answer after the
// NOT_OWNER retry, and no check is answered degraded.
func TestOwnerChangeMidStream(t *testing.T) {
	ss := startCluster(t, 2)
	putRules(t, ss, limiter.Rule{Name: "big", Algorithm: limiter.SlidingLog, Limit: 10_000, Period: time.Hour})
	stop := make(chan struct{})
	var sent, decided, degraded atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				r := check(t, ss[(w+i)%2], "big", fmt.Sprintf("k%d", i%500))
				decided.Add(1)
				if r.Degraded {
					degraded.Add(1)
				}
			}
		}()
	}
	before := ss[0].Router.View().Ring.Epoch()
	n3 := startMember(t, "n3", t.TempDir(), ss[0].cfg.HTTPAdvertise)
	all := append(ss, n3)
	waitSettled(t, all, 3)
	// Keep the load on a little after the change, then stop.
	target := decided.Load() + 500
	eventually(t, "checks after the change", func() bool { return decided.Load() >= target })
	close(stop)
	wg.Wait()
	after := ss[0].Router.View().Ring.Epoch()
	var notOwner float64
	for _, s := range all {
		mf, _ := s.Registry.Gather()
		for _, f := range mf {
			if f.GetName() == "ringlimit_not_owner_total" {
				notOwner += f.GetMetric()[0].GetCounter().GetValue()
			}
		}
	}
	t.Logf("epoch %d → %d; %d checks, %d NOT_OWNER retries, %d degraded", before, after, decided.Load(), int(notOwner), degraded.Load())
	if sent.Load() != decided.Load() {
		t.Fatalf("%d checks sent, %d decided", sent.Load(), decided.Load())
	}
	if degraded.Load() != 0 {
		t.Fatalf("%d checks answered degraded during the owner change", degraded.Load())
	}
	if len(n3.Node.View().Ring.PartitionsOf("n3")) == 0 {
		t.Fatal("the new member owns nothing")
	}
}

// Without authentication nothing counts as an authentication refusal:
// the leader's probes of a joining member's Raft and data-plane
// addresses (connect, close) once read 2 or 3 on each listener of every
// member of a fresh 3-member cluster.
func TestJoinProbesAreNotAuthRefusals(t *testing.T) {
	ss := startCluster(t, 3)
	for _, s := range ss {
		mf, err := s.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, f := range mf {
			if f.GetName() != "ringlimit_listener_refused_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				seen++
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Errorf("%s: ringlimit_listener_refused_total%v = %v, want 0 (no authentication, nobody refused)", s.cfg.ID, labels, v)
				}
			}
		}
		if seen != 6 { // raft and peer × cap, auth, idle
			t.Errorf("%s: %d ringlimit_listener_refused_total series, want 6", s.cfg.ID, seen)
		}
	}
}

func TestRulesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	s := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s}, 1)
	putRules(t, []*Server{s}, limiter.Rule{Name: "kept", Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	s2 := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s2}, 1)
	if r := s2.Node.View().Rules["kept"]; r == nil || r.Limit != 3 {
		t.Fatalf("after restart the rule is %+v, want the one PUT before", r)
	}
}

// An owner that cannot be reached: its keys are answered by each rule's
// failure mode, degraded; the other keys are unaffected.
func TestOwnerDownFailureModes(t *testing.T) {
	ss := startCluster(t, 2)
	putRules(t, ss,
		limiter.Rule{Name: "open", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour},
		limiter.Rule{Name: "closed", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour, FailureMode: limiter.FailClosed},
	)
	v := ss[0].Router.View()
	keyOwnedBy := func(id string) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("k%d", i)
			if m, _ := v.Ring.Owner(v.Ring.Partition(limiter.KeyHash(v.Seed, k))); m.ID == id {
				return k
			}
		}
	}
	remote, local := keyOwnedBy("n2"), keyOwnedBy("n1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ss[1].stop(ctx, false); err != nil { // gone without a word, as a crash
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rule, key         string
		allowed, degraded bool
	}{
		{"open", remote, true, true},
		{"open", remote, true, true}, // every time: nothing is counted while degraded
		{"closed", remote, false, true},
		{"open", local, true, false},
		{"open", local, false, false}, // limit 1, decided for real by n1
	} {
		r := check(t, ss[0], tc.rule, tc.key)
		if r.Allowed != tc.allowed || r.Degraded != tc.degraded {
			t.Errorf("%s on %s: allowed %v degraded %v, want %v %v", tc.rule, tc.key, r.Allowed, r.Degraded, tc.allowed, tc.degraded)
		}
	}
}

// Members join as non-voters and are promoted once caught up, up to five
// voters; the sixth stays a non-voter and still owns partitions. (Members
// register concurrently, so which one comes sixth is not fixed.)
func TestSixthMemberIsANonVoter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six members")
	}
	ss := startCluster(t, 6)
	var voters, servers int
	var nonVoter string
	eventually(t, "five voters, recorded in the member list", func() bool {
		cf := ss[0].Node.Raft().GetConfiguration()
		if err := cf.Error(); err != nil {
			t.Fatal(err)
		}
		voters, servers, nonVoter = 0, len(cf.Configuration().Servers), ""
		for _, s := range cf.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			} else {
				nonVoter = string(s.ID)
			}
		}
		if voters != 5 || servers != 6 {
			return false
		}
		for _, m := range ss[0].Node.State().Members {
			if m.Voter == (m.ID == nonVoter) {
				return false
			}
		}
		return true
	})
	if n := len(ss[0].Node.View().Ring.PartitionsOf(nonVoter)); n == 0 {
		t.Fatalf("the non-voter %s owns no partitions", nonVoter)
	}
}

// Over HTTP, a new member whose --join names a follower joins: its
// registration reaches the follower unmarked (no X-Ringlimit-Forwarded),
// and the follower forwards it to the leader.
func TestJoinThroughAFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three members")
	}
	ss := startCluster(t, 2)
	l, follower := ss[0], ss[1]
	if l.Node.Raft().State() != raft.Leader {
		l, follower = follower, l
	}
	if err := l.Node.Raft().LeadershipTransferToServer(raft.ServerID(follower.cfg.ID), raft.ServerAddress(follower.cfg.RaftAdvertise)).Error(); err != nil {
		t.Fatal(err)
	}
	follower, l = l, follower
	eventually(t, l.cfg.ID+" leads", func() bool { return l.Node.Raft().State() == raft.Leader })
	n3 := startMember(t, "n3", t.TempDir(), follower.cfg.HTTPAdvertise)
	waitSettled(t, append(ss, n3), 3)
}

// A router that is not a member, built from GET /v1/cluster/view, routes
// each check straight to its owner over the data plane: same ring as the
// members, and the limit still holds across it and the members.
func TestStatelessRouterFromView(t *testing.T) {
	ss := startCluster(t, 2)
	putRules(t, ss, limiter.Rule{Name: "five", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour})
	av, err := ss[1].Node.RouterView(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rv, err := router.ViewFromAPI(httpapi.ViewOf(av)) // through the wire form, as a router gets it
	if err != nil {
		t.Fatal(err)
	}
	mine := ss[0].Node.View().Ring
	if rv.Ring.Epoch() != mine.Epoch() || len(ring.Diff(mine, rv.Ring)) != 0 || rv.Seed != ss[0].Node.View().Seed {
		t.Fatalf("router view differs from the members': epoch %d vs %d, %d partitions placed differently",
			rv.Ring.Epoch(), mine.Epoch(), len(ring.Diff(mine, rv.Ring)))
	}
	pool := transport.NewPool(transport.DefaultClientConfig())
	defer pool.Close()
	rt, err := router.New(router.Config{Timeout: 5 * time.Second}, nil, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(rv)
	allowed := 0
	for i := range 30 {
		out := make([]router.Result, 1)
		target := rt
		if i%3 != 0 {
			target = ss[i%2].Router
		}
		if err := target.Check(context.Background(), []router.Request{{Rule: "five", Key: "shared", Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Degraded {
			t.Fatalf("check %d degraded", i)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("a stateless router and two members admitted %d, want exactly 5", allowed)
	}
}

// GET /v1/cluster/view?after=E&rules_after=R long-polls: it answers as
// soon as the view is newer, so a router follows a change at once.
func TestViewLongPoll(t *testing.T) {
	ss := startCluster(t, 1)
	v := ss[0].Node.View()
	url := fmt.Sprintf("http://%s/v1/cluster/view?after=%d&rules_after=%d&wait=20s", ss[0].cfg.HTTPAdvertise, v.Epoch(), v.RulesVersion)
	type answer struct {
		view api.ClusterView
		took time.Duration
		err  error
	}
	got := make(chan answer, 1)
	start := time.Now()
	go func() {
		var a answer
		resp, err := http.Get(url)
		if err == nil {
			defer resp.Body.Close()
			err = json.NewDecoder(resp.Body).Decode(&a.view)
		}
		a.took, a.err = time.Since(start), err
		got <- a
	}()
	select {
	case a := <-got:
		t.Fatalf("answered before any change: %+v", a)
	case <-time.After(200 * time.Millisecond):
	}
	putRules(t, ss, limiter.Rule{Name: "poll", Algorithm: limiter.TokenBucket, Limit: 5, Period: time.Second})
	a := <-got
	if a.err != nil || a.view.RulesVersion <= v.RulesVersion || a.took > 10*time.Second {
		t.Fatalf("long poll: %+v after %v (err %v), want the new rules version at once", a.view.RulesVersion, a.took, a.err)
	}
	// after alone waits for a newer epoch: the rules, newer than the
	// rules_after it leaves out, do not end it.
	start = time.Now()
	resp, err := http.Get(fmt.Sprintf("http://%s/v1/cluster/view?after=%d&wait=300ms", ss[0].cfg.HTTPAdvertise, a.view.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusOK || took < 300*time.Millisecond {
		t.Fatalf("after=%d alone: %d after %v, want 200 after the whole 300ms wait", a.view.Epoch, resp.StatusCode, took)
	}
	// A bad parameter is a 400.
	resp, err = http.Get(fmt.Sprintf("http://%s/v1/cluster/view?after=x", ss[0].cfg.HTTPAdvertise))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("after=x: %d, want 400", resp.StatusCode)
	}
}

// A rules document near the body limit, PUT to a follower, is written:
// the follower forwards it in the compact form. Was: forwarded with every
// burst and failure_mode written out, it grew past the limit, and the
// leader's 413 came back as a 503 that no retry could mend (and a
// follower's --rules file of that size was never applied).
func TestFollowerForwardsARulesDocumentNearTheBodyLimit(t *testing.T) {
	ss := startCluster(t, 2)
	follower := ss[0]
	if follower.Node.Raft().State() == raft.Leader {
		follower = ss[1]
	}
	var doc []byte
	var written []limiter.Rule
	// Names as long as a name may be: the fewest rules that fill the
	// document (9,500 rules of shorter names took a -race run past the
	// write budget).
	for i := 0; ; i++ {
		r := limiter.Rule{Name: fmt.Sprintf("tenant-%05d-%s", i, strings.Repeat("x", limiter.MaxNameLen-13)), Algorithm: limiter.GCRA, Limit: 100, Period: time.Second}
		line := fmt.Sprintf(`{"name":%q,"algorithm":"gcra","limit":100,"period":"1s"}`, r.Name)
		if len(doc)+len(line)+16 > api.MaxBodySize || len(written) == rules.MaxRules {
			break
		}
		if len(doc) > 0 {
			doc = append(doc, ',')
		}
		doc, written = append(doc, line...), append(written, r)
	}
	doc = slices.Concat([]byte(`{"rules":[`), doc, []byte(`]}`))
	if full, _ := rules.Marshal(written); len(full) <= api.MaxBodySize {
		t.Fatalf("the test's document, %d bytes, is %d in full form: want it over the %d limit", len(doc), len(full), api.MaxBodySize)
	}
	req, err := http.NewRequest(http.MethodPut, "http://"+follower.cfg.HTTPAdvertise+"/v1/rules", bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT of %d rules, %d bytes, to a follower: %d %.300s", len(written), len(doc), resp.StatusCode, body)
	}
	v := follower.Router.View()
	if v == nil || v.Rules[written[len(written)-1].Name] == nil {
		t.Fatal("the follower answered 200 without the rules in force")
	}
	// The answer says the rules version in force once the write is (what
	// a forwarding member waits for).
	var got api.Rules
	if err := json.Unmarshal(body, &got); err != nil || got.RulesVersion == 0 || got.RulesVersion != v.RulesVersion || len(got.Rules) != len(written)+1 {
		t.Fatalf("the answer: %d rules, rules_version %d (view's %d), %v; want every rule and the view's version", len(got.Rules), got.RulesVersion, v.RulesVersion, err)
	}
}
