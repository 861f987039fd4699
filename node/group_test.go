package node

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// A group of joined checks is decided as a unit: it passes and spends on
// all, or is denied and spends nothing; a refusal of one of its checks
// (unknown rule, cost, a partition not ours) is the answer of all and
// spends nothing; the checks around it are decided alone.
func TestHandleBatchGroups(t *testing.T) {
	o, err := NewOwner("a", 64, func() int64 { return 1e18 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := view.New(testRing(t, 5, "a", "b"), 9, []limiter.Rule{
		{Name: "r", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute},
		{Name: "big", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Minute},
	}, 1)
	o.Apply(v, PlanMoves(nil, v.Ring, "a", nil, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	mine, pm := partOf(v, "a")
	theirs, pt := partOf(v, "b")
	big := func(joined bool) transport.Check {
		return transport.Check{Rule: "big", KeyHash: mine, Partition: pm, Cost: 1, Joined: joined}
	}
	r := transport.Check{Rule: "r", KeyHash: mine, Partition: pm, Cost: 1, Joined: true}
	bigLeft := func() int64 {
		t.Helper()
		return handle(o, 5, transport.Check{Rule: "big", KeyHash: mine, Partition: pm}).Results[0].Remaining
	}
	type want struct {
		status  transport.Status
		allowed bool
	}
	for i, tt := range []struct {
		checks []transport.Check
		want   []want
		left   int64 // of big after the batch
	}{
		{[]transport.Check{big(false), r, big(false), r}, []want{{0, true}, {0, true}, {0, true}, {0, true}}, 8},
		{[]transport.Check{big(false), r}, []want{{0, false}, {0, false}}, 8}, // r is spent: nothing spent on big
		{[]transport.Check{big(false), {Rule: "nope", KeyHash: mine, Partition: pm, Cost: 1, Joined: true}, big(false)},
			[]want{{transport.StatusUnknownRule, false}, {transport.StatusUnknownRule, false}, {0, true}}, 7},
		{[]transport.Check{big(false), {Rule: "big", KeyHash: theirs, Partition: pt, Cost: 1, Joined: true}},
			[]want{{transport.StatusNotOwner, false}, {transport.StatusNotOwner, false}}, 7},
		{[]transport.Check{big(false), {Rule: "r", KeyHash: mine, Partition: pm, Cost: 3, Joined: true}},
			[]want{{transport.StatusBadRequest, false}, {transport.StatusBadRequest, false}}, 7},
		{[]transport.Check{big(false), big(true)}, // one bucket twice
			[]want{{transport.StatusBadRequest, false}, {transport.StatusBadRequest, false}}, 7},
	} {
		resp := handle(o, 5, tt.checks...)
		for k, w := range tt.want {
			if got := resp.Results[k]; got.Status != w.status || got.Allowed != w.allowed {
				t.Errorf("batch %d, check %d: %v allowed=%v, want %v allowed=%v", i, k, got.Status, got.Allowed, w.status, w.allowed)
			}
		}
		if got := bigLeft(); got != tt.left {
			t.Fatalf("batch %d: big has %d left, want %d", i, got, tt.left)
		}
	}
}
