package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// ruleList turns a rule map into the list a view is built from.
func ruleList(m map[string]*limiter.Rule) []limiter.Rule {
	var l []limiter.Rule
	for _, r := range m {
		l = append(l, *r)
	}
	return l
}

// owner is a member's owner side (the real node.Owner, which decides the
// partitions its ring gives it and answers NOT_OWNER for the others),
// counting the batches it is sent.
type owner struct {
	*node.Owner
	calls atomic.Int64
}

func (o *owner) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	o.calls.Add(1)
	o.Owner.HandleBatch(ctx, req, resp)
}

// network routes Do calls to fake owners by peer address.
type network struct {
	owners map[string]*owner
	down   map[string]bool
	closed map[string]bool // the owner's port is closed: calls fail at once
	called chan string     // when set, receives the address of every call after it is answered
}

func (n *network) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	if n.down[addr] {
		<-ctx.Done()
		return ctx.Err()
	}
	if n.closed[addr] {
		return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	resp.Results = make([]transport.Result, len(req.Checks))
	n.owners[addr].HandleBatch(ctx, req, resp)
	if n.called != nil {
		n.called <- addr
	}
	return nil
}

// pureRouter is a router with no local handler, no owners to reach and
// the default config, closed when the test ends.
func pureRouter(t *testing.T) *Router {
	t.Helper()
	rt, err := New(Config{}, nil, &network{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

func testRules(t *testing.T) map[string]*limiter.Rule {
	t.Helper()
	rs := map[string]*limiter.Rule{
		"log5":   {Name: "log5", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Minute},
		"closed": {Name: "closed", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Minute, FailureMode: limiter.FailClosed},
	}
	for _, r := range rs {
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}

func mustRing(t *testing.T, epoch uint64, ids ...string) *ring.Ring {
	t.Helper()
	var ms []ring.Member
	for _, id := range ids {
		ms = append(ms, ring.Member{ID: id, Peer: id + ":1"})
	}
	r, err := ring.New(ring.Config{Partitions: 64, ReplicationFactor: 32, Load: 1.25}, epoch, ms)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newOwner(t *testing.T, id string, r *ring.Ring, rules map[string]*limiter.Rule) *owner {
	t.Helper()
	o, err := node.NewOwner(id, r.Config().Partitions, func() int64 { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := view.New(r, 7, ruleList(rules), 0)
	// A new cluster: every partition it owns starts empty and servable.
	o.Apply(v, node.PlanMoves(nil, r, id, nil, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	return &owner{Owner: o}
}

func TestRouterForwardsAndLimitsGlobally(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a", "b", "c")
	net := &network{owners: map[string]*owner{}}
	for _, id := range []string{"a", "b", "c"} {
		net.owners[id+":1"] = newOwner(t, id, r1, rules)
	}
	// Three routers, one per member, each deciding its own partitions in place.
	var routers []*Router
	for _, id := range []string{"a", "b", "c"} {
		rt, err := New(Config{Self: id, Linger: 50 * time.Microsecond, Timeout: 5 * time.Second}, net.owners[id+":1"], net)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(view.New(r1, 7, ruleList(rules), 0))
		routers = append(routers, rt)
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]Result, 1)
			if err := routers[i%3].Check(context.Background(), []Request{{Rule: "log5", Key: "k", Cost: 1}}, out); err != nil {
				t.Error(err)
			}
			if out[0].Allowed {
				allowed.Add(1)
			}
			if out[0].Degraded {
				t.Error("degraded answer with every owner up")
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 5 {
		t.Fatalf("60 checks on one key over 3 routers admitted %d, want exactly 5", got)
	}
}

func TestRouterRetriesNotOwnerOnNewerRing(t *testing.T) {
	rules := testRules(t)
	old := mustRing(t, 1, "a", "b")
	next := mustRing(t, 2, "a", "b", "c")
	net := &network{owners: map[string]*owner{}, called: make(chan string)}
	for _, id := range []string{"a", "b", "c"} {
		net.owners[id+":1"] = newOwner(t, id, next, rules) // the owners already moved on
	}
	rt, err := New(Config{Linger: 10 * time.Microsecond, Timeout: 5 * time.Second, RefreshWait: 5 * time.Second}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(view.New(old, 7, ruleList(rules), 0))
	// A key whose partition moved to c between the two rings.
	key := ""
	for i := 0; key == ""; i++ {
		k := "key-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
		p := old.Partition(limiter.KeyHash(7, k))
		if o1, _ := old.Owner(p); o1.ID != "c" {
			if o2, _ := next.Owner(p); o2.ID == "c" {
				key = k
			}
		}
	}
	done := make(chan Result)
	go func() {
		out := make([]Result, 1)
		if err := rt.Check(context.Background(), []Request{{Rule: "log5", Key: key, Cost: 1}}, out); err != nil {
			t.Error(err)
		}
		done <- out[0]
	}()
	// The old owner answers NOT_OWNER (epoch 2): the router waits for a
	// ring of epoch 2, then retries at the new owner, exactly once.
	if addr := <-net.called; addr == "c:1" {
		t.Fatalf("first call went to %s, the new owner, on the old ring", addr)
	}
	select {
	case res := <-done:
		t.Fatalf("decided %+v before the router saw the new ring", res)
	default:
	}
	rt.SetView(view.New(next, 7, ruleList(rules), 0))
	if addr := <-net.called; addr != "c:1" {
		t.Fatalf("retry went to %s, want the new owner c", addr)
	}
	res := <-done
	if !res.Allowed || res.Degraded || res.Remaining != 4 {
		t.Fatalf("after the retry: %+v, want allowed, not degraded, remaining 4 (one spend, at the new owner)", res)
	}
	if got := net.owners["c:1"].calls.Load(); got != 1 {
		t.Fatalf("new owner called %d times, want 1", got)
	}
}

func TestRouterFailureModes(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a")
	net := &network{owners: map[string]*owner{"a:1": newOwner(t, "a", r1, rules)}, down: map[string]bool{"a:1": true}}
	rt, err := New(Config{Linger: 10 * time.Microsecond, Timeout: 20 * time.Millisecond}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(view.New(r1, 7, ruleList(rules), 0))
	out := make([]Result, 2)
	if err := rt.Check(context.Background(), []Request{{Rule: "log5", Key: "x", Cost: 1}, {Rule: "closed", Key: "x", Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || !out[0].Degraded {
		t.Errorf("fail-open rule with its owner down: %+v, want allowed and degraded", out[0])
	}
	// Its reset is no sooner than its retry: the headers made of it
	// said "full again now" (t=0) beside Retry-After: 1.
	if out[1].Allowed || !out[1].Degraded || out[1].RetryAfter <= 0 || out[1].ResetAfter != out[1].RetryAfter {
		t.Errorf("fail-closed rule with its owner down: %+v, want denied, degraded, with a RetryAfter and a ResetAfter as long", out[1])
	}
	if err := rt.Check(context.Background(), []Request{{Rule: "log5", Key: "y", Cost: 1}}, out[:1]); err != nil {
		t.Fatal(err)
	}
	for rule, want := range map[string]float64{"log5": 2, "closed": 1} {
		if got := testutil.ToFloat64(rt.m.degraded.WithLabelValues(rule)); got != want {
			t.Errorf("ringlimit_degraded_total{rule=%q} = %v, want %v", rule, got, want)
		}
	}
}

func TestRouterRejectsInvalidBatchWhole(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a")
	o := newOwner(t, "a", r1, rules)
	rt, err := New(Config{Self: "a"}, o, &network{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	out := make([]Result, 4)
	if err := rt.Check(context.Background(), []Request{{Rule: "log5", Key: "x", Cost: 1}}, out); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("check before any view: %v, want ErrUnavailable", err)
	}
	// Checks that carry their own rules (Envoy RLS) are answered by
	// their failure modes instead, a group denied whole; one without
	// fails the call as before.
	open := &limiter.Rule{Name: "rls:open", Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute}
	closed := &limiter.Rule{Name: "rls:closed", Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute, FailureMode: limiter.FailClosed}
	inline := []Request{
		{Rule: open.Name, Key: "a", Cost: 1, Inline: open},
		{Rule: open.Name, Key: "b", Cost: 1, Inline: open},
		{Rule: closed.Name, Key: "b", Cost: 1, Inline: closed, Joined: true},
	}
	if err := rt.Check(context.Background(), inline, out); err != nil {
		t.Fatalf("inline checks before any view: %v, want their failure modes' answers", err)
	}
	if !out[0].Allowed || !out[0].Degraded || out[1].Allowed || !out[1].Degraded || out[2].Allowed || !out[2].Degraded {
		t.Fatalf("inline checks before any view: %+v; want the open one allowed, the group with a closed one denied, all degraded", out[:3])
	}
	if err := rt.Check(context.Background(), append(inline[:1:1], Request{Rule: "log5", Key: "x", Cost: 1}), out); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("inline and written-rule checks before any view: %v, want ErrUnavailable", err)
	}
	rt.SetView(view.New(r1, 7, ruleList(rules), 0))
	tests := []struct {
		reqs  []Request
		index int
		is    error
	}{
		{[]Request{{Rule: "log5", Key: "x", Cost: 1}, {Rule: "nope", Key: "x", Cost: 1}}, 1, ErrUnknownRule},
		{[]Request{{Rule: "log5", Key: "", Cost: 1}}, 0, api.ErrBadRequest},
		{[]Request{{Rule: "log5", Key: "x"}, {Rule: "log5", Key: "x"}, {Rule: "log5", Key: "x", Cost: 6}}, 2, limiter.ErrCost},
		{[]Request{{Rule: "log5", Key: "x", Cost: -1}}, 0, api.ErrBadRequest},
		// Rules are looked up once per run of a name: a change of name is a lookup.
		{[]Request{{Rule: "log5", Key: "x"}, {Rule: "closed", Key: "x"}, {Rule: "log5", Key: "x"}, {Rule: "nope", Key: "x"}}, 3, ErrUnknownRule},
		{[]Request{{Rule: "log5", Key: "x"}, {Rule: "nope", Key: "x"}, {Rule: "nope", Key: "x"}}, 1, ErrUnknownRule},
		{[]Request{{Rule: "closed", Key: "x"}, {Rule: "closed", Key: "x", Cost: 6}}, 1, limiter.ErrCost},
		{[]Request{{Rule: "log5", Key: "x"}, {Rule: "log5", Key: "x\xff"}}, 1, api.ErrBadRequest},
		// A caller that vouches for its keys' UTF-8 is not checked again.
		{[]Request{{Rule: "log5", Key: "x\xff", KeyValid: true}, {Rule: "nope", Key: "x"}}, 1, ErrUnknownRule},
		// The keys' UTF-8 is read ahead of the other checks, yet the
		// first invalid request, in order, is the one refused, for its
		// first reason.
		{[]Request{{Rule: "nope", Key: "x"}, {Rule: "log5", Key: "x\xff"}}, 0, ErrUnknownRule},
		{[]Request{{Rule: "log5", Key: "x\xff"}, {Rule: "nope", Key: "x"}}, 0, api.ErrBadRequest},
		{[]Request{{Rule: "log5", Key: "x", Cost: 6}, {Rule: "log5", Key: "\xff"}}, 0, limiter.ErrCost},
		// Its key is its first reason, as over HTTP (the shape, then the rule).
		{[]Request{{Rule: "nope", Key: "x\xff"}}, 0, api.ErrBadRequest},
		{[]Request{{Rule: "nope", Key: ""}}, 0, api.ErrBadRequest},
		{[]Request{{Rule: "log5", Key: "x\xff", KeyValid: true}, {Rule: "log5", Key: "\xffy"}}, 1, api.ErrBadRequest},
		{[]Request{{Rule: "log5", Key: strings.Repeat("\xff", api.MaxKeyLen+1)}}, 0, api.ErrBadRequest},
	}
	for i, tt := range tests {
		err := rt.Check(context.Background(), tt.reqs, out)
		var ie *ItemError
		if !errors.As(err, &ie) || ie.Index != tt.index || !errors.Is(err, tt.is) {
			t.Errorf("case %d: %v, want an ItemError at %d wrapping %v", i, err, tt.index, tt.is)
		}
	}
	if o.calls.Load() != 0 || o.Table().Len() != 0 {
		t.Fatalf("invalid batches reached the owner (%d calls, %d states): nothing may be spent", o.calls.Load(), o.Table().Len())
	}
}

// lateCtx has a deadline that has passed but whose timer has not fired:
// Err is still nil, as for a moment after any real deadline.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A check whose own deadline has passed is the caller's timeout: it is
// not sent, and not answered by the failure mode as if the owner were down.
func TestRouterPastDeadlineIsTheCallersTimeout(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a")
	net := &network{owners: map[string]*owner{"a:1": newOwner(t, "a", r1, rules)}}
	rt, err := New(Config{}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(view.New(r1, 7, ruleList(rules), 0))
	out := make([]Result, 1)
	err = rt.Check(lateCtx{context.Background()}, []Request{{Rule: "closed", Key: "x", Cost: 1}}, out)
	if !errors.Is(err, context.DeadlineExceeded) || out[0].Degraded {
		t.Fatalf("Check past its deadline: %v, %+v; want DeadlineExceeded and no degraded answer", err, out[0])
	}
	if calls := net.owners["a:1"].calls.Load(); calls != 0 {
		t.Fatalf("the owner was called %d times", calls)
	}
}

// A check may carry its rule inline: the router does not look it up, and
// the definition reaches the owner with the check, so routers that share
// nothing but the config still share one limit. An inline rule named
// other than the check is refused whole.
func TestRouterInlineRule(t *testing.T) {
	r1 := mustRing(t, 1, "a", "b")
	net := &network{owners: map[string]*owner{}}
	for _, id := range []string{"a", "b"} {
		net.owners[id+":1"] = newOwner(t, id, r1, testRules(t))
	}
	inline := &limiter.Rule{Name: "rls:d.k#0", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Minute}
	allowed := 0
	for i := range 10 {
		rt, err := New(Config{Timeout: 5 * time.Second}, nil, net) // a pure router
		if err != nil {
			t.Fatal(err)
		}
		rt.SetView(&View{Ring: r1, Seed: 7, Rules: testRules(t)})
		out := make([]Result, 2)
		err = rt.Check(context.Background(), []Request{
			{Rule: inline.Name, Key: "user-1", Cost: 1, Inline: inline},
			{Rule: inline.Name, Key: "user-2", Cost: 1, Inline: inline},
		}, out)
		rt.Close()
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if out[0].Degraded || out[1].Degraded {
			t.Fatalf("check %d degraded", i)
		}
		if out[0].Allowed {
			allowed++
		}
		if !out[1].Allowed != (i >= 3) {
			t.Fatalf("check %d on user-2: allowed %v", i, out[1].Allowed)
		}
	}
	if allowed != 3 {
		t.Fatalf("10 routers admitted %d under an inline limit of 3", allowed)
	}

	rt, err := New(Config{}, nil, net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(&View{Ring: r1, Seed: 7, Rules: testRules(t)})
	err = rt.Check(context.Background(), []Request{{Rule: "log5", Key: "k", Cost: 1}, {Rule: "other", Key: "k", Cost: 1, Inline: inline}}, make([]Result, 2))
	var ie *ItemError
	if !errors.As(err, &ie) || ie.Index != 1 || !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("inline rule under another name: %v, want checks[1] unknown rule", err)
	}
}

// recordingOwner is an owner that remembers the key hashes of the last
// batch it was handed.
type recordingOwner struct {
	*owner
	got []uint64
}

func (o *recordingOwner) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	o.got = o.got[:0]
	for _, c := range req.Checks {
		o.got = append(o.got, c.KeyHash)
	}
	o.owner.HandleBatch(ctx, req, resp)
}

// The local owner is handed exactly the checks it owns, in request order,
// whether the call is all its own (decided in place, without a copy) or
// mixed with another owner's, and each answer lands at its own index —
// also in a mixed call after an all-local one.
func TestRouterLocalChecksInOrder(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a", "b")
	net := &network{owners: map[string]*owner{}}
	for _, id := range []string{"a", "b"} {
		net.owners[id+":1"] = newOwner(t, id, r1, rules)
	}
	local := &recordingOwner{owner: net.owners["a:1"]}
	rt, err := New(Config{Self: "a", Linger: 50 * time.Microsecond, Timeout: 5 * time.Second}, local, net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	v := view.New(r1, 7, ruleList(rules), 0)
	rt.SetView(v)

	var all, mine []Request
	for i := range 40 {
		q := Request{Rule: "log5", Key: "k" + string(rune('A'+i)), Cost: int64(i % 2)}
		all = append(all, q)
		if o, _ := r1.Owner(r1.Partition(limiter.KeyHash(v.Seed, q.Key))); o.ID == "a" {
			mine = append(mine, q)
		}
	}
	if len(mine) == 0 || len(mine) == len(all) {
		t.Fatalf("%d of %d keys are a's: want some", len(mine), len(all))
	}
	spent := map[string]int64{}
	call := func(name string, reqs []Request) {
		t.Helper()
		out := make([]Result, len(reqs))
		if err := rt.Check(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		var want []uint64
		for i, q := range reqs {
			spent[q.Key] += q.Cost
			if got, w := out[i].Remaining, 5-spent[q.Key]; got != w || !out[i].Allowed || out[i].Degraded {
				t.Errorf("%s: check %d (%s, cost %d) = %+v, want allowed with %d remaining", name, i, q.Key, q.Cost, out[i], w)
			}
			if o, _ := r1.Owner(r1.Partition(limiter.KeyHash(v.Seed, q.Key))); o.ID == "a" {
				want = append(want, limiter.KeyHash(v.Seed, q.Key))
			}
		}
		if !slices.Equal(local.got, want) {
			t.Errorf("%s: the local owner was handed %x, want %x", name, local.got, want)
		}
	}
	call("mixed", all)
	call("all local", mine)
	call("mixed after all local", all)
}

// ownedBySelf follows the ring: it names exactly the partitions Self owns
// in the ring asked about, and nothing for a router without a local
// owner.
func TestRouterOwnedBySelf(t *testing.T) {
	rules := testRules(t)
	r1, r2 := mustRing(t, 1, "a", "b"), mustRing(t, 2, "a", "b", "c")
	o := newOwner(t, "a", r1, rules)
	rt, err := New(Config{Self: "a"}, o, &network{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for _, rg := range []*ring.Ring{r1, r2, r1} {
		mine := rt.ownedBySelf(rg)
		if len(mine) != rg.Config().Partitions {
			t.Fatalf("epoch %d: %d partitions, want %d", rg.Epoch(), len(mine), rg.Config().Partitions)
		}
		for p := range mine {
			m, ok := rg.Owner(uint32(p))
			if want := ok && m.ID == "a"; mine[p] != want {
				t.Errorf("epoch %d: partition %d mine = %v, want %v", rg.Epoch(), p, mine[p], want)
			}
		}
	}
	pure := pureRouter(t)
	if mine := pure.ownedBySelf(r1); mine != nil {
		t.Errorf("a router without a local owner: %v, want nil", mine)
	}
}

// TestRouterRoutesFollowRing checks dispatch's per-ring table: for every
// partition of the ring asked about, the address it gives is its
// owner's, and a partition of no owner (an empty ring) has none.
func TestRouterRoutesFollowRing(t *testing.T) {
	r1, r2 := mustRing(t, 1, "a", "b"), mustRing(t, 2, "a", "b", "c")
	empty, err := ring.New(r1.Config(), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt := pureRouter(t)
	for _, rg := range []*ring.Ring{r1, r2, r1, empty} {
		rs := rt.routesFor(rg)
		if len(rs.peer) != rg.Config().Partitions || rs.mine != nil {
			t.Fatalf("epoch %d: %d partitions (want %d), mine %v", rg.Epoch(), len(rs.peer), rg.Config().Partitions, rs.mine)
		}
		for p, k := range rs.peer {
			m, ok := rg.Owner(uint32(p))
			switch {
			case !ok && k != -1:
				t.Errorf("epoch %d: partition %d has no owner, routed to slot %d", rg.Epoch(), p, k)
			case ok && (k < 0 || rs.peers[k] != m.Peer):
				t.Errorf("epoch %d: partition %d routed to slot %d of %v, want %s", rg.Epoch(), p, k, rs.peers, m.Peer)
			}
		}
		if rt.routesFor(rg) != rs {
			t.Errorf("epoch %d: routes computed again for the same ring", rg.Epoch())
		}
	}
}

// A rule removed from the view takes its series with it: a cluster whose
// rules come and go does not export each one it ever had. The rules that
// stay keep counting. Was: every removed rule's series stayed until the
// process restarted.
func TestRemovedRulesSeriesAreDeleted(t *testing.T) {
	rules := testRules(t)
	r1 := mustRing(t, 1, "a")
	net := &network{owners: map[string]*owner{"a:1": newOwner(t, "a", r1, rules)}}
	reg := prometheus.NewRegistry()
	rt, err := New(Config{Self: "a", Registerer: reg}, net.owners["a:1"], net)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(view.New(r1, 7, ruleList(rules), 0))
	check := func(rule string) {
		t.Helper()
		out := make([]Result, 1)
		if err := rt.Check(t.Context(), []Request{{Rule: rule, Key: "k", Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
	}
	check("log5")
	check("closed")
	series := func() []string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, mf := range mfs {
			if n := mf.GetName(); n == "ringlimit_decisions_total" || n == "ringlimit_degraded_total" {
				for _, m := range mf.GetMetric() {
					s := n
					for _, l := range m.GetLabel() {
						s += " " + l.GetName() + "=" + l.GetValue()
					}
					got = append(got, s)
				}
			}
		}
		slices.Sort(got)
		return got
	}
	if got := series(); len(got) != 6 {
		t.Fatalf("series after checking two rules: %q; want 6", got)
	}
	kept := map[string]*limiter.Rule{"log5": rules["log5"]}
	rt.SetView(view.New(r1, 8, ruleList(kept), 0))
	check("log5")
	want := []string{
		"ringlimit_decisions_total outcome=allowed rule=log5",
		"ringlimit_decisions_total outcome=denied rule=log5",
		"ringlimit_degraded_total rule=log5",
	}
	if got := series(); !slices.Equal(got, want) {
		t.Fatalf("series after removing rule closed: %q; want %q", got, want)
	}
	if got := testutil.ToFloat64(rt.m.decisions.WithLabelValues("log5", "allowed")); got != 2 {
		t.Errorf("log5 allowed %v after two checks, want 2 (its count kept)", got)
	}
	// The rule written again counts afresh.
	rt.SetView(view.New(r1, 9, ruleList(rules), 0))
	check("closed")
	if got := testutil.ToFloat64(rt.m.decisions.WithLabelValues("closed", "allowed")); got != 1 {
		t.Errorf("closed allowed %v after it came back and was checked once, want 1", got)
	}
}

// Which batch errors say the owner could not be reached at all (the
// router then looks for a newer view, and answers its checks by their
// failure mode for a while without sending): a dial not answered for
// SlowDial is one. Was not: a router kept waiting its whole timeout
// per check for an owner whose host dropped the dial's packets.
func TestOwnerGoneErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		gone bool
	}{
		{fmt.Errorf("x: %w", transport.ErrDialSlow), true},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, true},
		{fmt.Errorf("%w: reset", transport.ErrConnClosed), true},
		{fmt.Errorf("%w: %w", transport.ErrConnClosed, transport.ErrClientClosed), false},
		{context.DeadlineExceeded, false},
		{transport.ErrQueueFull, false},
	} {
		if got := ownerGone(tc.err); got != tc.gone {
			t.Errorf("ownerGone(%v) = %v, want %v", tc.err, got, tc.gone)
		}
	}
}
