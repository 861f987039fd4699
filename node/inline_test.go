package node

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
)

// An owner decides under a rule carried inline, keeps its state across
// checks (and across a change of the rule's limit), and refuses an inline
// rule that is invalid or not named with the reserved prefix: the data
// plane is a trust boundary.
func TestInlineRules(t *testing.T) {
	o, v := testOwner(t, 1, "a")
	kh, p := partOf(v, "a")
	fw := func(limit int64) transport.InlineRule {
		return transport.InlineRule{Algorithm: uint8(limiter.FixedWindow), Limit: limit, Period: time.Minute}
	}
	chk := func(name string, in transport.InlineRule, cost uint64) transport.Check {
		return transport.Check{Rule: name, KeyHash: kh, Partition: p, Cost: cost, Inline: in}
	}
	for i, tt := range []struct {
		c       transport.Check
		status  transport.Status
		allowed bool
		remain  int64
	}{
		{chk("rls:d.k#0", fw(2), 1), transport.StatusOK, true, 1},
		{chk("rls:d.k#0", fw(2), 1), transport.StatusOK, true, 0},
		{chk("rls:d.k#0", fw(2), 1), transport.StatusOK, false, 0},
		{chk("rls:d.k#0", fw(3), 1), transport.StatusOK, true, 0},    // a raised limit keeps the count
		{chk("rls:d.k#1", fw(2), 1), transport.StatusOK, true, 1},    // another name: other buckets
		{chk("r", fw(100), 1), transport.StatusBadRequest, false, 0}, // a written rule's name: refused
		{chk("rls:bad", fw(0), 1), transport.StatusBadRequest, false, 0},
		{chk("rls:bad", transport.InlineRule{Algorithm: 99, Limit: 1, Period: time.Second}, 1), transport.StatusBadRequest, false, 0},
		{chk("rls:bad", transport.InlineRule{Algorithm: 1, FailureMode: 7, Limit: 1, Period: time.Second}, 1), transport.StatusBadRequest, false, 0},
		{chk("rls:d.k#2", fw(2), 3), transport.StatusBadRequest, false, 0}, // cost over the capacity
		{chk("r", transport.InlineRule{}, 1), transport.StatusOK, true, 1}, // no inline rule: the written one
	} {
		got := handle(o, 1, tt.c).Results[0]
		if got.Status != tt.status || got.Allowed != tt.allowed || (got.Status == transport.StatusOK && got.Remaining != tt.remain) {
			t.Errorf("check %d (%s %+v cost %d) = %v allowed %v remaining %d, want %v %v %d",
				i, tt.c.Rule, tt.c.Inline, tt.c.Cost, got.Status, got.Allowed, got.Remaining, tt.status, tt.allowed, tt.remain)
		}
	}
}

// An inline rule's buckets outlive the written rules' sets: they are
// checked as they are, under no set, so no later set retires them. Was:
// once the newest rules had been in force for their longest life (a
// rules write, a restart), every inline state was dropped as soon as it
// was written, and each Envoy descriptor was answered from a fresh
// bucket, allowed, for ever.
func TestInlineRulesOutliveRuleSets(t *testing.T) {
	now := int64(1e18)
	o, err := NewOwner("a", 64, func() int64 { return now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := testView(t, 1, "a")
	o.Apply(v, PlanMoves(nil, v.Ring, "a", nil, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	kh, p := partOf(v, "a")
	c := transport.Check{Rule: "rls:d.k#0", KeyHash: kh, Partition: p, Cost: 1,
		Inline: transport.InlineRule{Algorithm: uint8(limiter.TokenBucket), Limit: 2, Burst: 2, Period: time.Hour}}
	now += int64(time.Hour) // the written rules' sets have long been in force
	for i, want := range []bool{true, true, false} {
		if got := handle(o, 1, c).Results[0]; got.Status != transport.StatusOK || got.Allowed != want {
			t.Fatalf("check %d: %v allowed %v, want allowed %v", i, got.Status, got.Allowed, want)
		}
	}
	now += int64(time.Second)
	if got := handle(o, 1, c).Results[0]; got.Allowed {
		t.Errorf("a second later: allowed (remaining %d), want denied: the bucket was dropped", got.Remaining)
	}
}
