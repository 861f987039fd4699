package node

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
)

// testNode is a Node without Raft: just enough to decide checks from a
// view set by hand.
func testNode(t *testing.T, epoch uint64, members ...string) (*Node, *View) {
	t.Helper()
	tab, err := limiter.NewTable(64)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: Config{ID: "a"}, viewNew: make(chan struct{}), now: func() int64 { return 1e18 }}
	n.table.Store(tab)
	v := testView(t, epoch, members...)
	n.view.Store(v)
	return n, v
}

func testView(t *testing.T, epoch uint64, members ...string) *View {
	t.Helper()
	var ms []ring.Member
	for _, id := range members {
		ms = append(ms, ring.Member{ID: id})
	}
	r, err := ring.New(ring.Config{Partitions: 64, ReplicationFactor: 32, Load: 1.25}, epoch, ms)
	if err != nil {
		t.Fatal(err)
	}
	rule := limiter.Rule{Name: "r", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}
	return &View{State: &fsm.State{}, Ring: r, Self: "a", Seed: 9,
		Rules: map[string]*limiter.Rule{"r": &rule}, salts: map[string]uint64{"r": 1}}
}

// partOf returns a key hash whose partition the view gives to owner.
func partOf(v *View, owner string) (uint64, uint32) {
	for h := uint64(1); ; h++ {
		p := v.Ring.Partition(h)
		if m, _ := v.Ring.Owner(p); m.ID == owner {
			return h, p
		}
	}
}

func handle(n *Node, epoch uint64, checks ...transport.Check) *transport.BatchResponse {
	resp := &transport.BatchResponse{Results: make([]transport.Result, len(checks))}
	n.HandleBatch(context.Background(), &transport.BatchRequest{Epoch: epoch, Checks: checks}, resp)
	return resp
}

func TestHandleBatchStatuses(t *testing.T) {
	n, v := testNode(t, 5, "a", "b")
	mine, pm := partOf(v, "a")
	theirs, pt := partOf(v, "b")
	resp := handle(n, 5,
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
	// A hash that does not belong to the partition it claims is refused.
	other, _ := partOf(v, "a")
	for {
		other++
		if p := v.Ring.Partition(other); p != pm {
			break
		}
	}
	if r := handle(n, 5, transport.Check{Rule: "r", KeyHash: other, Partition: pm, Cost: 1}).Results[0]; r.Status != transport.StatusBadRequest {
		t.Errorf("mismatched partition: %v, want BAD_REQUEST", r.Status)
	}
}

// A sender with a newer ring waits for ours to catch up instead of being
// answered from the stale one; if it never comes, the stale answer stands
// after epochWait.
func TestHandleBatchWaitsForNewerEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, old := testNode(t, 5, "b") // we own nothing at epoch 5
		next := testView(t, 6, "a")   // at epoch 6 we own everything
		h, p := partOf(next, "a")
		done := make(chan *transport.BatchResponse)
		go func() { done <- handle(n, 6, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}) }()
		synctest.Wait() // blocked waiting for epoch 6
		n.view.Store(next)
		n.viewMu.Lock()
		close(n.viewNew)
		n.viewNew = make(chan struct{})
		n.viewMu.Unlock()
		if r := <-done; r.Epoch != 6 || r.Results[0].Status != transport.StatusOK {
			t.Fatalf("after the new view: epoch %d %v, want 6 OK", r.Epoch, r.Results[0].Status)
		}

		n.view.Store(old)
		start := time.Now()
		r := handle(n, 7, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1})
		if waited := time.Since(start); waited != epochWait || r.Results[0].Status != transport.StatusNotOwner {
			t.Fatalf("no newer view: waited %v and answered %v, want %v and NOT_OWNER", waited, r.Results[0].Status, epochWait)
		}
	})
}
