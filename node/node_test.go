package node

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// testOwner is an Owner "a" without Raft, serving the view set by hand.
func testOwner(t testing.TB, epoch uint64, members ...string) (*Owner, *view.View) {
	t.Helper()
	o, err := NewOwner("a", 64, func() int64 { return 1e18 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := testView(t, epoch, members...)
	o.Apply(v, PlanMoves(nil, v.Ring, "a", nil, false, false))
	o.ExpireAwaiting(o.AwaitingParts()) // serve from empty, as after a hand-off timeout
	return o, v
}

// newOwner returns an owner of 64 partitions whose clock stands still.
func newOwner(t *testing.T, id string) *Owner {
	t.Helper()
	o, err := NewOwner(id, 64, func() int64 { return 1e18 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func testRing(t testing.TB, epoch uint64, members ...string) *ring.Ring {
	t.Helper()
	var ms []ring.Member
	for _, id := range members {
		ms = append(ms, ring.Member{ID: id, Peer: id + ":1"})
	}
	r, err := ring.New(ring.Config{Partitions: 64, ReplicationFactor: 32, Load: 1.25}, epoch, ms)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func testView(t testing.TB, epoch uint64, members ...string) *view.View {
	t.Helper()
	rule := limiter.Rule{Name: "r", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}
	return view.New(testRing(t, epoch, members...), 9, []limiter.Rule{rule}, 1)
}

// partOf returns a key hash whose partition the view gives to owner.
func partOf(v *view.View, owner string) (uint64, uint32) {
	for h := uint64(1); ; h++ {
		p := v.Ring.Partition(h)
		if m, _ := v.Ring.Owner(p); m.ID == owner {
			return h, p
		}
	}
}

func handle(o *Owner, epoch uint64, checks ...transport.Check) *transport.BatchResponse {
	resp := &transport.BatchResponse{Results: make([]transport.Result, len(checks))}
	o.HandleBatch(context.Background(), &transport.BatchRequest{Epoch: epoch, Checks: checks}, resp)
	return resp
}

func TestHandleBatchStatuses(t *testing.T) {
	o, v := testOwner(t, 5, "a", "b")
	mine, pm := partOf(v, "a")
	theirs, pt := partOf(v, "b")
	resp := handle(o, 5,
		transport.Check{Rule: "r", KeyHash: mine, Partition: pm, Cost: 1},
		transport.Check{Rule: "r", KeyHash: mine, Partition: pm, Cost: 1},
		transport.Check{Rule: "r", KeyHash: mine, Partition: pm, Cost: 1},
		transport.Check{Rule: "r", KeyHash: theirs, Partition: pt, Cost: 1},
		transport.Check{Rule: "nope", KeyHash: mine, Partition: pm, Cost: 1},
		transport.Check{Rule: "r", KeyHash: mine, Partition: pm, Cost: 3},
		transport.Check{Rule: "r", KeyHash: mine, Partition: pt, Cost: 1},
	)
	want := []struct {
		status  transport.Status
		allowed bool
	}{
		{transport.StatusOK, true}, {transport.StatusOK, true}, {transport.StatusOK, false},
		{transport.StatusNotOwner, false}, {transport.StatusUnknownRule, false},
		{transport.StatusBadRequest, false}, // cost over the limit
		{transport.StatusNotOwner, false},   // a partition not ours, whatever the hash
	}
	if resp.Epoch != 5 {
		t.Errorf("epoch %d, want 5", resp.Epoch)
	}
	for i, w := range want {
		if r := resp.Results[i]; r.Status != w.status || r.Allowed != w.allowed {
			t.Errorf("check %d: %v allowed=%v, want %v allowed=%v", i, r.Status, r.Allowed, w.status, w.allowed)
		}
	}
	if got := o.Decided(); got != 3 { // ringlimit_owner_checks_total: the OK answers
		t.Errorf("Decided() = %d, want 3", got)
	}
	// A hash that does not belong to the partition it claims is refused.
	other := mine
	for {
		other++
		if p := v.Ring.Partition(other); p != pm {
			break
		}
	}
	if r := handle(o, 5, transport.Check{Rule: "r", KeyHash: other, Partition: pm, Cost: 1}).Results[0]; r.Status != transport.StatusBadRequest {
		t.Errorf("mismatched partition: %v, want BAD_REQUEST", r.Status)
	}
}

// The checks of a frame that name several rules, interleaved, are each
// decided under their own rule (decide remembers the rule looked up last).
func TestHandleBatchInterleavedRules(t *testing.T) {
	o, err := NewOwner("a", 64, func() int64 { return 1e18 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	rules := []limiter.Rule{
		{Name: "r", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute},
		{Name: "s", Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Minute},
	}
	v := view.New(testRing(t, 5, "a"), 9, rules, 1)
	o.Apply(v, PlanMoves(nil, v.Ring, "a", nil, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	kh, p := partOf(v, "a")
	c := func(rule string) transport.Check {
		return transport.Check{Rule: rule, KeyHash: kh, Partition: p, Cost: 1}
	}
	resp := handle(o, 5, c("r"), c("s"), c("r"), c("s"), c("nope"), c("r"), c("s"))
	want := []struct {
		status  transport.Status
		allowed bool
	}{
		{transport.StatusOK, true}, {transport.StatusOK, true}, {transport.StatusOK, true},
		{transport.StatusOK, false}, {transport.StatusUnknownRule, false},
		{transport.StatusOK, false}, {transport.StatusOK, false},
	}
	for i, w := range want {
		if r := resp.Results[i]; r.Status != w.status || r.Allowed != w.allowed {
			t.Errorf("check %d: %v allowed=%v, want %v allowed=%v", i, r.Status, r.Allowed, w.status, w.allowed)
		}
	}
	if got := resp.Results[0].Limit; got != 2 {
		t.Errorf("r's limit %d, want 2", got)
	}
	if got := resp.Results[1].Limit; got != 1 {
		t.Errorf("s's limit %d, want 1", got)
	}
}

// A sender with a newer ring waits for ours to catch up instead of being
// answered from the stale one; if it never comes, the stale answer stands
// after epochWait.
func TestHandleBatchWaitsForNewerEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o, old := testOwner(t, 5)   // nobody owns anything at epoch 5
		next := testView(t, 6, "a") // at epoch 6 we own everything
		h, p := partOf(next, "a")
		done := make(chan *transport.BatchResponse)
		go func() { done <- handle(o, 6, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}) }()
		synctest.Wait() // blocked waiting for epoch 6
		o.Apply(next, PlanMoves(old.Ring, next.Ring, "a", func(string) bool { return false }, false, false))
		if r := <-done; r.Epoch != 6 || r.Results[0].Status != transport.StatusOK {
			t.Fatalf("after the new view: epoch %d %v, want 6 OK", r.Epoch, r.Results[0].Status)
		}

		start := time.Now()
		r := handle(o, 7, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1})
		if waited := time.Since(start); waited != epochWait || r.Results[0].Status != transport.StatusOK {
			t.Fatalf("no newer view: waited %v and answered %v, want %v and OK from epoch 6", waited, r.Results[0].Status, epochWait)
		}
	})
}

// joinSetup returns owners a and b of rule r (2 per minute, fixed
// window) and two views: a alone (epoch 1), then b joining (epoch 2).
func joinSetup(t *testing.T) (a, b *Owner, v1, v2 *view.View) {
	t.Helper()
	rule := []limiter.Rule{{Name: "r", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}}
	return newOwner(t, "a"), newOwner(t, "b"), view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1)
}

// A partition handed over gracefully is served by nobody between the old
// owner's freeze and the new owner's import, and the state moves whole:
// spent budget is not reset.
func TestHandoffMovesStateAndFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, v1, v2 := joinSetup(t)
		alive := func(string) bool { return true }
		a.Apply(v1, PlanMoves(nil, v1.Ring, "a", alive, false, false))
		b.Apply(v1, PlanMoves(nil, v1.Ring, "b", alive, false, false))
		h, p := partOf(v2, "b") // a partition that moves a → b
		c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}
		if r := handle(a, 1, c).Results[0]; !r.Allowed {
			t.Fatalf("first check at a: %+v", r)
		}
		// b learns of the new ring first: it owns p but holds nothing yet.
		b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", alive, false, false))
		if b.Awaiting() == 0 {
			t.Fatal("b should await its hand-offs")
		}
		got := make(chan transport.Result)
		go func() { got <- handle(b, 2, c).Results[0] }()
		synctest.Wait() // the check waits at b for the hand-off
		select {
		case r := <-got:
			t.Fatalf("b answered %+v before holding the partition", r)
		default:
		}
		out := a.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", alive, false, false))
		if r := handle(a, 2, c).Results[0]; r.Status != transport.StatusNotOwner {
			t.Fatalf("a after giving p up: %v, want NOT_OWNER", r.Status)
		}
		push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a"}
		for _, og := range out {
			if og.To.ID != "b" {
				t.Fatalf("hand-off to %q, want b", og.To.ID)
			}
			push.Parts = append(push.Parts, og.Part)
		}
		ack := transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
		b.HandlePush(context.Background(), push, &ack)
		for i, st := range ack.Status {
			if st != transport.PushOK {
				t.Fatalf("part %d: %v", i, st)
			}
		}
		if r := <-got; r.Status != transport.StatusOK || !r.Allowed || r.Remaining != 0 {
			t.Fatalf("waiting check at b: %+v, want the second of 2 allowed, 0 left", r)
		}
		if r := handle(b, 2, c).Results[0]; r.Allowed {
			t.Fatalf("third check at b allowed: the budget was reset by the move")
		}
	})
}

// A member that joins while catching up with the log may first see the
// empty ring of the cluster's Init, and next a ring naming itself and
// the others at once. What it gains is handed off by living owners: it
// must wait for that, not serve it from empty meanwhile (it once did, and
// took the hand-off for a duplicate and dropped it, which reset every
// moved key's budget at a join, about one run in ten of cmd/ringlimit's
// TestRouterFollowsTheCluster).
func TestJoinerWhoseFirstRingWasEmptyAwaitsHandoffs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []limiter.Rule{{Name: "r", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour}}
		a, c := newOwner(t, "a"), newOwner(t, "c")
		v0 := view.New(testRing(t, 3), 9, rule, 2) // Init: no member yet
		v1 := view.New(testRing(t, 4, "a"), 9, rule, 2)
		v2 := view.New(testRing(t, 6, "a", "c"), 9, rule, 2)
		alive := func(string) bool { return true }
		a.Apply(v0, PlanMoves(nil, v0.Ring, "a", alive, false, false))
		a.Apply(v1, PlanMoves(v0.Ring, v1.Ring, "a", alive, false, true))
		h, p := partOf(v2, "c")
		ck := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}
		for i := range 3 {
			if r := handle(a, 4, ck).Results[0]; r.Status != transport.StatusOK || !r.Allowed {
				t.Fatalf("check %d at a: %+v, want allowed", i+1, r)
			}
		}
		// c's log reached Init and then its own join, in two views.
		c.Apply(v0, PlanMoves(nil, v0.Ring, "c", alive, false, false))
		c.Apply(v2, PlanMoves(v0.Ring, v2.Ring, "c", alive, false, true))
		got := make(chan transport.Result)
		go func() { got <- handle(c, 6, ck).Results[0] }()
		synctest.Wait()
		select {
		case r := <-got:
			t.Fatalf("c answered %+v before the hand-off of partition %d", r, p)
		default:
		}
		out := a.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", alive, false, false))
		push := &transport.Push{Kind: transport.PushHandoff, Epoch: 6, From: "a"}
		for _, og := range out {
			push.Parts = append(push.Parts, og.Part)
		}
		ack := transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
		c.HandlePush(context.Background(), push, &ack)
		for i, st := range ack.Status {
			if st != transport.PushOK {
				t.Fatalf("part %d: %v", push.Parts[i].Partition, st)
			}
		}
		if r := <-got; r.Status != transport.StatusOK || !r.Allowed || r.Remaining != 1 {
			t.Fatalf("4th check, at c: %+v, want allowed with 1 left", r)
		}
		if r := handle(c, 6, ck).Results[0]; !r.Allowed || r.Remaining != 0 {
			t.Fatalf("5th check, at c: %+v, want allowed with 0 left", r)
		}
		if r := handle(c, 6, ck).Results[0]; r.Allowed {
			t.Fatalf("6th check, at c: allowed; the join reset the key's budget of 5")
		}
	})
}

// Checks racing the move of their partition out: every check the old
// owner admitted is spent in the state the new owner receives, whatever
// the interleaving (the table's fence is set before the export).
func TestMoveOutLosesNoDecision(t *testing.T) {
	const workers, burst = 4, 100_000
	rule := []limiter.Rule{{Name: "r", Algorithm: limiter.TokenBucket, Limit: 1, Burst: burst, Period: time.Hour}}
	a, b := newOwner(t, "a"), newOwner(t, "b")
	v1, v2 := view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1)
	alive := func(string) bool { return true }
	a.Apply(v1, PlanMoves(nil, v1.Ring, "a", alive, false, false))
	a.ExpireAwaiting(a.AwaitingParts())
	b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", alive, false, false))
	h, p := partOf(v2, "b")
	c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}
	var admitted atomic.Int64
	started := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				r := handle(a, 1, c).Results[0]
				if i == 0 {
					started <- struct{}{}
				}
				if r.Status != transport.StatusOK {
					return // NOT_OWNER or UNAVAILABLE: the move has begun
				}
				if r.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	for range workers {
		<-started
	}
	out := a.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", alive, false, false))
	wg.Wait()
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a"}
	for _, og := range out {
		push.Parts = append(push.Parts, og.Part)
	}
	ack := transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
	b.HandlePush(context.Background(), push, &ack)
	q := c
	q.Cost = 0
	r := handle(b, 2, q).Results[0]
	if r.Status != transport.StatusOK {
		t.Fatalf("query at b: %v", r.Status)
	}
	if spent := burst - r.Remaining; spent != admitted.Load() || spent == 0 {
		t.Fatalf("a admitted %d, b received %d spent", admitted.Load(), spent)
	}
}

func TestPlanMoves(t *testing.T) {
	r1 := testRing(t, 1, "a", "b")
	r2 := testRing(t, 2, "a", "b", "c")
	r3 := testRing(t, 3, "a", "c") // b gone
	alive := func(id string) bool { return id != "b" }
	t.Run("first ring of a new cluster serves fresh", func(t *testing.T) {
		r1 := testRing(t, 1, "a")
		m := PlanMoves(nil, r1, "a", alive, false, false)
		for _, g := range m.Gained {
			if g != GainFresh {
				t.Fatalf("gain %v, want fresh", g)
			}
		}
		if len(m.Gained) != len(r1.PartitionsOf("a")) || len(m.Lost) != 0 {
			t.Fatalf("%d gained %d lost", len(m.Gained), len(m.Lost))
		}
	})
	t.Run("first ring naming a joiner among others awaits", func(t *testing.T) {
		m := PlanMoves(nil, r1, "a", alive, false, false)
		if m.Restart || len(m.awaiting()) != len(r1.PartitionsOf("a")) {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("the only member rejoining at new addresses keeps what it holds", func(t *testing.T) {
		solo1, solo2 := testRing(t, 1, "a"), testRing(t, 2, "a")
		if m := PlanMoves(solo1, solo2, "a", alive, false, true); len(m.Gained) != 0 || len(m.Lost) != 0 {
			t.Fatalf("%d gained, %d lost: awaiting a hand-off nobody can send would drop its state", len(m.Gained), len(m.Lost))
		}
	})
	t.Run("first ring after a restart awaits", func(t *testing.T) {
		m := PlanMoves(nil, r1, "a", alive, true, false)
		if !m.Restart || len(m.awaiting()) != len(r1.PartitionsOf("a")) {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("join: the newcomer awaits from living owners, they lose", func(t *testing.T) {
		mc := PlanMoves(r1, r2, "c", alive, false, false)
		ma := PlanMoves(r1, r2, "a", alive, false, false)
		for p, g := range mc.Gained {
			from, _ := r1.Owner(p)
			want := GainAwait
			if from.ID == "b" {
				want = GainPromote // b is dead in this table: nothing will come
			}
			if g != want {
				t.Fatalf("partition %d from %s: %v, want %v", p, from.ID, g, want)
			}
		}
		for p, to := range ma.Lost {
			if o, _ := r2.Owner(p); o.ID != to || to == "a" {
				t.Fatalf("a loses %d to %q, ring says %q", p, to, o.ID)
			}
		}
		if len(ma.Lost) == 0 {
			t.Fatal("a lost nothing to the newcomer")
		}
	})
	t.Run("a member that left and came back between two rings awaits what it kept", func(t *testing.T) {
		m := PlanMoves(r1, r1, "a", alive, false, true)
		if len(m.awaiting()) != len(r1.PartitionsOf("a")) || len(m.Lost) != 0 {
			t.Fatalf("%d awaiting, %d lost; want all %d of a's partitions awaited", len(m.awaiting()), len(m.Lost), len(r1.PartitionsOf("a")))
		}
	})
	t.Run("a newcomer whose first ring was the empty one of Init awaits all it gains", func(t *testing.T) {
		// It caught up with the log after Init: next names a, b and c at
		// once, so prev's "nobody" is not who held the partitions last.
		m := PlanMoves(testRing(t, 0), r2, "c", alive, false, true)
		if len(m.Gained) == 0 || len(m.awaiting()) != len(m.Gained) {
			t.Fatalf("%d of %d gained partitions awaited, want all", len(m.awaiting()), len(m.Gained))
		}
	})
	t.Run("the first member after the empty ring of Init serves fresh", func(t *testing.T) {
		m := PlanMoves(testRing(t, 0), testRing(t, 1, "a"), "a", alive, false, true)
		if len(m.Gained) != 64 || len(m.awaiting()) != 0 {
			t.Fatalf("%d gained, %d awaited; want 64 promoted (nobody can hand them off)", len(m.Gained), len(m.awaiting()))
		}
	})
	t.Run("rings in between unseen: a dead owner's partitions are awaited", func(t *testing.T) {
		// r1 → r3 is two changes (b gone, c added): b's partitions went
		// to someone in between, who may be handing them to c now.
		m := PlanMoves(r1, r3, "c", alive, false, true)
		n := 0
		for p, g := range m.Gained {
			if from, _ := r1.Owner(p); from.ID == "b" {
				n++
				if g != GainAwait {
					t.Fatalf("partition %d of dead b: %v, want await", p, g)
				}
			}
		}
		if n == 0 {
			t.Fatal("c gained nothing of b's")
		}
	})
	t.Run("dead owner: survivors promote their backups", func(t *testing.T) {
		m := PlanMoves(r2, r3, "c", alive, false, false)
		for p, g := range m.Gained {
			if from, _ := r2.Owner(p); from.ID == "b" && g != GainPromote {
				t.Fatalf("partition %d of dead b: %v, want promote", p, g)
			}
		}
		for p := range m.Gained {
			if from, _ := r2.Owner(p); from.ID == "b" {
				if bk, _ := r2.Backup(p); bk.ID != "c" {
					continue
				}
				return // at least one promotion of a copy c held
			}
		}
		t.Fatal("c promoted no partition it backed up")
	})
}

// capOwner returns an owner of every partition of a one-member ring,
// rule "r" (token bucket, 10/s), on the clock *now, and its view.
func capOwner(t *testing.T, now *int64) (*Owner, *view.View) {
	t.Helper()
	return capOwnerLogging(t, now, nil)
}

// capOwnerLogging is capOwner logging to log.
func capOwnerLogging(t *testing.T, now *int64, log *slog.Logger) (*Owner, *view.View) {
	t.Helper()
	o, err := NewOwner("a", 64, func() int64 { return *now }, log)
	if err != nil {
		t.Fatal(err)
	}
	rule := limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second}
	v := view.New(testRing(t, 1, "a"), 9, []limiter.Rule{rule}, 0)
	o.Apply(v, PlanMoves(nil, v.Ring, "a", nil, false, false))
	return o, v
}

// At its key cap an owner still decides the keys it tracks, refuses new
// ones (OVER_CAPACITY: the router answers by the rule's failure mode)
// and takes new keys again once the sweep has dropped idle ones.
func TestKeyCap(t *testing.T) {
	now := int64(1e18)
	o, v := capOwner(t, &now)
	o.SetMaxKeys(2)
	check := func(h uint64) transport.Status {
		return handle(o, 1, transport.Check{Rule: "r", KeyHash: h, Partition: v.Ring.Partition(h), Cost: 1}).Results[0].Status
	}
	for _, h := range []uint64{1, 2} {
		if st := check(h); st != transport.StatusOK {
			t.Fatalf("key %d: %v", h, st)
		}
	}
	o.RefreshFull()
	if st := check(3); st != transport.StatusOverCapacity {
		t.Fatalf("a third key at the cap: %v, want OVER_CAPACITY", st)
	}
	if st := check(1); st != transport.StatusOK {
		t.Fatalf("a tracked key at the cap: %v, want OK", st)
	}
	if o.OverCapacity() != 1 {
		t.Fatalf("refusals counted: %d, want 1", o.OverCapacity())
	}
	now += int64(10 * time.Second) // both buckets full again: idle
	for p := range uint32(64) {
		o.Sweep(p)
	}
	o.RefreshFull()
	if st := check(3); st != transport.StatusOK {
		t.Fatalf("after the sweep: %v, want OK", st)
	}
}

// An owner that reaches its key cap says so at warn, once, and again
// only after capWarnEvery, however often it reaches it meanwhile (after
// each sweep that freed keys). Was: only counted, in a metric.
func TestKeyCapIsLogged(t *testing.T) {
	now := int64(1e18)
	var buf logbuf.Buffer
	o, v := capOwnerLogging(t, &now, slog.New(slog.NewJSONHandler(&buf, nil)))
	o.SetMaxKeys(2)
	fill := func() {
		for _, h := range []uint64{1, 2} {
			handle(o, 1, transport.Check{Rule: "r", KeyHash: h, Partition: v.Ring.Partition(h), Cost: 1})
		}
		o.RefreshFull()
	}
	lines := func() int {
		n := 0
		for _, l := range logbuf.Parse(t, buf.String()) {
			if strings.Contains(l["msg"].(string), "--max-keys") && l["level"] == "WARN" && l["max_keys"] == float64(2) {
				n++
			}
		}
		return n
	}
	o.RefreshFull()
	if n := lines(); n != 0 {
		t.Fatalf("%d lines below the cap", n)
	}
	fill()
	o.RefreshFull()
	if n := lines(); n != 1 {
		t.Fatalf("%d lines at the cap, want 1", n)
	}
	for _, gap := range []time.Duration{10 * time.Second, 21 * time.Second} {
		now += int64(gap) // both keys idle: the sweep frees them
		for p := range uint32(64) {
			o.Sweep(p)
		}
		o.RefreshFull()
		fill()
	}
	if n := lines(); n != 2 {
		t.Fatalf("%d lines after reaching the cap again 10 s and 31 s later, want 2", n)
	}
}

// At its key cap an owner still decides the keys it tracks after their
// rule's algorithm changed, whose states lie under the former
// algorithm's buckets until a check carries them over, and which keep
// what they spent. Was: each looked new (Holds saw only the new bucket)
// and was refused, OVER_CAPACITY, so its state never carried over.
func TestKeyCapAfterAlgorithmChange(t *testing.T) {
	now := int64(1e18)
	o, v := capOwner(t, &now)
	r := v.Rules["r"]
	hour := *r
	hour.Period = time.Hour
	v1 := view.New(v.Ring, 9, []limiter.Rule{hour}, 1)
	o.Apply(v1, PlanMoves(v.Ring, v1.Ring, "a", nil, false, false))
	o.SetMaxKeys(2)
	check := func(v *view.View, h, cost uint64) transport.Result {
		resp := &transport.BatchResponse{Results: make([]transport.Result, 1)}
		o.HandleBatch(context.Background(), &transport.BatchRequest{Epoch: v.Epoch(), RulesVersion: v.RulesVersion,
			Checks: []transport.Check{{Rule: "r", KeyHash: h, Partition: v.Ring.Partition(h), Cost: cost}}}, resp)
		return resp.Results[0]
	}
	for _, h := range []uint64{1, 2} {
		if res := check(v1, h, 8); res.Status != transport.StatusOK || !res.Allowed {
			t.Fatalf("key %d: %+v", h, res)
		}
	}
	o.RefreshFull()
	gcra := hour
	gcra.Algorithm = limiter.GCRA
	v2 := view.New(v.Ring, 9, []limiter.Rule{gcra}, 2)
	o.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", nil, false, false))
	if res := check(v2, 1, 1); res.Status != transport.StatusOK || !res.Allowed || res.Remaining != 1 {
		t.Fatalf("a tracked key at the cap, its rule now gcra: %+v, want OK, allowed, 1 left of the 2 it had", res)
	}
	if res := check(v2, 3, 1); res.Status != transport.StatusOverCapacity {
		t.Fatalf("a new key at the cap: %+v, want OVER_CAPACITY", res)
	}
}

// The key cap holds between sweeps: a burst of new keys is refused once
// the table is at the cap, give or take the refresh interval, though no
// sweep ran. Was: 5,000 keys taken under a cap of 100.
func TestKeyCapHoldsBetweenSweeps(t *testing.T) {
	now := int64(1e18)
	o, v := capOwner(t, &now)
	const limit = 100
	o.SetMaxKeys(limit)
	refused := 0
	for h := uint64(1); h <= 5000; h++ {
		st := handle(o, 1, transport.Check{Rule: "r", KeyHash: h * 0x9e3779b97f4a7c15, Partition: v.Ring.Partition(h * 0x9e3779b97f4a7c15), Cost: 1}).Results[0].Status
		if st == transport.StatusOverCapacity {
			refused++
		}
	}
	slack := limit / 16 // SetMaxKeys: the refresh interval
	if n := o.table.Len(); n > limit+slack || refused != 5000-n {
		t.Fatalf("%d keys tracked under a cap of %d (refresh slack %d), %d refused", n, limit, slack, refused)
	}
}

// Prompt says "decides at once" exactly when HandleBatch would not wait:
// not for a newer ring or rules, not for the lease, not for a hand-off.
func TestPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, v1, v2 := joinSetup(t)
		alive := func(string) bool { return true }
		prompt := func(o *Owner, epoch, rules uint64, want bool) {
			t.Helper()
			if got := o.Prompt(&transport.BatchRequest{Epoch: epoch, RulesVersion: rules}); got != want {
				t.Fatalf("%s: Prompt(epoch %d, rules %d) = %v, want %v", o.self, epoch, rules, got, want)
			}
		}
		prompt(a, 0, 0, false) // no view yet: it would wait for one
		a.Apply(v1, PlanMoves(nil, v1.Ring, "a", alive, false, false))
		b.Apply(v1, PlanMoves(nil, v1.Ring, "b", alive, false, false))
		prompt(a, 1, 1, true)
		prompt(a, 0, 0, true) // an older sender is answered at once (NOT_OWNER or decided)
		prompt(a, 2, 1, false)
		prompt(a, 1, 2, false)

		b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", alive, false, false))
		prompt(b, 2, 1, false) // its hand-offs are on their way
		out := a.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", alive, false, false))
		prompt(a, 2, 1, true) // a gave partitions up: it waits for nothing
		push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a"}
		for _, og := range out {
			push.Parts = append(push.Parts, og.Part)
		}
		ack := transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
		b.HandlePush(context.Background(), push, &ack)
		prompt(b, 2, 1, true)

		a.EnableLease(true) // leased until the zero time: expired
		prompt(a, 2, 1, false)
		a.SetLeaseUntil(time.Now().Add(time.Second))
		prompt(a, 2, 1, true)
	})
}

// The leader's lease counts from its freshest quorum's last answer: a
// voter that died a moment ago (an old answer, still within the lease)
// does not pull it back while the living voters make a quorum.
func TestLeaseBase(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(ms int) time.Time { return now.Add(-time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name   string
		others []time.Time
		voters int
		want   time.Time
		ok     bool
	}{
		{"alone", nil, 1, now, true},
		{"no voters listed", nil, 0, now, true},
		{"3 voters, both answered", []time.Time{ago(2000), ago(100)}, 3, ago(100), true},
		{"3 voters, one silent", []time.Time{ago(100)}, 3, ago(100), true},
		{"3 voters, none answered", nil, 3, time.Time{}, false},
		{"5 voters, four answered", []time.Time{ago(2400), ago(50), ago(300), ago(10)}, 5, ago(50), true},
		{"5 voters, two answered", []time.Time{ago(50), ago(10)}, 5, ago(50), true},
		{"5 voters, one answered", []time.Time{ago(10)}, 5, time.Time{}, false},
	} {
		got, ok := leaseBase(now, slices.Clone(tc.others), tc.voters)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// The leader's lease counts Raft's voters: whatever the cluster state's
// Voter flags say, a voter's answer counts, a non-voter's does not, and a
// voter that never answers (down, or no longer a member: a leave cut
// short) still counts towards the quorum. Servers are "id:v" (voter) or
// "id:n"; the leader is a.
func TestLeaderLeaseBase(t *testing.T) {
	now := time.Unix(1000, 0)
	lease := time.Second
	ago := func(ms int) time.Time { return now.Add(-time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name     string
		servers  []string
		answered map[string]time.Time
		want     time.Time
		ok       bool
	}{
		{"alone", []string{"a:v"}, nil, now, true},
		{"3 voters, one answered", []string{"a:v", "b:v", "c:v"}, map[string]time.Time{"c": ago(100)}, ago(100), true},
		// Over the flags of a state that missed c, d and e's promotions
		// (voters a and b) this was a lease.
		{"5 voters, one answered", []string{"a:v", "b:v", "c:v", "d:v", "e:v"}, map[string]time.Time{"b": ago(100)}, time.Time{}, false},
		{"5 voters, two answered", []string{"a:v", "b:v", "c:v", "d:v", "e:v"}, map[string]time.Time{"b": ago(100), "d": ago(300)}, ago(300), true},
		// Over the flags of a state that missed b and c's promotions (a
		// alone) this was a lease from now.
		{"3 voters, none answered", []string{"a:v", "b:v", "c:v"}, nil, time.Time{}, false},
		{"a non-voter's answer", []string{"a:v", "b:v", "c:v", "d:n"}, map[string]time.Time{"d": ago(10)}, time.Time{}, false},
		{"an answer older than the lease", []string{"a:v", "b:v", "c:v"}, map[string]time.Time{"b": ago(1000)}, time.Time{}, false},
		{"a voter that is no member counts against", []string{"a:v", "b:v", "c:v", "z:v"}, map[string]time.Time{"b": ago(10)}, time.Time{}, false},
		{"and is outvoted", []string{"a:v", "b:v", "c:v", "z:v"}, map[string]time.Time{"b": ago(10), "c": ago(20)}, ago(20), true},
		{"the leader not a voter", []string{"a:n", "b:v", "c:v"}, map[string]time.Time{"b": ago(10), "c": ago(20)}, time.Time{}, false},
		{"no configuration", nil, nil, time.Time{}, false},
	} {
		servers := raftServers(tc.servers, ":1")
		got, ok := leaderLeaseBase("a", servers, tc.answered, now, lease)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: leaderLeaseBase = %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// The leader's lease needs both quorums: of voters that answered its
// pings (alive) and of voters that answered its Raft calls at its term
// (following it), and counts from the older of the two; an answer at a
// newer term ends it. The leader is a; d does not vote.
func TestLeaderLeaseFrom(t *testing.T) {
	now := time.Unix(1000, 0)
	lease := time.Second
	ago := func(ms int) time.Time { return now.Add(-time.Duration(ms) * time.Millisecond) }
	three := []raft.Server{{ID: "a", Suffrage: raft.Voter}, {ID: "b", Suffrage: raft.Voter}, {ID: "c", Suffrage: raft.Voter}, {ID: "d", Suffrage: raft.Nonvoter}}
	alone := []raft.Server{{ID: "a", Suffrage: raft.Voter}, {ID: "d", Suffrage: raft.Nonvoter}}
	type at = map[string]time.Time
	for _, tc := range []struct {
		name       string
		servers    []raft.Server
		answered   at
		acked      at
		superseded bool
		want       time.Time
		ok         bool
	}{
		{"both from b", three, at{"b": ago(100)}, at{"b": ago(100)}, false, ago(100), true},
		{"pinged, Raft silent (a deposed leader)", three, at{"b": ago(10), "c": ago(10)}, nil, false, time.Time{}, false},
		{"Raft answered, pings not", three, nil, at{"b": ago(10), "c": ago(10)}, false, time.Time{}, false},
		{"Raft's quorum older", three, at{"b": ago(50)}, at{"b": ago(300)}, false, ago(300), true},
		{"the pings' quorum older", three, at{"c": ago(400)}, at{"c": ago(20)}, false, ago(400), true},
		{"a quorum of each, different voters", three, at{"b": ago(100)}, at{"c": ago(150)}, false, ago(150), true},
		{"Raft's answer too old", three, at{"b": ago(100)}, at{"b": ago(1000)}, false, time.Time{}, false},
		{"Raft answered by a non-voter only", three, at{"b": ago(100)}, at{"d": ago(10)}, false, time.Time{}, false},
		{"an answer at a newer term", three, at{"b": ago(100)}, at{"b": ago(100), "c": ago(100)}, true, time.Time{}, false},
		{"alone", alone, nil, nil, false, now, true},
		{"alone, a newer term seen", alone, nil, nil, true, time.Time{}, false},
	} {
		got, ok := leaderLeaseFrom("a", tc.servers, tc.answered, tc.acked, tc.superseded, now, lease)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: leaderLeaseFrom = %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// raftServers is a Raft configuration's servers from "id:v" (a voter) and
// "id:n" (a non-voter), each at address id+port.
func raftServers(specs []string, port string) []raft.Server {
	var servers []raft.Server
	for _, s := range specs {
		id, suffrage, _ := strings.Cut(s, ":")
		sv := raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + port), Suffrage: raft.Nonvoter}
		if suffrage == "v" {
			sv.Suffrage = raft.Voter
		}
		servers = append(servers, sv)
	}
	return servers
}

// A batch that reaches an owner whose lease ran out a second or more ago
// (it was paused, or cut off, and the batch waited in its socket) is
// answered UNAVAILABLE at once and spends nothing: its sender has answered
// it by the rule's failure mode already. One that reaches an owner whose
// lease lapsed only just waits for the next grant, as before.
func TestLongLapsedLeaseAnswersAtOnceWithoutSpending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, v := testOwner(t, 1, "a")
		a.EnableLease(true)
		a.SetLeaseUntil(time.Now().Add(time.Second))
		h, p := partOf(v, "a")
		c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1} // limit 2 a minute
		time.Sleep(time.Second + staleLease)                               // paused: the lease ran out a second ago
		start := time.Now()
		if r := handle(a, 1, c).Results[0]; r.Status != transport.StatusUnavailable || time.Since(start) != 0 {
			t.Fatalf("a batch %v after the lease ran out: %+v after %v, want UNAVAILABLE at once", staleLease, r, time.Since(start))
		}
		a.SetLeaseUntil(time.Now().Add(time.Second)) // the next grant
		for i := range 2 {
			if r := handle(a, 1, c).Results[0]; !r.Allowed {
				t.Fatalf("check %d after the next grant: %+v, want allowed (nothing spent while lapsed)", i+1, r)
			}
		}

		time.Sleep(time.Second + staleLease/2) // lapsed only just
		got := make(chan transport.Result, 1)
		go func() {
			got <- handle(a, 1, transport.Check{Rule: "r", KeyHash: h + 1, Partition: v.Ring.Partition(h + 1), Cost: 1}).Results[0]
		}()
		synctest.Wait()
		a.SetLeaseUntil(time.Now().Add(time.Second))
		if r := <-got; r.Status != transport.StatusOK {
			t.Fatalf("a batch %v after the lease ran out: %+v, want it to wait for the grant and be decided", staleLease/2, r)
		}

		// Long lapsed, but sent under a newer ring than the last grant's
		// (this member is back in it): it waits for the grant too.
		a.Publish(testView(t, 2, "a"))
		time.Sleep(time.Second + staleLease)
		go func() {
			got <- handle(a, 2, transport.Check{Rule: "r", KeyHash: h + 2, Partition: v.Ring.Partition(h + 2), Cost: 1}).Results[0]
		}()
		synctest.Wait()
		a.SetLeaseUntil(time.Now().Add(time.Second))
		if r := <-got; r.Status != transport.StatusOK {
			t.Fatalf("a batch of a newer ring than the last grant's, long after it ran out: %+v, want it to wait for the grant and be decided", r)
		}
	})
}
