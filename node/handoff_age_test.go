package node

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// clockOwner is an owner of 64 partitions on the bubble's clock.
func clockOwner(t *testing.T, id string) *Owner {
	t.Helper()
	o, err := NewOwner(id, 64, func() int64 { return time.Now().UnixNano() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// downUntil is a data plane that fails every push before until, and then
// delivers it as pushOwners does.
type downUntil struct {
	until time.Time
	to    pushOwners
	tries int
}

func (d *downUntil) Push(ctx context.Context, addr string, push *transport.Push, ack *transport.PushAck) error {
	d.tries++
	if time.Now().Before(d.until) {
		return errors.New("connection refused")
	}
	return d.to.Push(ctx, addr, push, ack)
}

// A hand-off that is retried arrives as old as its states are: a
// sliding_log key spent just before the ring change, whose hand-off gets
// through only once the spent entries have left the window, has its whole
// budget on the new owner. Sent as exported, the hand-off made the
// entries as young as at the export: the key was refused for another
// window.
func TestRetriedHandoffArrivesAsOldAsItIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []limiter.Rule{{Name: "r", Algorithm: limiter.SlidingLog, Limit: 2, Period: 5 * time.Second}}
		v1, v2 := view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1)
		a, b := clockOwner(t, "a"), clockOwner(t, "b")
		dp := &downUntil{until: time.Now().Add(5*time.Second + 100*time.Millisecond), to: pushOwners{"b:1": b}}
		n := handoffNode(t, a, dp)
		h, p := partOf(v2, "b")
		ck := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}

		applyRing(n, nil, v1)
		spendAt(t, a, ck, 2)
		b.Apply(v1, PlanMoves(nil, v1.Ring, "b", allAlive, false, false))
		b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", allAlive, false, false)) // p awaits a's hand-off
		n.h.send(2, applyRing(n, v1, v2))
		if err := n.h.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if dp.tries < 2 {
			t.Fatalf("the hand-off went out %d times, want retries", dp.tries)
		}
		if st := b.getState(p); st != partServing {
			t.Fatalf("partition %d on b: state %d, want serving", p, st)
		}
		for i := range 2 {
			if r := handle(b, 2, ck).Results[0]; r.Status != transport.StatusOK || !r.Allowed {
				t.Fatalf("check %d on b %v after the spends, once the hand-off got through: %+v, want allowed (the spends have left the 5s window)",
					i+1, time.Since(dp.until.Add(-5*time.Second-100*time.Millisecond)), r)
			}
		}
		if r := handle(b, 2, ck).Results[0]; r.Allowed {
			t.Fatalf("3rd check on b: %+v, want denied", r)
		}
	})
}

// A token bucket handed off late has refilled for as long as the
// hand-off waited, as it would have on its old owner.
func TestDelayedHandoffRefills(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []limiter.Rule{{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: 10 * time.Second}}
		v1, v2 := view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1)
		a, b := clockOwner(t, "a"), clockOwner(t, "b")
		n := handoffNode(t, a, pushOwners{"b:1": b})
		h, p := partOf(v2, "b")
		ck := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}

		applyRing(n, nil, v1)
		spendAt(t, a, ck, 10) // empty: a token a second
		b.Apply(v1, PlanMoves(nil, v1.Ring, "b", allAlive, false, false))
		b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", allAlive, false, false))
		out := applyRing(n, v1, v2)
		time.Sleep(4 * time.Second) // the hand-off waits (a slow ring change on a)
		n.h.send(2, out)
		if err := n.h.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		q := ck
		q.Cost = 0
		if r := handle(b, 2, q).Results[0]; r.Status != transport.StatusOK || r.Remaining != 4 {
			t.Fatalf("query on b 4s after the bucket was emptied: %+v, want 4 remaining", r)
		}
	})
}

// The owner side reads a push's ages from its arrival, not from after
// it waited for the push's ring epoch (up to epochWait): a hand-off that
// comes before its ring is no younger for the wait.
func TestHandoffWaitingForItsEpochIsNoYounger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []limiter.Rule{{Name: "r", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Second}}
		v1, v2 := view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1)
		a, b := clockOwner(t, "a"), clockOwner(t, "b")
		n := handoffNode(t, a, pushOwners{"b:1": b})
		h, p := partOf(v2, "b")
		ck := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}

		applyRing(n, nil, v1)
		spendAt(t, a, ck, 1) // leaves the window at 1s
		b.Apply(v1, PlanMoves(nil, v1.Ring, "b", allAlive, false, false))
		out := applyRing(n, v1, v2)
		time.Sleep(900 * time.Millisecond)
		// b applies epoch 2 150ms after the hand-off reaches it.
		time.AfterFunc(150*time.Millisecond, func() {
			b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", allAlive, false, false))
		})
		n.h.send(2, out)
		if err := n.h.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := handle(b, 2, ck).Results[0]; r.Status != transport.StatusOK || !r.Allowed {
			t.Fatalf("check on b 1.05s after the spend: %+v, want allowed", r)
		}
	})
}

// A hand-off taken back by its sender (its target went away before
// taking it) is taken as old as it is too. The partition then awaits the
// target's hand-back (TakeBack), which never comes here: it is served
// from the states taken back once the hand-off timeout is up, 3 s after
// the ring gave it back and 1.9 s before un-aged states would let go.
func TestHandoffTakenBackArrivesAsOldAsItIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []limiter.Rule{{Name: "r", Algorithm: limiter.SlidingLog, Limit: 2, Period: 5 * time.Second}}
		v1, v2, v3 := view.New(testRing(t, 1, "a"), 9, rule, 1), view.New(testRing(t, 2, "a", "b"), 9, rule, 1), view.New(testRing(t, 3, "a"), 9, rule, 1)
		a := clockOwner(t, "a")
		dp := &downUntil{until: time.Now().Add(time.Hour)} // b never answers
		n := handoffNode(t, a, dp)
		h, p := partOf(v2, "b")
		ck := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}

		applyRing(n, nil, v1)
		spendAt(t, a, ck, 2)
		n.h.send(2, applyRing(n, v1, v2))
		time.Sleep(5*time.Second + 100*time.Millisecond)
		applyRing(n, v2, v3) // b is gone: p is a's again, and awaits its hand-off
		if err := n.h.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(handoffTimeout)
		synctest.Wait()
		if st := a.getState(p); st != partServing {
			t.Fatalf("partition %d on a after the hand-off timeout: state %d, want serving (taken back)", p, st)
		}
		for i := range 2 {
			if r := handle(a, 3, ck).Results[0]; r.Status != transport.StatusOK || !r.Allowed {
				t.Fatalf("check %d on a once it took p back: %+v, want allowed (the spends have left the 5s window)", i+1, r)
			}
		}
	})
}
