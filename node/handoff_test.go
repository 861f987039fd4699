package node

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// pushOwners is a data plane that delivers pushes to the owners by their
// peer address (testRing's "<id>:1").
type pushOwners map[string]*Owner

func (d pushOwners) Push(ctx context.Context, addr string, push *transport.Push, ack *transport.PushAck) error {
	o, ok := d[addr]
	if !ok {
		return errors.New("no route to " + addr)
	}
	ack.Status = make([]transport.PushStatus, len(push.Parts))
	for i := range ack.Status {
		ack.Status[i] = transport.PushRejected // as transport's server does
	}
	o.HandlePush(ctx, push, ack)
	return nil
}

// handoffNode is the hand-off side of a Node without Raft: member id with
// owner o, pushing over dp. It must run in a synctest bubble; its loops
// end with the test.
func handoffNode(t *testing.T, o *Owner, dp DataPlane) *Node {
	t.Helper()
	n := &Node{cfg: Config{ID: o.self, DataPlane: dp}, log: slog.New(slog.DiscardHandler), m: newNodeMetrics()}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.h = newHandoffs(n)
	n.owner.Store(o)
	t.Cleanup(func() { n.cancel(); n.wg.Wait() })
	return n
}

// applyRing does what Node.refresh does with a new ring: apply the moves
// from prev (nil: none), start the hand-off timer and publish next. It
// returns the hand-offs, for the test to send (handoffs.send) when it
// means to.
func applyRing(n *Node, prev, next *view.View) []Outgoing {
	var m Moves
	if prev == nil {
		m = PlanMoves(nil, next.Ring, n.cfg.ID, allAlive, false, false)
	} else {
		m = PlanMoves(prev.Ring, next.Ring, n.cfg.ID, allAlive, false, false)
	}
	o := n.owner.Load()
	out := o.Apply(next, m)
	if awaiting := m.awaiting(); len(awaiting) > 0 {
		n.h.expireLater(next.Epoch(), awaiting)
	}
	n.cell.Store(next)
	return out
}

// A partition that awaits its hand-off again under a newer ring (it went
// away and came back, or this member rejoined) gets the newer ring's full
// handoffTimeout: the timer of the older ring, which began counting
// earlier, does not promote the backup copy when its own time is up. It
// did, and the partition was served from its stale copy for the rest of
// the newer ring's wait (over-admission until the hand-off was merged).
func TestHandoffTimeoutCountsFromTheLatestAwait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newOwner(t, "c")
		n := handoffNode(t, c, pushOwners{})
		v1, v2, v3, v4 := testView(t, 1, "a"), testView(t, 2, "a", "c"), testView(t, 3, "a"), testView(t, 4, "a", "c")
		_, p := partOf(v2, "c")
		applyRing(n, nil, v1)
		applyRing(n, v1, v2) // c joins: p awaits a's hand-off
		if c.getState(p) != partAwaiting {
			t.Fatalf("partition %d at epoch 2: state %d, want awaiting", p, c.getState(p))
		}
		time.Sleep(2 * time.Second)
		applyRing(n, v2, v3) // c is marked down, and back at once:
		applyRing(n, v3, v4) // p awaits a's hand-off afresh
		if c.getState(p) != partAwaiting {
			t.Fatalf("partition %d at epoch 4: state %d, want awaiting", p, c.getState(p))
		}

		time.Sleep(handoffTimeout - 2*time.Second) // epoch 2's timeout is up
		synctest.Wait()
		if st := c.getState(p); st != partAwaiting {
			t.Fatalf("partition %d promoted %v into epoch 4's wait of %v (state %d)", p, handoffTimeout-2*time.Second, handoffTimeout, st)
		}
		time.Sleep(2 * time.Second) // epoch 4's is
		synctest.Wait()
		if st := c.getState(p); st != partServing {
			t.Fatalf("partition %d not promoted when epoch 4's timeout was up (state %d)", p, st)
		}
	})
}

// A member that gives up a partition it never received (a Lost hand-off:
// it holds nothing of it) and gets it back before the hand-off is taken
// does not take its own Lost part back: that would promote the backup
// copy it awaits with at once (takeHandoff promotes on a Lost hand-off),
// instead of waiting for the hand-off of the member that holds the state.
func TestLostHandoffGivenBackDoesNotPromote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newOwner(t, "c")
		n := handoffNode(t, c, pushOwners{}) // a is out of reach for now
		v1, v2, v3, v4 := testView(t, 1, "a"), testView(t, 2, "a", "c"), testView(t, 3, "a"), testView(t, 4, "a", "c")
		_, p := partOf(v2, "c")
		applyRing(n, nil, v1)
		applyRing(n, v1, v2)        // c joins: p awaits a's hand-off
		out := applyRing(n, v2, v3) // c is marked down: p, never received, goes back Lost
		applyRing(n, v3, v4)        // and back: p awaits a's hand-off afresh
		n.h.send(3, out)
		if err := n.h.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := c.getState(p); st != partAwaiting {
			t.Fatalf("partition %d after c's own Lost hand-off came back: state %d, want awaiting a's", p, st)
		}
	})
}
