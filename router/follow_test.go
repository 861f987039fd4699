package router

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/view"
)

// source is a fake ViewSource: it serves whatever view it was last given
// and counts the fetches.
type source struct {
	mu      sync.Mutex
	v       *View
	err     error
	fetches int
	onFetch func() // called, under mu, before each fetch answers
}

func (s *source) FetchView(context.Context) (*View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches++
	if s.onFetch != nil {
		s.onFetch()
	}
	return s.v, s.err
}

func (s *source) set(v *View, err error) {
	s.mu.Lock()
	s.v, s.err = v, err
	s.mu.Unlock()
}

func (s *source) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

func TestFollowRefreshesOnTheTimerAndKeepsTheNewestEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		rt := pureRouter(t)
		src := &source{v: view.New(mustRing(t, 5, "a", "b"), 7, ruleList(rules), 0)}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- rt.Follow(ctx, src, time.Second) }()

		synctest.Wait()
		if rt.View() == nil || rt.View().Ring.Epoch() != 5 || src.count() != 1 {
			t.Fatalf("after start: view %v, %d fetches; want epoch 5 fetched once at once", rt.View(), src.count())
		}
		// A lagging member serves an older ring: ignored.
		src.set(view.New(mustRing(t, 4, "a"), 7, ruleList(rules), 0), nil)
		time.Sleep(time.Second)
		synctest.Wait()
		if src.count() != 2 || rt.View().Ring.Epoch() != 5 {
			t.Fatalf("after 1s: %d fetches, epoch %d; want 2 fetches, epoch 5 kept", src.count(), rt.View().Ring.Epoch())
		}
		// A failed fetch keeps the view.
		src.set(nil, errors.New("all members down"))
		time.Sleep(time.Second)
		synctest.Wait()
		if rt.View().Ring.Epoch() != 5 {
			t.Fatal("a failed fetch dropped the view")
		}
		// A rules change at the same epoch is installed.
		changed := testRules(t)
		changed["log5"] = &limiter.Rule{Name: "log5", Algorithm: limiter.SlidingLog, Limit: 9, Period: time.Minute}
		src.set(view.New(mustRing(t, 5, "a", "b"), 7, ruleList(changed), 0), nil)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := rt.View().Rules["log5"].Limit; got != 9 {
			t.Fatalf("rules at the same epoch not followed: limit %d, want 9", got)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Follow returned %v, want context.Canceled", err)
		}
	})
}

// An owner's NOT_OWNER answer makes Follow fetch at once, not at its next
// period: the check is retried at the new owner and spends once.
func TestFollowRefreshesAtOnceOnNotOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		old := mustRing(t, 1, "a", "b")
		next := mustRing(t, 2, "a", "b", "c")
		net := &network{owners: map[string]*owner{}}
		for _, id := range []string{"a", "b", "c"} {
			net.owners[id+":1"] = newOwner(t, id, next, rules)
		}
		rt, err := New(Config{Timeout: 5 * time.Second, RefreshWait: 5 * time.Second}, nil, net)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		src := &source{v: view.New(old, 7, ruleList(rules), 0)}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = rt.Follow(ctx, src, time.Hour) }()
		synctest.Wait()
		src.set(view.New(next, 7, ruleList(rules), 0), nil)
		key := movedKey(t, old, next, "c")
		start := time.Now()
		out := make([]Result, 1)
		if err := rt.Check(t.Context(), []Request{{Rule: "log5", Key: key, Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		if !out[0].Allowed || out[0].Degraded || out[0].Remaining != 4 {
			t.Fatalf("got %+v, want allowed at the new owner, remaining 4", out[0])
		}
		if waited := time.Since(start); waited > 0 {
			t.Fatalf("the retry waited %v of virtual time: Follow did not refresh at once", waited)
		}
		if src.count() != 2 || rt.View().Ring.Epoch() != 2 {
			t.Fatalf("%d fetches, epoch %d; want 2 fetches, epoch 2", src.count(), rt.View().Ring.Epoch())
		}
	})
}

// movedKey returns a key whose partition is owned by to in next but not in old.
func movedKey(t *testing.T, old, next *ring.Ring, to string) string {
	t.Helper()
	for i := range 100000 {
		k := "key-" + strconv.Itoa(i)
		p := old.Partition(limiter.KeyHash(7, k))
		if m1, _ := old.Owner(p); m1.ID != to {
			if m2, _ := next.Owner(p); m2.ID == to {
				return k
			}
		}
	}
	t.Fatal("no key moved")
	return ""
}

// The router must stay free of Raft and of the member: a gateway, a
// client or a router process links only what routing needs.
func TestRouterDependsOnNeitherRaftNorNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "hashicorp/raft") || dep == "github.com/ringlimit/ringlimit/node" || strings.HasPrefix(dep, "github.com/ringlimit/ringlimit/node/") {
			t.Errorf("go list -deps ./router/... contains %s", dep)
		}
	}
}

// Refresh fetches at once and returns once the fetch is done: a caller
// that met an unknown rule sees a rule added since its last fetch.
func TestRefreshFetchesNowAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := pureRouter(t)
		rules := testRules(t)
		src := &source{v: view.New(mustRing(t, 1, "a"), 7, ruleList(rules), 0)}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = rt.Follow(ctx, src, time.Hour) }()
		synctest.Wait()
		rules["new"] = &limiter.Rule{Name: "new", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
		src.set(view.New(mustRing(t, 1, "a"), 7, ruleList(rules), 0), nil)
		start := time.Now()
		if err := rt.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		if rt.View().Rules["new"] == nil || time.Since(start) != 0 {
			t.Fatalf("after Refresh (%v): rule new %v; want it, at once", time.Since(start), rt.View().Rules["new"])
		}
	})
}

// A following router that meets a rule its view lacks reads the view
// again before answering: a rule younger than its view is decided, not
// refused for up to a Follow period. A rule that does not exist costs at
// most one view read per refetchGap.
func TestUnknownRuleRefetchesTheView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		rt, net, r1, src, cancel := ruleFollower(t, rules)
		out := make([]Result, 1)
		check := func(rule string) error {
			return rt.Check(t.Context(), []Request{{Rule: rule, Key: "k", Cost: 1}}, out)
		}

		rules["new"] = &limiter.Rule{Name: "new", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
		net.owners["a:1"] = newOwner(t, "a", r1, rules)
		src.set(view.New(r1, 7, ruleList(rules), 2), nil)
		time.Sleep(refetchGap)
		if err := check("new"); err != nil || !out[0].Allowed {
			t.Fatalf("a rule younger than the view: %v %+v, want allowed", err, out[0])
		}
		if n := src.count(); n != 2 {
			t.Fatalf("%d view reads, want 2 (start, the unknown rule)", n)
		}

		// A rule added just after a read (within refetchGap): the check
		// waits for the gap's end and reads again. Was: unknown at once.
		if err := rt.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		rules["newer"] = &limiter.Rule{Name: "newer", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
		net.owners["a:1"] = newOwner(t, "a", r1, rules)
		src.set(view.New(r1, 7, ruleList(rules), 3), nil)
		start := time.Now()
		if err := check("newer"); err != nil || !out[0].Allowed {
			t.Fatalf("a rule added within refetchGap of the last read: %v %+v, want allowed", err, out[0])
		}
		if took := time.Since(start); took < refetchGap {
			t.Errorf("decided after %v, within refetchGap (%v) of the last read", took, refetchGap)
		}
		if n := src.count(); n != 4 {
			t.Fatalf("%d view reads, want 4 (start, the unknown rule, Refresh, the rule added since)", n)
		}

		time.Sleep(refetchGap)
		if err := check("typo"); !errors.Is(err, ErrUnknownRule) {
			t.Fatalf("a rule that does not exist: %v, want ErrUnknownRule", err)
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				out := make([]Result, 1)
				if err := rt.Check(t.Context(), []Request{{Rule: "typo", Key: "k", Cost: 1}}, out); !errors.Is(err, ErrUnknownRule) {
					t.Errorf("again: %v, want ErrUnknownRule", err)
				}
			})
		}
		wg.Wait()
		if n := src.count(); n != 8 {
			t.Fatalf("%d view reads, want 8: two per unknown rule whose reads bring no newer rules, a refetchGap apart, three callers within one gap sharing theirs", n)
		}

		cancel() // no Follow: nothing would answer a refresh, so none is asked
		synctest.Wait()
		start = time.Now()
		time.Sleep(refetchGap)
		if err := check("typo"); !errors.Is(err, ErrUnknownRule) || time.Since(start) != refetchGap {
			t.Fatalf("without Follow: %v after %v, want ErrUnknownRule at once", err, time.Since(start)-refetchGap)
		}
	})
}

// A rule used through a following router right after the PUT that added
// it, whose re-read reaches a member that has not applied the write yet
// (no newer rules), is read for once more, a refetchGap later, and
// decided. Was: 404 unknown_rule in 1 of 20 to 4 of 60 tries (a helper
// with real processes).
func TestUnknownRuleReadsAgainPastALaggingMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		rt, net, r1, src, _ := ruleFollower(t, rules)
		time.Sleep(refetchGap)

		rules["fresh"] = &limiter.Rule{Name: "fresh", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
		net.owners["a:1"] = newOwner(t, "a", r1, rules)
		lagging := true // the member read first has not applied the write
		src.onFetch = func() {
			if lagging {
				lagging = false
				return
			}
			src.v = view.New(r1, 7, ruleList(rules), 2)
		}
		out := make([]Result, 1)
		if err := rt.Check(t.Context(), []Request{{Rule: "fresh", Key: "k", Cost: 1}}, out); err != nil || !out[0].Allowed {
			t.Fatalf("a rule just added, the first re-read lagging: %v %+v; want allowed", err, out[0])
		}
	})
}

// The router's metrics on an owner that never answers: one forward error
// per batch (however many callers wait on it), the wait of the failure
// mode in a finite latency bucket, and the view's epoch from SetView (a
// member's router is set, not following). Was: an error per caller, the
// 250 ms answers in +Inf (the top bucket was 0.12 s), and epoch 0 on
// members.
func TestMetricsOfAnOwnerThatNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		rt, err := New(Config{Registerer: reg}, nil, &network{down: map[string]bool{"b:1": true}})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(view.New(mustRing(t, 9, "b"), 7, ruleList(testRules(t)), 0))
		if got := testutil.ToFloat64(rt.m.viewEpoch); got != 9 {
			t.Errorf("view epoch %v after SetView, want 9", got)
		}
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				out := make([]Result, 1)
				if err := rt.Check(t.Context(), []Request{{Rule: "closed", Key: strconv.Itoa(i), Cost: 1}}, out); err != nil || !out[0].Degraded {
					t.Errorf("check %d: %+v, %v; want a degraded answer", i, out[0], err)
				}
			})
		}
		wg.Wait()
		var hm dto.Metric
		if err := rt.m.batchSize.Write(&hm); err != nil {
			t.Fatal(err)
		}
		sent := hm.GetHistogram().GetSampleCount()
		if got := testutil.ToFloat64(rt.m.forwardErrors); got != float64(sent) || sent == 0 {
			t.Errorf("forward errors %v for %d batches sent, want one per batch", got, sent)
		}
		if err := rt.m.latency.Write(&hm); err != nil {
			t.Fatal(err)
		}
		var finite uint64
		for _, b := range hm.GetHistogram().GetBucket() {
			if b.GetUpperBound() >= 0.25 && finite == 0 {
				finite = b.GetCumulativeCount()
			}
		}
		if finite != 20 {
			t.Errorf("%d of 20 answers at the 250 ms timeout in the first bucket of 0.25 s or more, want 20 (buckets %v)", finite, hm.GetHistogram().GetBucket())
		}
	})
}

// A following router whose view names an owner that can no longer be
// reached (its port closed: a member that stopped gracefully, after
// handing its partitions off and marking itself down) fetches the view
// at once and decides under the newer one, without degrading. An owner
// whose partitions do not move (crashed, not yet marked dead) is
// answered by the failure mode after half the owner timeout, and then at
// once under that view for goneMemory. Was: the
// failure mode at once, in both cases: a graceful stop gave 2–18
// degraded answers through routers and Go clients (fail-open ones
// admitted past the limit). Fake time.
func TestFollowerRetriesAnOwnerThatIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		r1, r2 := mustRing(t, 5, "a", "b"), mustRing(t, 6, "b")
		rt, src, key := followerWithAGone(t, rules, r1, r2)
		check := func() (Result, time.Duration) {
			start := time.Now()
			out := make([]Result, 1)
			if err := rt.Check(t.Context(), []Request{{Rule: "closed", Key: key, Cost: 1}}, out); err != nil {
				t.Fatal(err)
			}
			return out[0], time.Since(start)
		}
		// Crashed: the view does not move; the failure mode answers.
		if res, took := check(); !res.Degraded || res.Allowed || took != 125*time.Millisecond {
			t.Fatalf("owner gone, no newer view: %+v after %v; want the closed failure mode after 125ms", res, took)
		}
		// Found gone under this view: at once for goneMemory, then one
		// check waits again. Was: every check waited 125ms.
		if res, took := check(); !res.Degraded || took != 0 {
			t.Fatalf("owner found gone a moment ago: %+v after %v; want the failure mode at once", res, took)
		}
		time.Sleep(goneMemory)
		if res, took := check(); !res.Degraded || took != 125*time.Millisecond {
			t.Fatalf("owner found gone %v ago: %+v after %v; want another wait of 125ms", goneMemory, res, took)
		}
		// Gone gracefully: the next view has moved a's partitions to b.
		time.Sleep(goneMemory)
		src.set(view.New(r2, 7, ruleList(rules), 0), nil)
		res, took := check()
		if res.Degraded || !res.Allowed || res.Remaining != 4 {
			t.Fatalf("owner gone, its partitions moved: %+v after %v; want decided by b (allowed, 4 left)", res, took)
		}
		if took >= 125*time.Millisecond {
			t.Errorf("decided after %v: it waited out the bound instead of the view", took)
		}
	})
}

// While an owner stays unreachable (crashed, not yet marked dead), the
// checks answered at once by their failure mode ask for the view again,
// but a follower reads it at most once per refetchGap when the reads
// bring nothing new. Was: back to back, as fast as checks came (a helper
// with real processes: ~70 reads/s per member from two routers and a Go
// client, 22 MB/s of a 2,000-rule view, for as long as --dead-after).
func TestFollowerReadsTheViewAtMostOncePerGapWhileAnOwnerIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r1 := mustRing(t, 5, "a", "b")
		rt, src, key := followerWithAGone(t, testRules(t), r1, r1)
		before := src.count()
		start := time.Now()
		for time.Since(start) < 2*time.Second {
			out := make([]Result, 1)
			if err := rt.Check(t.Context(), []Request{{Rule: "closed", Key: key, Cost: 1}}, out); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond) // a check every 2 ms, in the bubble's time
			synctest.Wait()
		}
		// 2 s: at most one read per refetchGap (20), and the period's (2).
		if n := src.count() - before; n > 2*int(time.Second/refetchGap)+3 {
			t.Fatalf("%d view reads in 2 s of checks to a gone owner; want at most one per %v", n, refetchGap)
		}
	})
}

// A closed router answers no check: one made after Close, or cut short
// by it, returns an error wrapping ErrClosed and api.ErrUnavailable.
// Was: the failure mode's answer with a nil error, so a Go client's
// middleware still serving after Close let everything through on open
// rules. Fake time.
func TestClosedRouterAnswersNoCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, err := New(Config{Timeout: 250 * time.Millisecond}, nil, &network{down: map[string]bool{"b:1": true}})
		if err != nil {
			t.Fatal(err)
		}
		rt.SetView(view.New(mustRing(t, 1, "b"), 7, ruleList(testRules(t)), 0))
		done := make(chan error)
		go func() { done <- rt.Check(t.Context(), []Request{{Rule: "log5", Key: "k", Cost: 1}}, make([]Result, 1)) }()
		synctest.Wait() // in flight, waiting for b
		rt.Close()
		for _, err := range []error{<-done, rt.Check(t.Context(), []Request{{Rule: "log5", Key: "k", Cost: 1}}, make([]Result, 1))} {
			if !errors.Is(err, ErrClosed) || !errors.Is(err, api.ErrUnavailable) {
				t.Errorf("check on a closed router: %v, want ErrClosed (unavailable)", err)
			}
		}
		// Nor does it count them as degraded decisions (was: the one cut
		// short by Close was counted).
		if got := testutil.ToFloat64(rt.m.degraded.WithLabelValues("log5")); got != 0 {
			t.Errorf("ringlimit_degraded_total{rule=log5} = %v after checks answered ErrClosed, want 0", got)
		}
	})
}

// ViewAge says how long ago Follow last read a view, so that a router
// whose reads keep failing (members gone, or refusing it) can say it is
// not ready (client.Ring.Ready, and so the router's and gateway's
// /readyz). Fake time.
func TestViewAgeGrowsWhileReadsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := pureRouter(t)
		if rt.ViewAge() != 0 {
			t.Fatalf("before a read: %v, want 0", rt.ViewAge())
		}
		src := &source{v: view.New(mustRing(t, 5, "a"), 7, ruleList(testRules(t)), 0)}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = rt.Follow(ctx, src, time.Second) }()
		synctest.Wait()
		time.Sleep(2500 * time.Millisecond) // reads at 1s and 2s, the same view
		synctest.Wait()
		if age := rt.ViewAge(); age != 500*time.Millisecond {
			t.Fatalf("reading the same view every second: age %v, want 500ms", age)
		}
		src.set(nil, errors.New("401 unauthorized"))
		time.Sleep(11 * time.Second)
		synctest.Wait()
		if age := rt.ViewAge(); age != 11500*time.Millisecond {
			t.Fatalf("11 s of failed reads: age %v, want 11.5s", age)
		}
	})
}

// followerWithAGone is a router following src (the view of r1, read
// every second) whose owner a refuses every connection, b deciding under
// bRing; and a key a owns under r1. Call it inside a synctest bubble.
func followerWithAGone(t *testing.T, rules map[string]*limiter.Rule, r1, bRing *ring.Ring) (*Router, *source, string) {
	t.Helper()
	net := &network{owners: map[string]*owner{"a:1": newOwner(t, "a", r1, rules), "b:1": newOwner(t, "b", bRing, rules)},
		closed: map[string]bool{"a:1": true}}
	rt, err := New(Config{Timeout: 250 * time.Millisecond}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	src := &source{v: view.New(r1, 7, ruleList(rules), 0)}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() { _ = rt.Follow(ctx, src, time.Second) }()
	synctest.Wait()
	for i := 0; ; i++ {
		key := strconv.Itoa(i)
		if o, _ := r1.Owner(r1.Partition(limiter.KeyHash(7, key))); o.ID == "a" {
			return rt, src, key
		}
	}
}

// ruleFollower is a router following src (the view of ring r1, with rules
// at version 1, read every hour), whose one owner a has no table yet;
// cancel ends its Follow. Call it inside a synctest bubble.
func ruleFollower(t *testing.T, rules map[string]*limiter.Rule) (rt *Router, net *network, r1 *ring.Ring, src *source, cancel context.CancelFunc) {
	t.Helper()
	r1 = mustRing(t, 1, "a")
	net = &network{owners: map[string]*owner{}}
	rt, err := New(Config{}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	src = &source{v: view.New(r1, 7, ruleList(rules), 1)}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() { _ = rt.Follow(ctx, src, time.Hour) }()
	synctest.Wait()
	return rt, net, r1, src, cancel
}
