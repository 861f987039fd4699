package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// A joined group naming one bucket twice (same rule, same key) is refused
// by the router as a bad request, spending nothing. Was: the owner refused
// it with BAD_REQUEST and the router turned that into the failure mode,
// so a fail-open rule admitted every such group (a gateway route listing
// one rule twice), for ever. Found by an audit of router/.
func TestGroupNamingOneBucketTwiceIsRefused(t *testing.T) {
	for _, where := range []string{"a", "b"} { // a: decided in place; b: forwarded
		t.Run(where, func(t *testing.T) {
			rt, _, rg, _ := groupCluster(t)
			k := keyOf(t, rg, where, 0)
			admitted := 0
			for range 20 {
				out := make([]Result, 2)
				err := rt.Check(context.Background(), []Request{{Rule: "tight", Key: k, Cost: 1}, {Rule: "tight", Key: k, Cost: 1, Joined: true}}, out)
				if ie, ok := errors.AsType[*ItemError](err); err != nil && (!ok || ie.Index != 1 || !errors.Is(err, api.ErrBadRequest)) {
					t.Fatalf("%v; want a bad request naming checks[1]", err)
				}
				if err == nil && out[0].Allowed && out[1].Allowed {
					admitted++
				}
			}
			if admitted > 1 {
				t.Fatalf("limit 2: %d of 20 groups spending 2 each admitted (want at most 1)", admitted)
			}
		})
	}
}

// A lagging member serves the same ring epoch with older rules: Follow
// must not go back to them.
func TestFollowKeepsNewerRulesAtTheSameEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		rt := pureRouter(t)
		rg := mustRing(t, 5, "a")
		newer := testRules(t)
		newer["new"] = &limiter.Rule{Name: "new", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
		src := &source{v: view.New(rg, 7, ruleList(newer), 10)}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = rt.Follow(ctx, src, time.Second) }()
		synctest.Wait()
		src.set(view.New(rg, 7, ruleList(rules), 3), nil) // a lagging member
		time.Sleep(time.Second)
		synctest.Wait()
		if v := rt.View(); v.RulesVersion != 10 || v.Rules["new"] == nil {
			t.Fatalf("view rules version %d (rule new: %v) after a lagging member's read; want 10 kept", v.RulesVersion, v.Rules["new"] != nil)
		}
	})
}

// A split group (keys on two other owners) with both owners down: each
// check is one degraded answer, after one Timeout.
func TestSplitGroupDegradedCountedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, _, rg, _ := groupCluster(t, "b", "c")
		start := time.Now()
		out := check(t, rt, Request{Rule: "log5", Key: keyOf(t, rg, "b", 0), Cost: 1}, Request{Rule: "log5", Key: keyOf(t, rg, "c", 0), Cost: 1, Joined: true})
		took := time.Since(start)
		if !out[0].Degraded || !out[1].Degraded {
			t.Fatalf("%+v, want degraded", out)
		}
		if got := testutil.ToFloat64(rt.m.degraded.WithLabelValues("log5")); got != 2 {
			t.Errorf("ringlimit_degraded_total{rule=log5} = %v for 2 degraded checks, want 2", got)
		}
		if took != 50*time.Millisecond {
			t.Errorf("answered after %v, want one Timeout (50ms)", took)
		}
	})
}

// slowNet answers after delay, or fails at its ctx's end.
type slowNet struct {
	*network
	delay time.Duration
}

func (n *slowNet) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	select {
	case <-time.After(n.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return n.network.Do(ctx, addr, req, resp)
}

// A caller with no deadline of its own is not answered by the failure
// mode because another caller in its batch had a short one.
func TestShortDeadlineOfOneCallerSparesItsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		rg := mustRing(t, 1, "b")
		net := &slowNet{network: &network{owners: map[string]*owner{"b:1": newOwner(t, "b", rg, rules)}}, delay: 10 * time.Millisecond}
		rt, err := New(Config{Linger: time.Millisecond, Timeout: 250 * time.Millisecond}, nil, net)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(view.New(rg, 7, ruleList(rules), 0))
		var wg sync.WaitGroup
		wg.Go(func() { check(t, rt, Request{Rule: "closed", Key: "k0", Cost: 1}) }) // in flight: the next ones batch up
		synctest.Wait()
		wg.Go(func() { // a caller with a 5ms budget
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
			defer cancel()
			_ = rt.Check(ctx, []Request{{Rule: "closed", Key: "k1", Cost: 1}}, make([]Result, 1))
		})
		synctest.Wait()
		start := time.Now()
		res := check(t, rt, Request{Rule: "closed", Key: "k2", Cost: 1})[0] // no deadline of its own
		took := time.Since(start)
		wg.Wait()
		if res.Degraded || !res.Allowed {
			t.Fatalf("caller without a deadline, owner answering in 10ms (Timeout 250ms): %+v after %v; want decided by the owner", res, took)
		}
	})
}

// A split group (keys on two other owners) that names one bucket twice
// is denied, yet spends: no concurrent request is involved.
func TestSplitGroupNamingOneBucketTwiceSpendsNothing(t *testing.T) {
	rt, _, rg, _ := groupCluster(t)
	kb, kc := keyOf(t, rg, "b", 0), keyOf(t, rg, "c", 0)
	out := make([]Result, 3)
	err := rt.Check(context.Background(), []Request{{Rule: "tight", Key: kb, Cost: 2}, {Rule: "log5", Key: kc, Cost: 1, Joined: true}, {Rule: "tight", Key: kb, Cost: 2, Joined: true}}, out)
	if err != nil && !errors.Is(err, api.ErrBadRequest) {
		t.Fatal(err)
	}
	if err == nil && (out[0].Allowed || out[1].Allowed || out[2].Allowed) {
		t.Fatalf("%+v: want the group denied", out)
	}
	tight := check(t, rt, Request{Rule: "tight", Key: kb})[0].Remaining
	log5 := check(t, rt, Request{Rule: "log5", Key: kc})[0].Remaining
	if tight != 2 || log5 != 5 {
		t.Fatalf("after a denied group: tight remaining %d, log5 remaining %d; want 2 and 5 (nothing spent)", tight, log5)
	}
}
