package limiter

import (
	"bytes"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A backup fed only ExportChanges streams (ImportChanges, or Import after
// a whole one) decides, after every push, every key exactly as the owner
// would. (Its states may differ in one way: a check that turns a live
// state idle drops it on the owner, and the backup keeps the older state,
// which decides like a fresh key from then on as well.)
func TestExportChangesKeepsBackupEqual(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := rapid.IntRange(1, 3).Draw(t, "partitions")
		owner, backup := mustTable(t, parts), mustTable(t, parts)
		owner.TrackChanges()
		keys := drawKeys(t, parts, allAlgorithms, drawSize(t, "max keys", 10, 100, 600))
		now := rapid.Int64Range(0, 1<<60).Draw(t, "start")
		for i := range drawSize(t, "ops", 50, 300, 1000) {
			now += drawGap(t)
			switch rapid.IntRange(0, 40).Draw(t, "op") {
			case 0:
				owner.Sweep(uint32(rapid.IntRange(0, parts-1).Draw(t, "sweep part")), now)
			case 1, 2: // a backup round
				all := rapid.IntRange(0, 9).Draw(t, "all?") == 0
				for p := range uint32(parts) {
					stream, whole := owner.ExportChanges(nil, p, now, all)
					var err error
					if whole {
						backup.Drop(p)
						_, err = backup.Import(p, stream, now)
					} else {
						_, err = backup.ImportChanges(p, stream, now)
					}
					if err != nil {
						t.Fatalf("op %d: import: %v", i, err)
					}
				}
				sameDecisions(t, i, owner, backup, keys.keys, now+drawGap(t))
			default:
				k := keys.draw(t)
				cost := rapid.Int64Range(0, k.r.Capacity()).Draw(t, "cost")
				if _, err := owner.Check(k.part, k.h, k.r, now, cost); err != nil {
					t.Fatalf("op %d: Check: %v", i, err)
				}
			}
		}
	})
}

// A few changed states in a big partition export as a few records; past
// the bound, the partition goes whole.
func TestExportChangesSize(t *testing.T) {
	tb := mustTable(t, 1)
	tb.TrackChanges()
	r := &Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Hour}
	now := int64(1 << 40)
	for i := range uint64(1000) {
		if _, err := tb.Check(0, mix64(i+1), r, now, 1); err != nil {
			t.Fatal(err)
		}
	}
	full, whole := tb.ExportChanges(nil, 0, now, false)
	if !whole {
		t.Fatal("1000 new states in an empty partition: want a whole export")
	}
	for i := range uint64(10) {
		tb.Check(0, mix64(i+1), r, now, 1)
		tb.Check(0, mix64(i+1), r, now, 1) // listed twice, exported once
	}
	tb.Check(0, mix64(5000), r, now, 0) // a query on a fresh key writes nothing
	delta, whole := tb.ExportChanges(nil, 0, now, false)
	if whole {
		t.Fatal("10 changed states of 1000: want a delta")
	}
	if len(delta)*50 > len(full) {
		t.Errorf("delta of 10 states is %d bytes, whole partition of 1000 is %d", len(delta), len(full))
	}
	probe := mustTable(t, 1)
	if n, err := probe.ImportChanges(0, delta, now); err != nil || n != 10 {
		t.Fatalf("delta holds %d states (err %v), want 10", n, err)
	}
	if again, whole := tb.ExportChanges(nil, 0, now, false); whole || !bytes.Equal(again, mustTable(t, 1).Export(nil, 0, now)) {
		t.Errorf("a second export with nothing changed: whole %v, %d bytes", whole, len(again))
	}
	for i := range uint64(300) { // over a quarter of the states
		tb.Check(0, mix64(i+1), r, now, 1)
	}
	if _, whole := tb.ExportChanges(nil, 0, now, false); !whole {
		t.Error("300 changed states of 1000: want a whole export")
	}
}

// sameDecisions fails unless copies of a and b answer a query on every
// key at now alike.
func sameDecisions(t *rapid.T, op int, a, b *Table, keys []tableKey, now int64) {
	ca, cb := mustTable(t, a.Partitions()), mustTable(t, b.Partitions())
	for p := range uint32(a.Partitions()) {
		if _, err := ca.Import(p, a.Export(nil, p, now), now); err != nil {
			t.Fatal(err)
		}
		if _, err := cb.Import(p, b.Export(nil, p, now), now); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		da, _ := ca.Check(k.part, k.h, k.r, now, 0)
		db, _ := cb.Check(k.part, k.h, k.r, now, 0)
		if da != db {
			t.Fatalf("op %d: %v key %#x at %d: backup decides %+v, owner %+v", op, k.r.Algorithm, k.h, now, db, da)
		}
	}
}
