package node

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// deliver sends a's backup pushes to the member they are for and returns
// the parts sent and their statuses.
func deliver(t *testing.T, a *Owner, to map[string]*Owner) ([]transport.PushPart, []transport.PushStatus) {
	t.Helper()
	var parts []transport.PushPart
	var sts []transport.PushStatus
	for id, bb := range a.BackupPushes() {
		push := &transport.Push{Kind: transport.PushBackup, Epoch: bb.Epoch, From: a.self, Parts: bb.Parts}
		ack := transport.PushAck{Status: make([]transport.PushStatus, len(bb.Parts))}
		to[id].HandlePush(context.Background(), push, &ack)
		a.BackupAnswered(bb, &ack, nil)
		parts, sts = append(parts, bb.Parts...), append(sts, ack.Status...)
	}
	return parts, sts
}

// partBackedBy returns a key hash and partition that v gives to owner,
// with backup as its backup.
func partBackedBy(t *testing.T, v *view.View, owner, backup string) (uint64, uint32) {
	t.Helper()
	for h := uint64(1); h < 1<<20; h++ {
		p := v.Ring.Partition(h)
		o, _ := v.Ring.Owner(p)
		b, _ := v.Ring.Backup(p)
		if o.ID == owner && b.ID == backup {
			return h, p
		}
	}
	t.Fatalf("no partition of %s backed up by %s", owner, backup)
	return 0, 0
}

// Backups go whole first, then as deltas of the changed states; a backup
// promoted after its owner is gone holds every spend of both; a delta
// that reaches a member without a whole copy is refused, and the owner
// then sends the whole partition.
func TestBackupDeltas(t *testing.T) {
	a, b := newOwner(t, "a"), newOwner(t, "b")
	v1 := testView(t, 1, "a", "b")
	alive := func(string) bool { return true }
	a.Apply(v1, PlanMoves(nil, v1.Ring, "a", alive, false, false))
	b.Apply(v1, PlanMoves(nil, v1.Ring, "b", alive, false, false))
	a.ExpireAwaiting(a.AwaitingParts())
	b.ExpireAwaiting(b.AwaitingParts())
	owners := map[string]*Owner{"a": a, "b": b}

	h1, p := partBackedBy(t, v1, "a", "b")
	c1 := transport.Check{Rule: "r", KeyHash: h1, Partition: p, Cost: 2} // the whole limit of 2
	if r := handle(a, 1, c1).Results[0]; !r.Allowed {
		t.Fatalf("first spend: %+v", r)
	}
	parts, sts := deliver(t, a, owners)
	var sawP bool
	for i, pt := range parts {
		if pt.Delta {
			t.Fatalf("first round after a view: partition %d went as a delta", pt.Partition)
		}
		if sts[i] != transport.PushOK {
			t.Fatalf("partition %d: %v", pt.Partition, sts[i])
		}
		sawP = sawP || pt.Partition == p
	}
	if !sawP {
		t.Fatalf("partition %d not pushed", p)
	}

	// A second key of the same partition, then a delta carrying it alone.
	h2 := h1 + 1
	for v1.Ring.Partition(h2) != p {
		h2++
	}
	c2 := transport.Check{Rule: "r", KeyHash: h2, Partition: p, Cost: 1}
	if r := handle(a, 1, c2).Results[0]; !r.Allowed {
		t.Fatalf("second key: %+v", r)
	}
	parts, sts = deliver(t, a, owners)
	if len(parts) != 1 || parts[0].Partition != p || !parts[0].Delta || sts[0] != transport.PushOK {
		t.Fatalf("second round: parts %+v, statuses %v; want one delta of partition %d taken", parts, sts, p)
	}
	if n := b.BackupTable().PartitionLen(p); n != 2 {
		t.Fatalf("b's copy of %d holds %d states, want 2", p, n)
	}
	if parts, _ := deliver(t, a, owners); len(parts) != 0 {
		t.Fatalf("nothing changed, yet %d parts pushed", len(parts))
	}

	// a is gone: b promotes its copy and knows both spends.
	v2 := testView(t, 2, "b")
	b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", func(id string) bool { return id == "b" }, false, false))
	b.ExpireAwaiting(b.AwaitingParts())
	if r := handle(b, 2, c1).Results[0]; r.Status != transport.StatusOK || r.Allowed {
		t.Fatalf("key 1 at b after promotion: %+v, want denied (2 of 2 spent at a)", r)
	}
	c2.Cost = 2
	if r := handle(b, 2, c2).Results[0]; r.Status != transport.StatusOK || r.Allowed {
		t.Fatalf("key 2 at b after promotion: %+v, want a cost of 2 denied (1 of 2 spent at a)", r)
	}

	// A backup without a whole copy refuses a delta; the owner's next
	// push is whole and taken.
	c := newOwner(t, "c")
	v3 := testView(t, 3, "a", "c")
	a2 := newOwner(t, "a")
	a2.Apply(v3, PlanMoves(nil, v3.Ring, "a", alive, false, false))
	c.Apply(v3, PlanMoves(nil, v3.Ring, "c", alive, false, false))
	a2.ExpireAwaiting(a2.AwaitingParts())
	h3, p3 := partBackedBy(t, v3, "a", "c")
	delta := transport.PushPart{Partition: p3, Delta: true, Data: a2.Table().Export(nil, p3, 1e18)}
	ack := transport.PushAck{Status: make([]transport.PushStatus, 1)}
	c.HandlePush(context.Background(), &transport.Push{Kind: transport.PushBackup, Epoch: 3, From: "a", Parts: []transport.PushPart{delta}}, &ack)
	if ack.Status[0] != transport.PushRejected {
		t.Fatalf("delta without a whole copy: %v, want rejected", ack.Status[0])
	}
	a2.MarkDirty([]transport.PushPart{delta})
	handle(a2, 3, transport.Check{Rule: "r", KeyHash: h3, Partition: p3, Cost: 1})
	parts, sts = deliver(t, a2, map[string]*Owner{"c": c})
	for i, pt := range parts {
		if pt.Partition == p3 && (pt.Delta || sts[i] != transport.PushOK) {
			t.Fatalf("after a refused delta: %+v → %v, want whole and taken", pt, sts[i])
		}
	}
}

// An owner and its backup lost together: the survivor serves the
// partitions it held copies of from those copies (even empty ones) and
// the others from nothing, and counts only those as served from nothing
// (ringlimit_partitions_served_from_nothing_total; logged apart). Was:
// both counted as "serving the backup copies".
func TestServedFromNothingCountsPartitionsWithoutACopy(t *testing.T) {
	a, b, c := newOwner(t, "a"), newOwner(t, "b"), newOwner(t, "c")
	v1 := testView(t, 1, "a", "b", "c")
	alive := func(string) bool { return true }
	owners := map[string]*Owner{"a": a, "b": b, "c": c}
	for id, o := range owners {
		o.Apply(v1, PlanMoves(nil, v1.Ring, id, alive, false, false))
		o.ExpireAwaiting(o.AwaitingParts())
	}
	before := b.ServedFromNothing()
	deliver(t, a, owners)
	deliver(t, c, owners)
	want := 0 // b's gains whose backup was not b: their copies died with a and c
	for p := range uint32(v1.Ring.Config().Partitions) {
		o, _ := v1.Ring.Owner(p)
		bk, _ := v1.Ring.Backup(p)
		if o.ID != "b" && bk.ID != "b" {
			want++
		}
	}
	if want == 0 {
		t.Fatal("every partition of a and c backed up by b: nothing to test")
	}
	v2 := testView(t, 2, "b")
	b.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "b", func(id string) bool { return id == "b" }, false, false))
	promoted, bare, _ := b.expireAwaitingSince(2, b.AwaitingParts(), math.MaxInt64, false)
	if bare != want || promoted <= bare {
		t.Fatalf("promoted %d, of which %d from nothing; want %d from nothing and the rest from copies", promoted, bare, want)
	}
	if got := b.ServedFromNothing() - before; got != uint64(want) {
		t.Fatalf("ServedFromNothing counted %d, want %d", got, want)
	}
}

// Once a backup member has taken a rule set in full, pushes to it name
// the set by its version alone: a delta's size does not grow with the
// rules (it carried every rule, per partition, every round). A backup
// member that lost the set (restarted at the same address) refuses the
// next delta, and the push after that carries the set in full again.
func TestBackupPushesNameTakenSetsByReference(t *testing.T) {
	rules := tenantRules()
	v := view.New(testRing(t, 1, "a", "b"), 9, rules, 1)
	a, b := servingOwner(t, "a", v), servingOwner(t, "b", v)
	h, p := partBackedBy(t, v, "a", "b")
	spend := func() { handle(a, 1, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}) }
	push := func(to *Owner) (transport.PushPart, transport.PushStatus) {
		t.Helper()
		parts, sts := deliver(t, a, map[string]*Owner{"b": to})
		for i, pt := range parts {
			if pt.Partition == p {
				return pt, sts[i]
			}
		}
		t.Fatalf("partition %d not pushed", p)
		return transport.PushPart{}, 0
	}
	spend()
	first, st := push(b)
	if st != transport.PushOK || len(first.Data) < 10_000 {
		t.Fatalf("first push: %v, %d bytes; want taken, with the 1001 rules", st, len(first.Data))
	}
	spend()
	delta, st := push(b)
	if st != transport.PushOK || !delta.Delta || len(delta.Data) > 100 {
		t.Fatalf("second push: %v, delta %v, %d bytes; want a taken delta naming the set by reference", st, delta.Delta, len(delta.Data))
	}

	b2 := servingOwner(t, "b", v) // b again, at the same address, holding nothing
	spend()
	if _, st := push(b2); st != transport.PushRejected {
		t.Fatalf("a delta to a member holding nothing: %v, want rejected", st)
	}
	again, st := push(b2)
	if st != transport.PushOK || again.Delta || len(again.Data) < 10_000 {
		t.Fatalf("after the refusal: %v, delta %v, %d bytes; want the whole partition with its rules, taken", st, again.Delta, len(again.Data))
	}
	if n := b2.BackupTable().PartitionLen(p); n != 1 {
		t.Fatalf("b's new copy of %d holds %d states, want 1", p, n)
	}
}

// Within one push, a rule set goes in full in the first stream that
// needs it and by reference in the others; the backup member registers
// the sets of a part it does not take as a backup copy (here one it owns
// and serves, which it merges into what it serves: Owner.takeCopy), so
// the later parts find them.
func TestBackupPushCarriesASetInFullOnce(t *testing.T) {
	rules := tenantRules()
	v := view.New(testRing(t, 1, "a", "b"), 9, rules, 1)
	a, b := servingOwner(t, "a", v), servingOwner(t, "b", v)
	// Two partitions a owns and b backs up, a key spent in each.
	h1, p1 := partBackedBy(t, v, "a", "b")
	h2 := h1 + 1
	var p2 uint32
	for ; ; h2++ {
		p2 = v.Ring.Partition(h2)
		if o, _ := v.Ring.Owner(p2); p2 != p1 && o.ID == "a" {
			break
		}
	}
	handle(a, 1, transport.Check{Rule: "r", KeyHash: h1, Partition: p1, Cost: 1}, transport.Check{Rule: "r", KeyHash: h2, Partition: p2, Cost: 1})
	parts, sts := deliver(t, a, map[string]*Owner{"b": b})
	full := 0
	for i, pt := range parts {
		if sts[i] != transport.PushOK {
			t.Fatalf("partition %d: %v, want taken", pt.Partition, sts[i])
		}
		if len(pt.Data) > 10_000 {
			full++
		}
	}
	if full != 1 || b.BackupTable().PartitionLen(p1) != 1 || b.BackupTable().PartitionLen(p2) != 1 {
		t.Fatalf("%d streams carried the 1001 rules, want 1; b holds %d and %d states, want 1 and 1",
			full, b.BackupTable().PartitionLen(p1), b.BackupTable().PartitionLen(p2))
	}

	// The stream carrying the set in full is of a part the member does
	// not take as a backup copy: the next part, naming the set by
	// reference, is taken.
	c := servingOwner(t, "b", v) // b again, holding nothing
	_, notMine := partOf(v, "b") // b owns it: b is not its backup
	src, _ := limiter.NewTable(64)
	now := int64(1e18)
	if err := src.SetRules(1, rules, now); err != nil {
		t.Fatal(err)
	}
	r := rules[0]
	r.Version = 1
	for _, pc := range []struct {
		p uint32
		h uint64
	}{{notMine, 1}, {p1, h1}} {
		for h := pc.h; ; h++ {
			if v.Ring.Partition(h) == pc.p {
				if _, err := src.Check(pc.p, h, &r, now, 1); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
	}
	refs := &roundRefs{of: &setRefs{known: map[uint64]bool{}}, known: map[uint64]bool{}}
	first, _ := src.ExportChanges(nil, notMine, now, true, refs)
	second, _ := src.ExportChanges(nil, p1, now, true, refs)
	push := &transport.Push{Kind: transport.PushBackup, Epoch: 1, From: "a", Parts: []transport.PushPart{
		{Partition: notMine, Data: first}, {Partition: p1, Data: second}}}
	ack := transport.PushAck{Status: make([]transport.PushStatus, 2)}
	c.HandlePush(context.Background(), push, &ack)
	if ack.Status[0] != transport.PushOK || ack.Status[1] != transport.PushOK || len(second) > 100 {
		t.Fatalf("statuses %v (want merged, taken), the second stream %d bytes (want its set by reference)", ack.Status, len(second))
	}
	if c.BackupTable().PartitionLen(notMine) != 0 || c.Table().PartitionLen(notMine) != 1 {
		t.Fatalf("the owned part went to the backup table (%d states) and the served one holds %d, want 0 and 1",
			c.BackupTable().PartitionLen(notMine), c.Table().PartitionLen(notMine))
	}
}

// tenantRules is rule "r" (a fixed window of 100 a minute) and 1,000
// token-bucket rules beside it: a set whose stream is some 20 KB.
func tenantRules() []limiter.Rule {
	rules := []limiter.Rule{{Name: "r", Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Minute}}
	for i := range 1000 {
		rules = append(rules, limiter.Rule{Name: fmt.Sprintf("tenant-%04d", i), Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Hour})
	}
	return rules
}

// servingOwner returns a new owner id that has applied v as the first
// view it knows and serves every partition v gives it, from empty.
func servingOwner(t *testing.T, id string, v *view.View) *Owner {
	t.Helper()
	o := newOwner(t, id)
	o.Apply(v, PlanMoves(nil, v.Ring, id, func(string) bool { return true }, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	return o
}

// After a ring change an owner pushes whole only the partitions whose
// backup changed; one whose backup stayed gets its changes as a delta,
// taken there. Was: every owned partition went whole after any change,
// so a join made each owner's first round its whole table (seconds at
// millions of keys on a starved machine), and the partitions whose
// backup moved to the joiner waited that long for a copy.
func TestRingChangePushesWholeOnlyWhereTheBackupChanged(t *testing.T) {
	v1, v2 := testView(t, 1, "a", "b", "c"), testView(t, 2, "a", "b", "c", "d")
	owners := map[string]*Owner{}
	for _, id := range []string{"a", "b", "c"} {
		owners[id] = servingOwner(t, id, v1)
	}
	owners["d"] = newOwner(t, "d")
	var kept, moved []transport.Check
	for h := uint64(1); h < 1<<16 && (len(kept) == 0 || len(moved) == 0); h++ {
		p := v1.Ring.Partition(h)
		o1, _ := v1.Ring.Owner(p)
		o2, _ := v2.Ring.Owner(p)
		if o1.ID != "a" || o2.ID != "a" {
			continue
		}
		c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1}
		if sameBackup(v1.Ring, v2.Ring, p) {
			kept = append(kept, c)
		} else if b, _ := v2.Ring.Backup(p); b.ID == "d" {
			moved = append(moved, c)
		}
	}
	if len(kept) == 0 || len(moved) == 0 {
		t.Fatalf("partitions a keeps: %d with the same backup, %d with d for backup; want some of each", len(kept), len(moved))
	}
	spend := []transport.Check{kept[0], moved[0]}
	handle(owners["a"], 1, spend...)
	deliver(t, owners["a"], owners) // whole: the first round after a view
	for id, o := range owners {
		o.Apply(v2, PlanMoves(v1.Ring, v2.Ring, id, allAlive, false, false))
	}
	owners["d"].ExpireAwaiting(owners["d"].AwaitingParts())
	handle(owners["a"], 2, spend...)
	parts, sts := deliver(t, owners["a"], owners)
	for i, pt := range parts {
		if sts[i] != transport.PushOK {
			t.Errorf("partition %d (delta %v): %v, want taken", pt.Partition, pt.Delta, sts[i])
		}
		switch b, _ := v2.Ring.Backup(pt.Partition); {
		case sameBackup(v1.Ring, v2.Ring, pt.Partition) && !pt.Delta:
			t.Errorf("partition %d, its backup %s unchanged, pushed whole", pt.Partition, b.ID)
		case !sameBackup(v1.Ring, v2.Ring, pt.Partition) && pt.Delta:
			t.Errorf("partition %d, its backup now %s, pushed as a delta", pt.Partition, b.ID)
		}
	}
	if n := owners["b"].BackupTable().PartitionLen(kept[0].Partition) + owners["c"].BackupTable().PartitionLen(kept[0].Partition); n != 1 {
		t.Errorf("the unchanged backup's copy of partition %d holds %d states, want 1", kept[0].Partition, n)
	}
	if n := owners["d"].BackupTable().PartitionLen(moved[0].Partition); n != 1 {
		t.Errorf("d's copy of partition %d holds %d states, want 1", moved[0].Partition, n)
	}
}
