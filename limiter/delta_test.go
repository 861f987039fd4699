package limiter

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
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
					stream, whole := owner.ExportChanges(nil, p, now, all, nil)
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
	full, whole := tb.ExportChanges(nil, 0, now, false, nil)
	if !whole {
		t.Fatal("1000 new states in an empty partition: want a whole export")
	}
	for i := range uint64(10) {
		tb.Check(0, mix64(i+1), r, now, 1)
		tb.Check(0, mix64(i+1), r, now, 1) // listed twice, exported once
	}
	tb.Check(0, mix64(5000), r, now, 0) // a query on a fresh key writes nothing
	delta, whole := tb.ExportChanges(nil, 0, now, false, nil)
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
	if again, whole := tb.ExportChanges(nil, 0, now, false, nil); whole || !bytes.Equal(again, mustTable(t, 1).Export(nil, 0, now)) {
		t.Errorf("a second export with nothing changed: whole %v, %d bytes", whole, len(again))
	}
	for i := range uint64(300) { // over a quarter of the states
		tb.Check(0, mix64(i+1), r, now, 1)
	}
	if _, whole := tb.ExportChanges(nil, 0, now, false, nil); !whole {
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

// refsFor is a SetRefs that knows the versions in known and records the
// ones sent in full.
type refsFor struct {
	known map[uint64]bool
	sent  []uint64
}

func (r *refsFor) Known(v uint64) bool { return r.known[v] }
func (r *refsFor) Sent(v uint64)       { r.sent = append(r.sent, v) }

// A set the importer holds is named by its version alone: a backup
// stream then costs the same whatever the number of rules (it carried
// every rule, per partition). A table that does not hold the set refuses
// the stream whole; a stream of format 3 must name a set by reference;
// Restamp keeps the reference.
func TestExportChangesNamesKnownSetsByReference(t *testing.T) {
	const version = 5
	rules := make([]Rule, 1000)
	for i := range rules {
		rules[i] = Rule{Name: fmt.Sprintf("tenant-%04d", i), Algorithm: TokenBucket, Limit: 10, Period: time.Hour}
	}
	now := int64(1 << 40)
	owner := mustTable(t, 1)
	owner.TrackChanges()
	if err := owner.SetRules(version, rules, now); err != nil {
		t.Fatal(err)
	}
	r := rules[len(rules)-1]
	r.Version = version
	spend := func() {
		for i := range uint64(10) {
			if _, err := owner.Check(0, mix64(i+1), &r, now, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	spend()
	refs := &refsFor{known: map[uint64]bool{}}
	full, _ := owner.ExportChanges(nil, 0, now, true, refs)
	if !slices.Equal(refs.sent, []uint64{version}) || full[len(streamMagic)] != streamVersion {
		t.Fatalf("first export: sent %v in full, format %d; want [%d], %d", refs.sent, full[len(streamMagic)], version, streamVersion)
	}
	backup := mustTable(t, 1)
	if _, err := backup.Import(0, full, now); err != nil {
		t.Fatal(err)
	}

	refs.known[version], refs.sent = true, nil
	spend()
	delta, whole := owner.ExportChanges(nil, 0, now, false, refs)
	if whole || len(refs.sent) != 0 || delta[len(streamMagic)] != streamRefVersion {
		t.Fatalf("second export: whole %v, sent %v in full, format %d; want a delta naming version %d by reference", whole, refs.sent, delta[len(streamMagic)], version)
	}
	if len(delta)*20 > len(full) {
		t.Errorf("the delta naming its set by reference is %d bytes, the export with 1000 rules %d", len(delta), len(full))
	}
	if _, err := backup.ImportChanges(0, delta, now); err != nil {
		t.Fatalf("import by a table that holds the set: %v", err)
	}
	if got, want := backup.Export(nil, 0, now), owner.Export(nil, 0, now); !bytes.Equal(got, want) {
		t.Errorf("the backup exports\n% x\nthe owner\n% x", got, want)
	}

	fresh := mustTable(t, 1)
	if n, err := fresh.ImportChanges(0, delta, now); !errors.Is(err, ErrUnknownSet) || n != 0 || fresh.Len() != 0 {
		t.Errorf("import by a table without the set: %d states, %v, %d held; want ErrUnknownSet and nothing", n, err, fresh.Len())
	}

	// Format 3 with every set in full is not canonical: the same stream
	// in format 2.
	head := len(streamMagic) + 1 + 1 + 1 // magic, format, partition 0, one set
	v3 := slices.Concat(full[:head], []byte{version, setInFull}, full[head+1:])
	v3[len(streamMagic)] = streamRefVersion
	if _, err := mustTable(t, 1).Import(0, v3, now); !errors.Is(err, ErrCorrupt) {
		t.Errorf("format 3 without a set by reference: %v, want ErrCorrupt", err)
	}

	re, err := owner.Restamp(nil, delta, now, now+int64(time.Second))
	if err != nil {
		t.Fatalf("Restamp: %v", err)
	}
	if re[len(streamMagic)] != streamRefVersion {
		t.Fatalf("restamped to format %d; want the reference kept", re[len(streamMagic)])
	}
	if _, err := backup.ImportChanges(0, re, now+int64(time.Second)); err != nil {
		t.Errorf("import of the restamped stream: %v", err)
	}
}

// A backup copy of a long sliding log (ExportChanges) holds at most
// maxCoarseLog entries and admits no more than the owner's log, at any
// later instant, while it forgets each admission at most a bin (span /
// maxCoarseLog ≤ period / maxCoarseLog) later than the owner does. (It
// carried every entry at every push: a 10,000-per-hour log was ~70 KB.)
func TestCoarseBackupLogAdmitsNoMoreAndLittleLonger(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := &Rule{Name: "log", Algorithm: SlidingLog,
			Limit:  rapid.Int64Range(2*maxCoarseLog, 2000).Draw(t, "limit"),
			Period: rapid.SampledFrom(tablePeriods[1:]).Draw(t, "period")}
		owner, backup := mustTable(t, 1), mustTable(t, 1)
		owner.TrackChanges()
		const h = 0x9e3779b97f4a7c15
		now := rapid.Int64Range(0, 1<<60).Draw(t, "start")
		// Checks over two or three periods, at or past the limit's rate:
		// the log fills its ring buffer, which then wraps.
		perPeriod := rapid.Int64Range(r.Limit, 3*r.Limit).Draw(t, "checks per period")
		step := int64(r.Period) / perPeriod
		weighted := rapid.Bool().Draw(t, "weighted")
		for range rapid.Int64Range(2*perPeriod, 3*perPeriod).Draw(t, "checks") {
			now += step/2 + rapid.Int64Range(0, step).Draw(t, "gap")
			cost := int64(1)
			if weighted {
				cost = rapid.Int64Range(1, min(3, r.Limit)).Draw(t, "cost")
			}
			if _, err := owner.Check(0, h, r, now, cost); err != nil {
				t.Fatal(err)
			}
		}
		stream, whole := owner.ExportChanges(nil, 0, now, rapid.Bool().Draw(t, "all"), nil)
		if whole {
			_, err := backup.Import(0, stream, now)
			if err != nil {
				t.Fatal(err)
			}
		} else if _, err := backup.ImportChanges(0, stream, now); err != nil {
			t.Fatal(err)
		}
		held, copied := owner.part(0).logs[slotKey(h)], backup.part(0).logs[slotKey(h)]
		if held == nil {
			return // every admission had expired
		}
		if copied == nil || copied.Len() > maxCoarseLog || (held.Len() <= maxCoarseLog && copied.Len() != held.Len()) {
			t.Fatalf("owner's log of %d entries, backup's %v", held.Len(), copied)
		}
		// Exported once at now: a query at a later instant expires what
		// the table holds, and a later probe may come earlier.
		exact, coarse := owner.Export(nil, 0, now), backup.Export(nil, 0, now)
		bin := int64(r.Period)/maxCoarseLog + 1
		const probes = 50 // evenly over the period, from a drawn offset
		off := rapid.Int64Range(0, int64(r.Period)/probes).Draw(t, "probe offset")
		for i := range int64(probes) {
			at := now + bin + off + i*int64(r.Period)/probes
			d, b := query(t, exact, now, h, r, at), query(t, coarse, now, h, r, at)
			if b.Remaining > d.Remaining || (b.Allowed && !d.Allowed) {
				t.Fatalf("at +%v the backup admits more: %+v, owner %+v", time.Duration(at-now), b, d)
			}
			if early := query(t, exact, now, h, r, at-bin); b.Remaining < early.Remaining {
				t.Fatalf("at +%v the backup holds admissions the owner forgot a bin (%v) earlier: %+v, owner then %+v", time.Duration(at-now), time.Duration(bin), b, early)
			}
		}
	})
}

// query is what a cost-0 check of key h under r at "at" answers on a
// table holding stream, exported at now.
func query(t *rapid.T, stream []byte, now int64, h uint64, r *Rule, at int64) Decision {
	c := mustTable(t, 1)
	if _, err := c.Import(0, stream, now); err != nil {
		t.Fatal(err)
	}
	d, err := c.Check(0, h, r, at, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
