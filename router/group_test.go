package router

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/view"
)

// groupCluster is three real owners a, b, c and a router living in a.
func groupCluster(t *testing.T, down ...string) (*Router, *network, *ring.Ring, map[string]*limiter.Rule) {
	t.Helper()
	rules := testRules(t)
	rules["tight"] = &limiter.Rule{Name: "tight", Algorithm: limiter.SlidingLog, Limit: 2, Period: time.Minute}
	rg := mustRing(t, 1, "a", "b", "c")
	net := &network{owners: map[string]*owner{}, down: map[string]bool{}}
	for _, id := range []string{"a", "b", "c"} {
		net.owners[id+":1"] = newOwner(t, id, rg, rules)
	}
	for _, id := range down {
		net.down[id+":1"] = true
	}
	rt, err := New(Config{Self: "a", Linger: 10 * time.Microsecond, Timeout: 50 * time.Millisecond}, net.owners["a:1"], net)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	rt.SetView(view.New(rg, 7, ruleList(rules), 0))
	return rt, net, rg, rules
}

// keyOf returns a key whose owner in rg is id (the n-th such).
func keyOf(t *testing.T, rg *ring.Ring, id string, n int) string {
	t.Helper()
	for i := range 1 << 16 {
		k := fmt.Sprint("k", i)
		if o, _ := rg.Owner(rg.Partition(limiter.KeyHash(7, k))); o.ID == id {
			if n == 0 {
				return k
			}
			n--
		}
	}
	t.Fatalf("no key owned by %s", id)
	return ""
}

func check(t *testing.T, rt *Router, reqs ...Request) []Result {
	t.Helper()
	out := make([]Result, len(reqs))
	if err := rt.Check(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A group (a roomy limit joined by a tight one) passes twice, then the
// tight limit denies it and the roomy one spends nothing: on a key owned
// here, on one owned elsewhere (one owner each: atomic), and on two keys
// owned by two other members (query, then spend).
func TestGroupDeniedSpendsNothing(t *testing.T) {
	rt, _, rg, _ := groupCluster(t)
	for _, tt := range []struct {
		name         string
		roomy, tight string
	}{
		{"local", keyOf(t, rg, "a", 0), ""},
		{"remote", keyOf(t, rg, "b", 0), ""},
		{"two owners", keyOf(t, rg, "b", 1), keyOf(t, rg, "c", 0)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.tight == "" {
				tt.tight = tt.roomy
			}
			group := []Request{{Rule: "log5", Key: tt.roomy, Cost: 1}, {Rule: "tight", Key: tt.tight, Cost: 1, Joined: true}}
			for i := range 2 {
				if out := check(t, rt, group...); !out[0].Allowed || !out[1].Allowed || out[0].Remaining != int64(4-i) {
					t.Fatalf("group %d: %+v, want both allowed, log5 remaining %d", i, out, 4-i)
				}
			}
			for i := range 3 {
				out := check(t, rt, group...)
				if out[0].Allowed || out[0].RetryAfter != 0 || out[0].Remaining != 3 || out[1].Allowed || out[1].RetryAfter <= 0 {
					t.Fatalf("denied group %d: %+v; want log5 refused as a query (remaining 3, no retry), tight denied with a retry", i, out)
				}
			}
			if q := check(t, rt, Request{Rule: "log5", Key: tt.roomy})[0]; q.Remaining != 3 {
				t.Fatalf("log5 remaining %d after the denied groups, want 3 (only the passing groups spent)", q.Remaining)
			}
		})
	}
}

// A group to one owner is one batch to it, whatever else the call holds,
// and requests around it are decided alone.
func TestGroupTravelsInOneBatch(t *testing.T) {
	rt, net, rg, _ := groupCluster(t)
	kb, kc := keyOf(t, rg, "b", 0), keyOf(t, rg, "c", 0)
	out := check(t, rt,
		Request{Rule: "tight", Key: kb, Cost: 2},
		Request{Rule: "log5", Key: kc, Cost: 1},
		Request{Rule: "tight", Key: kc, Cost: 1, Joined: true},
		Request{Rule: "log5", Key: kb, Cost: 1}, // alone: not joined
	)
	if !out[0].Allowed || !out[1].Allowed || !out[2].Allowed || !out[3].Allowed {
		t.Fatalf("%+v, want all allowed", out)
	}
	if b, c := net.owners["b:1"].calls.Load(), net.owners["c:1"].calls.Load(); b != 1 || c != 1 {
		t.Fatalf("owners called b %d, c %d times; want once each", b, c)
	}
	// b's tight is spent: a group with it is denied, log5 of kb unspent
	// by it, and a lone check of log5 after it in the call still passes.
	out = check(t, rt,
		Request{Rule: "log5", Key: kb, Cost: 1},
		Request{Rule: "tight", Key: kb, Cost: 1, Joined: true},
		Request{Rule: "log5", Key: kb, Cost: 1},
	)
	if out[0].Allowed || out[1].Allowed || !out[2].Allowed || out[2].Remaining != 3 {
		t.Fatalf("%+v, want the group denied and the lone check allowed with 3 left", out)
	}
}

// With owners down, each request of a group gets its rule's failure
// answer, and a closed one denies the whole group.
func TestGroupFailureModes(t *testing.T) {
	rt, _, rg, _ := groupCluster(t, "b", "c")
	k := keyOf(t, rg, "b", 0)
	out := check(t, rt, Request{Rule: "log5", Key: k, Cost: 1}, Request{Rule: "log5", Key: keyOf(t, rg, "c", 0), Cost: 1, Joined: true})
	if !out[0].Allowed || !out[1].Allowed || !out[0].Degraded || !out[1].Degraded {
		t.Fatalf("open group with its owners down: %+v, want allowed and degraded", out)
	}
	out = check(t, rt, Request{Rule: "log5", Key: k, Cost: 1}, Request{Rule: "closed", Key: k, Cost: 1, Joined: true})
	if out[0].Allowed || out[1].Allowed || !out[0].Degraded || out[0].RetryAfter != 0 || out[1].RetryAfter <= 0 {
		t.Fatalf("group with a closed rule, owner down: %+v, want both denied and degraded, the closed one with a retry", out)
	}
}

// The first request of a call cannot join anything.
func TestGroupFirstJoinedRefused(t *testing.T) {
	rt, _, _, _ := groupCluster(t)
	err := rt.Check(context.Background(), []Request{{Rule: "log5", Key: "k", Cost: 1, Joined: true}}, make([]Result, 1))
	var ie *ItemError
	if !errors.As(err, &ie) || ie.Index != 0 || !errors.Is(err, api.ErrBadRequest) {
		t.Fatalf("Check = %v, want an ItemError at 0 wrapping ErrBadRequest", err)
	}
}
