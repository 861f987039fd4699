package limiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// testRec is one record of a hand-built stream: a key (a slot key >> 8),
// a kind, the payload's uvarints, and the number of its set (0: none).
type testRec struct {
	h    uint64
	kind byte
	vals []uint64
	set  uint64
}

// testSet is one rule set of a hand-built stream.
type testSet struct {
	version, age uint64
	rules        []Rule
}

// buildStream encodes records of the unversioned set the way Export does,
// without its checks.
func buildStream(part uint64, recs ...testRec) []byte { return buildStreamSets(part, nil, recs...) }

// buildStreamSets encodes sets and records the way Export does, without
// its checks.
func buildStreamSets(part uint64, sets []testSet, recs ...testRec) []byte {
	b := append([]byte(streamMagic), streamVersion)
	b = binary.AppendUvarint(b, part)
	b = binary.AppendUvarint(b, uint64(len(sets)))
	for _, st := range sets {
		b = binary.AppendUvarint(b, st.version)
		b = binary.AppendUvarint(b, st.age)
		b = binary.AppendUvarint(b, uint64(len(st.rules)))
		for _, r := range st.rules {
			b = binary.AppendUvarint(b, uint64(len(r.Name)))
			b = append(b, r.Name...)
			b = append(b, byte(r.Algorithm))
			b = binary.AppendUvarint(b, uint64(r.Limit))
			b = binary.AppendUvarint(b, uint64(r.Period))
			b = binary.AppendUvarint(b, uint64(r.Burst))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(recs)))
	for _, r := range recs {
		b = binary.LittleEndian.AppendUint64(b, r.h)[:len(b)+keyBytes]
		b = append(b, r.kind)
		b = binary.AppendUvarint(b, r.set)
		for _, v := range r.vals {
			b = binary.AppendUvarint(b, v)
		}
	}
	return b
}

func TestExportFormat(t *testing.T) {
	const now = int64(1 << 40)
	tb := mustTable(t, 4)
	tbr := &Rule{Name: "t", Algorithm: TokenBucket, Limit: 10, Period: time.Second} // 100ms a token
	fw := &Rule{Name: "f", Algorithm: FixedWindow, Limit: 10, Period: time.Second}
	sl := &Rule{Name: "s", Algorithm: SlidingLog, Limit: 10, Period: time.Second}
	for _, c := range []struct {
		h    uint64
		r    *Rule
		cost int64
	}{{0x020100, tbr, 3}, {0, tbr, 1}, {0x020100, fw, 4}, {0x020100, sl, 2}} {
		if _, err := tb.Check(2, c.h, c.r, now, c.cost); err != nil {
			t.Fatal(err)
		}
	}
	sl2 := *sl
	if _, err := tb.Check(2, 0x020100, &sl2, now+int64(time.Millisecond), 1); err != nil {
		t.Fatal(err)
	}
	const ms = uint64(time.Millisecond)
	// A window's DeadAt is its end plus a quarter period plus half the
	// offset of its latest admission from its start (packDeadAt), for an
	// admission at now: now − off + 1s + 250ms + ⌈off/2⌉, off being
	// now's offset in its second.
	off := uint64(now % int64(time.Second))
	win := 1000*ms - off + 250*ms + (off+1)/2
	want := buildStream(2,
		testRec{0, kindTAT, []uint64{100 * ms}, 0},
		testRec{0x0201, kindTAT, []uint64{300 * ms}, 0},
		testRec{0x0201, kindWindow, []uint64{win, 4}, 0},
		testRec{0x0201, kindLog, []uint64{2, 1000 * ms, 2, 1001 * ms, 1}, 0},
	)
	got := tb.Export([]byte("prefix"), 2, now)
	if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[6:], want) {
		t.Fatalf("Export =\n% x\nwant\n% x", got[6:], want)
	}
	if !bytes.Equal(want[:7], []byte{'R', 'L', 'P', '1', 2, 2, 0}) {
		t.Fatalf("header % x", want[:6])
	}
	// 350ms later the token buckets are full again, and their records gone.
	later := tb.Export(nil, 2, now+int64(350*time.Millisecond))
	if n, err := mustTable(t, 4).Import(2, later, 0); err != nil || n != 2 {
		t.Fatalf("Import of the later export: %d records, %v; want 2", n, err)
	}
	empty := tb.Export(nil, 1, now)
	if !bytes.Equal(empty, []byte{'R', 'L', 'P', '1', 2, 1, 0, 0}) {
		t.Fatalf("empty partition exports as % x", empty)
	}
}

// Export at now1, Import at now2: every later decision at now2+δ is the one
// the exporter would have made at now1+δ.
func TestExportImportPreservesDecisions(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := rapid.IntRange(1, 3).Draw(t, "partitions")
		// Windows are aligned on each node's clock: with an offset that
		// is not a multiple of the period, a window turns at a different
		// instant on the importer, so only the other algorithms compare.
		offset := int64(5 * time.Hour)
		algos := allAlgorithms
		if rapid.Bool().Draw(t, "unaligned") {
			offset += rapid.Int64Range(1, int64(time.Hour)).Draw(t, "skew")
			algos = []Algorithm{TokenBucket, GCRA, LeakyBucket, SlidingLog}
		}
		keys := drawKeys(t, parts, algos, drawSize(t, "max keys", 10, 60, 300))
		a, b := mustTable(t, parts), mustTable(t, parts)
		now := rapid.Int64Range(0, 1<<60).Draw(t, "now1")
		run := func(label string, ops int, also *Table) {
			for i := range ops {
				now += drawGap(t)
				k := keys.draw(t)
				cost := rapid.Int64Range(0, k.r.Capacity()).Draw(t, "cost")
				da, err := a.Check(k.part, k.h, k.r, now, cost)
				if err != nil {
					t.Fatal(err)
				}
				if also == nil {
					continue
				}
				db, err := also.Check(k.part, k.h, k.r, now+offset, cost)
				if err != nil {
					t.Fatal(err)
				}
				if da != db {
					t.Fatalf("%s op %d: %v key %#x cost %d: exporter %+v, importer %+v", label, i, k.r.Algorithm, k.h, cost, da, db)
				}
			}
		}
		run("before", drawSize(t, "ops before", 0, 100, 1000), nil)
		total := 0
		for p := range uint32(parts) {
			s := a.Export(nil, p, now)
			n, err := b.Import(p, s, now+offset)
			if err != nil {
				t.Fatalf("Import of partition %d: %v", p, err)
			}
			total += n
			if again := b.Export(nil, p, now+offset); !bytes.Equal(again, s) {
				t.Fatalf("partition %d re-exports differently:\n% x\n% x", p, s, again)
			}
		}
		if b.Len() != total {
			t.Fatalf("imported %d records, table holds %d", total, b.Len())
		}
		run("after", drawSize(t, "ops after", 1, 100, 1000), b)
		checkInvariants(t, b)
	})
}

// Importing over states already held keeps, per bucket, what admits less.
func TestImportMerges(t *testing.T) {
	const now = int64(1 << 50)
	tests := []struct {
		name      string
		kind      byte
		held, imp []uint64 // payloads relative to now; nil: none held
		want      []uint64
	}{
		{"tat later held", kindTAT, []uint64{9}, []uint64{5}, []uint64{9}},
		{"tat later imported", kindTAT, []uint64{5}, []uint64{9}, []uint64{9}},
		{"tat none held", kindTAT, nil, []uint64{5}, []uint64{5}},
		{"window later held", kindWindow, []uint64{9, 1}, []uint64{5, 7}, []uint64{9, 7}},
		{"window later imported", kindWindow, []uint64{5, 7}, []uint64{9, 1}, []uint64{9, 7}},
		{"window same end", kindWindow, []uint64{9, 3<<32 | 1}, []uint64{9, 1<<32 | 2}, []uint64{9, 3<<32 | 2}},
		{"window counts of both", kindWindow, []uint64{9, 1<<32 | 1}, []uint64{5, 7}, []uint64{9, 1<<32 | 7}},
		// Logs: n, then (expiry, cost) per entry. The merged log holds, at
		// every instant, the cost of the heavier of the two.
		{"log held covers imported", kindLog, []uint64{2, 5, 1, 6, 1}, []uint64{1, 3, 1}, []uint64{2, 5, 1, 6, 1}},
		{"log imported covers held", kindLog, []uint64{1, 3, 1}, []uint64{2, 5, 1, 6, 1}, []uint64{2, 5, 1, 6, 1}},
		{"log newest of each", kindLog, []uint64{2, 1, 1, 2, 1}, []uint64{1, 3, 1}, []uint64{2, 1, 1, 3, 1}},
		{"log unit step of neither", kindLog, []uint64{3, 5, 1, 5, 1, 5, 1}, []uint64{2, 3, 1, 6, 1}, []uint64{3, 5, 1, 5, 1, 6, 1}},
		{"log weighted step of neither", kindLog, []uint64{1, 5, 3}, []uint64{2, 2, 1, 8, 2}, []uint64{2, 5, 1, 8, 2}},
		{"log same expiry, heavier imported", kindLog, []uint64{2, 4, 1, 4, 2}, []uint64{2, 4, 2, 4, 2}, []uint64{2, 4, 2, 4, 2}},
		{"log itself", kindLog, []uint64{3, 2, 2, 2, 1, 7, 3}, []uint64{3, 2, 2, 2, 1, 7, 3}, []uint64{3, 2, 2, 2, 1, 7, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := mustTable(t, 1)
			if tt.held != nil {
				if _, err := tb.Import(0, buildStream(0, testRec{42, tt.kind, tt.held, 0}), now); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tb.Import(0, buildStream(0, testRec{42, tt.kind, tt.imp, 0}), now); err != nil {
				t.Fatal(err)
			}
			want := buildStream(0, testRec{42, tt.kind, tt.want, 0})
			if got := tb.Export(nil, 0, now); !bytes.Equal(got, want) {
				t.Fatalf("after merge: % x, want % x", got, want)
			}
		})
	}
	// The merged state decides: a bucket emptied on the importer stays empty.
	r := &Rule{Name: "m", Algorithm: GCRA, Limit: 2, Period: time.Second}
	a, b := mustTable(t, 1), mustTable(t, 1)
	a.Check(0, 7, r, now, 1)
	b.Check(0, 7, r, now, 2)
	if _, err := b.Import(0, a.Export(nil, 0, now), now); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Check(0, 7, r, now, 1); d.Allowed {
		t.Fatalf("after importing a fuller bucket: %+v, want denied", d)
	}
}

// A log held expires at the importer's now before it merges: what left
// its window is not carried into the merged log.
func TestImportMergesLiveEntries(t *testing.T) {
	const now = int64(1 << 50)
	tb := mustTable(t, 1)
	if _, err := tb.Import(0, buildStream(0, testRec{42, kindLog, []uint64{3, 1, 1, 2, 1, 9, 1}, 0}), now); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Import(0, buildStream(0, testRec{42, kindLog, []uint64{1, 5, 1}, 0}), now+2); err != nil {
		t.Fatal(err)
	}
	want := buildStream(0, testRec{42, kindLog, []uint64{1, 7, 1}, 0})
	if got := tb.Export(nil, 0, now+2); !bytes.Equal(got, want) {
		t.Fatalf("after merge: % x, want % x", got, want)
	}
	if l := tb.parts[0].logs[slotKey(42<<8)]; l.Len() != 1 || l.sum != 1 {
		t.Fatalf("merged log holds %d entries of cost %d, want 1 of 1", l.Len(), l.sum)
	}
}

// Logs of different rule sets do not merge: the newer set's stays.
func TestImportLogOfAnotherSet(t *testing.T) {
	const now = int64(1 << 50)
	rule := []Rule{{Name: "s", Algorithm: SlidingLog, Limit: 9, Period: time.Hour}}
	older := []testSet{{3, 0, rule}}
	newer := []testSet{{5, 0, rule}}
	heavy := []uint64{2, 5, 4, 6, 4}
	light := []uint64{1, 9, 1}
	for _, tt := range []struct {
		name       string
		held, imp  []testSet
		hv, iv     []uint64
		want       []testSet
		wantValues []uint64
	}{
		{"newer imported", older, newer, heavy, light, newer, light},
		{"newer held", newer, older, light, heavy, newer, light},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tb := mustTable(t, 1)
			if _, err := tb.Import(0, buildStreamSets(0, tt.held, testRec{42, kindLog, tt.hv, 1}), now); err != nil {
				t.Fatal(err)
			}
			if _, err := tb.Import(0, buildStreamSets(0, tt.imp, testRec{42, kindLog, tt.iv, 1}), now); err != nil {
				t.Fatal(err)
			}
			want := buildStreamSets(0, tt.want, testRec{42, kindLog, tt.wantValues, 1})
			if got := tb.Export(nil, 0, now); !bytes.Equal(got, want) {
				t.Fatalf("after import: % x, want % x", got, want)
			}
		})
	}
}

// drawLog runs up to 40 checks of sliding_log rule r on l, from now on,
// a quarter Period apart at most, of random cost when weighted (1 else),
// and returns the instant of the last. Entries leave the window on the
// way, so l's ring buffer wraps.
func drawLog(t *rapid.T, label string, l *Log, r *Rule, now int64, weighted bool) int64 {
	for range rapid.IntRange(0, 40).Draw(t, label+" checks") {
		now += rapid.Int64Range(0, int64(r.Period)/4).Draw(t, label+" gap")
		cost := int64(1)
		if weighted {
			cost = rapid.Int64Range(1, r.Limit).Draw(t, label+" cost")
		}
		l.Step(r, now, cost)
	}
	return now
}

// entries returns l's entries, oldest first.
func entries(l *Log) []logEntry {
	es := make([]logEntry, l.Len())
	for i := range es {
		es[i] = l.at(i)
	}
	return es
}

// weightAfter is the naive C(t): the cost of the entries still in the
// window at t, those that expire after it.
func weightAfter(es []logEntry, t int64) int64 {
	c := int64(0)
	for _, e := range es {
		if e.exp > t {
			c += e.cost
		}
	}
	return c
}

// checkLog fails unless l keeps the invariants a Log relies on: expiries
// in order, every cost ≥ 1, sum their total and at most limit, costs
// kept only when one is not 1.
func checkLog(t failer, l *Log, limit int64) {
	t.Helper()
	es, sum, unit := entries(l), int64(0), true
	for i, e := range es {
		if e.cost < 1 || i > 0 && e.exp < es[i-1].exp {
			t.Fatalf("entry %d of %v out of order or free", i, es)
		}
		sum += e.cost
		unit = unit && e.cost == 1
	}
	if sum != int64(l.sum) || sum > limit {
		t.Fatalf("entries %v cost %d, sum says %d, limit %d", es, sum, l.sum, limit)
	}
	if unit && l.costs != nil {
		t.Fatalf("unit entries %v keep a costs array", es)
	}
}

// The merged log holds, at every instant, exactly the heavier of the two:
// never admits more than either (≥), nor needlessly less (=).
func TestMergeLogsIsTheUpperEnvelope(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := &Rule{Name: "sl", Algorithm: SlidingLog, Limit: rapid.Int64Range(1, 30).Draw(t, "limit"), Period: 1000}
		a, b := new(Log), new(Log)
		drawLog(t, "a", a, r, 0, rapid.Bool().Draw(t, "a weighted"))
		drawLog(t, "b", b, r, rapid.Int64Range(0, 3000).Draw(t, "b start"), rapid.Bool().Draw(t, "b weighted"))
		ea, eb := entries(a), entries(b)
		m := mergeLogs(a, b)
		em := entries(m)
		checkLog(t, m, r.Limit)
		probes := []int64{math.MinInt64}
		for _, e := range slices.Concat(ea, eb) {
			probes = append(probes, e.exp-1, e.exp)
		}
		for _, at := range probes {
			want := max(weightAfter(ea, at), weightAfter(eb, at))
			if got := weightAfter(em, at); got != want {
				t.Fatalf("C(%d) = %d, want max(C_a, C_b) = %d\na %v\nb %v\nmerged %v", at, got, want, ea, eb, em)
			}
		}
		if a.costs == nil && b.costs == nil {
			// Unit costs: the element-wise max of the newest-first expiries.
			var want []int64
			for i := 1; i <= max(len(ea), len(eb)); i++ {
				e := int64(math.MinInt64)
				if i <= len(ea) {
					e = ea[len(ea)-i].exp
				}
				if i <= len(eb) {
					e = max(e, eb[len(eb)-i].exp)
				}
				want = append(want, e)
			}
			slices.Reverse(want)
			got := make([]int64, len(em))
			for i, e := range em {
				got[i] = e.exp
			}
			if !slices.Equal(got, want) {
				t.Fatalf("unit merge %v, want %v", got, want)
			}
		}
		if !slices.Equal(entries(a), ea) || !slices.Equal(entries(b), eb) {
			t.Fatal("mergeLogs changed its arguments")
		}
		// Idempotent: merging again with either side, or a log with
		// itself, changes nothing (the first log comes back when it holds
		// at least as much as the second everywhere).
		for _, tt := range []struct {
			name string
			x, y *Log
			want []logEntry
		}{{"a, a", a, a, ea}, {"m, a", m, a, em}, {"m, b", m, b, em}} {
			if got := entries(mergeLogs(tt.x, tt.y)); !slices.Equal(got, tt.want) {
				t.Fatalf("mergeLogs(%s) = %v, want %v", tt.name, got, tt.want)
			}
		}
	})
}

// Merging a log with an older copy of itself, both rid of the entries
// expired at the same now, gives the newer log back.
func TestMergeLogsWithAnOlderCopy(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := &Rule{Name: "sl", Algorithm: SlidingLog, Limit: rapid.Int64Range(1, 30).Draw(t, "limit"), Period: 1000}
		weighted := rapid.Bool().Draw(t, "weighted")
		l := new(Log)
		now := drawLog(t, "before", l, r, 0, weighted)
		old := mergeLogs(l, new(Log)) // a copy
		now = drawLog(t, "after", l, r, now, weighted)
		l.expire(now)
		old.expire(now)
		want := entries(l)
		for _, m := range []*Log{mergeLogs(old, l), mergeLogs(l, old)} {
			if got := entries(m); !slices.Equal(got, want) {
				t.Fatalf("merged with an older copy: %v, want %v", got, want)
			}
		}
	})
}

func TestImportRejects(t *testing.T) {
	const now = int64(1 << 50)
	setRule := &Rule{Name: "s", Algorithm: GCRA, Limit: 3, Period: time.Second}
	valid := buildStreamSets(1, []testSet{{7, 100, []Rule{*setRule}}},
		testRec{1, kindTAT, []uint64{10}, 1},
		testRec{2, kindTAT, []uint64{10}, 0},
		testRec{1, kindWindow, []uint64{10, 1<<32 | 1}, 0},
		testRec{1, kindLog, []uint64{2, 5, 1, 5, 2}, 0},
	)
	long := []uint64{MaxLogLimit + 1}
	for range MaxLogLimit + 1 {
		long = append(long, 1, 1)
	}
	withTail := func(b []byte, tail ...byte) []byte { return append(bytes.Clone(b), tail...) }
	tests := []struct {
		name string
		src  []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"bad magic", withTail([]byte("RLP2\x02\x01\x00\x00")), ErrCorrupt},
		{"format 1", withTail([]byte("RLP1\x01\x01\x00")), ErrCorrupt},
		{"format 3", withTail([]byte("RLP1\x03\x01\x00\x00")), ErrCorrupt},
		{"other partition", buildStream(0), ErrPartition},
		{"partition over 32 bits", buildStream(1 << 32), ErrCorrupt},
		{"trailing byte", withTail(valid, 0), ErrCorrupt},
		{"count over bytes", withTail([]byte("RLP1\x02\x01\x00\x02"), make([]byte, 2*minRecord-1)...), ErrCorrupt},
		{"count overflow", withTail([]byte("RLP1\x02\x01\x00"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ErrCorrupt},
		{"non-minimal varint", withTail([]byte("RLP1\x02\x81\x00\x00\x00")), ErrCorrupt},
		{"set count over bytes", withTail([]byte("RLP1\x02\x01\x05\x00")), ErrCorrupt},
		{"set version 0", buildStreamSets(1, []testSet{{0, 1, []Rule{*setRule}}}, testRec{1, kindTAT, []uint64{10}, 1}), ErrCorrupt},
		{"set order", buildStreamSets(1, []testSet{{5, 1, []Rule{*setRule}}, {4, 1, []Rule{*setRule}}}, testRec{1, kindTAT, []uint64{10}, 1}, testRec{2, kindTAT, []uint64{10}, 2}), ErrCorrupt},
		{"set unused", buildStreamSets(1, []testSet{{5, 1, []Rule{*setRule}}}, testRec{1, kindTAT, []uint64{10}, 0}), ErrCorrupt},
		{"set out of range", buildStreamSets(1, []testSet{{5, 1, []Rule{*setRule}}}, testRec{1, kindTAT, []uint64{10}, 2}), ErrCorrupt},
		{"set age over max", buildStreamSets(1, []testSet{{5, uint64(maxDelta) + 1, []Rule{*setRule}}}, testRec{1, kindTAT, []uint64{10}, 1}), ErrCorrupt},
		{"set rule invalid", buildStreamSets(1, []testSet{{5, 1, []Rule{{Name: "z", Algorithm: GCRA, Limit: 0, Period: time.Second}}}}, testRec{1, kindTAT, []uint64{10}, 1}), ErrCorrupt},
		{"set rule name", buildStreamSets(1, []testSet{{5, 1, []Rule{{Name: "a b", Algorithm: GCRA, Limit: 1, Period: time.Second}}}}, testRec{1, kindTAT, []uint64{10}, 1}), ErrCorrupt},
		{"set rules order", buildStreamSets(1, []testSet{{5, 1, []Rule{*setRule, *setRule}}}, testRec{1, kindTAT, []uint64{10}, 1}), ErrCorrupt},
		{"unknown kind 0", buildStream(1, testRec{1, 0, []uint64{10}, 0}), ErrCorrupt},
		{"unknown kind 4", buildStream(1, testRec{1, 4, []uint64{10}, 0}), ErrCorrupt},
		{"duplicate", buildStream(1, testRec{1, kindTAT, []uint64{10}, 0}, testRec{1, kindTAT, []uint64{11}, 0}), ErrCorrupt},
		{"hash order", buildStream(1, testRec{2, kindTAT, []uint64{10}, 0}, testRec{1, kindTAT, []uint64{11}, 0}), ErrCorrupt},
		{"kind order", buildStream(1, testRec{1, kindWindow, []uint64{10, 1}, 0}, testRec{2, kindTAT, []uint64{11}, 0}), ErrCorrupt},
		{"tat delta 0", buildStream(1, testRec{1, kindTAT, []uint64{0}, 0}), ErrCorrupt},
		{"tat delta over max", buildStream(1, testRec{1, kindTAT, []uint64{uint64(maxDelta) + 1}, 0}), ErrCorrupt},
		{"window delta 0", buildStream(1, testRec{1, kindWindow, []uint64{0, 1}, 0}), ErrCorrupt},
		{"window counts 0", buildStream(1, testRec{1, kindWindow, []uint64{5, 0}, 0}), ErrCorrupt},
		{"window count over limit", buildStream(1, testRec{1, kindWindow, []uint64{5, MaxLimit + 1}, 0}), ErrCorrupt},
		{"window prev over limit", buildStream(1, testRec{1, kindWindow, []uint64{5, (MaxLimit + 1) << 32}, 0}), ErrCorrupt},
		{"log empty", buildStream(1, testRec{1, kindLog, []uint64{0}, 0}), ErrCorrupt},
		{"log too long", buildStream(1, testRec{1, kindLog, long, 0}), ErrCorrupt},
		{"log cost 0", buildStream(1, testRec{1, kindLog, []uint64{1, 5, 0}, 0}), ErrCorrupt},
		{"log sum over max", buildStream(1, testRec{1, kindLog, []uint64{2, 5, MaxLogLimit, 6, 1}, 0}), ErrCorrupt},
		{"log out of order", buildStream(1, testRec{1, kindLog, []uint64{2, 6, 1, 5, 1}, 0}), ErrCorrupt},
		{"log exp delta 0", buildStream(1, testRec{1, kindLog, []uint64{1, 0, 1}, 0}), ErrCorrupt},
		{"log length over bytes", buildStream(1, testRec{1, kindLog, []uint64{100, 5, 1}, 0}), ErrCorrupt},
	}
	for cut := range len(valid) {
		tests = append(tests, struct {
			name string
			src  []byte
			want error
		}{"truncated", valid[:cut], ErrCorrupt})
	}
	tb := mustTable(t, 2)
	r := &Rule{Name: "x", Algorithm: TokenBucket, Limit: 5, Period: time.Second}
	for h := range uint64(40) {
		tb.Check(1, h, r, now, 1)
	}
	if _, err := mustTable(t, 2).Import(1, valid, now); err != nil {
		t.Fatalf("the valid stream: %v", err)
	}
	if _, err := mustTable(t, 2).Import(1, valid, math.MinInt64+99); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a set age that overflows the importer's clock: %v, want ErrCorrupt", err)
	}
	before := tb.Export(nil, 1, now)
	for _, tt := range tests {
		n, err := tb.Import(1, tt.src, now)
		if !errors.Is(err, tt.want) || n != 0 {
			t.Errorf("%s (% x): %d, %v; want 0, %v", tt.name, tt.src, n, err, tt.want)
			continue
		}
		var ce *CorruptError
		if errors.As(err, &ce) && (ce.Offset < 0 || ce.Offset > len(tt.src)) {
			t.Errorf("%s: offset %d outside the %d-byte stream", tt.name, ce.Offset, len(tt.src))
		}
		if after := tb.Export(nil, 1, now); !bytes.Equal(after, before) {
			t.Fatalf("%s: failed import changed the table", tt.name)
		}
	}
	if tb.Len() != 40 {
		t.Fatalf("table holds %d states, want 40", tb.Len())
	}
}

// A clock that ran far backwards leaves TATs far ahead of now; Export
// clamps them so the stream stays importable.
func TestExportClampsDeltas(t *testing.T) {
	tb := mustTable(t, 1)
	r := &Rule{Name: "c", Algorithm: GCRA, Limit: 1, Burst: 10, Period: MaxPeriod}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	const later = int64(math.MaxInt64 / 2)
	tb.Check(0, 1, r, later, 10) // TAT = later + MaxTolerance
	s := tb.Export(nil, 0, later-int64(MaxTolerance)*3)
	if _, err := mustTable(t, 1).Import(0, s, 0); err != nil {
		t.Fatalf("Import after a clock jump: %v", err)
	}
	if _, err := mustTable(t, 1).Import(0, s, math.MaxInt64-10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Import at a now that overflows: %v, want ErrCorrupt", err)
	}
}

// A state of an older rule set stays live while it matters what it
// carries over to the next set, though its own time may be past: Export
// writes that time 1 ns ahead, so the importer carries it over to about
// what the exporter does. It wrote it as the wrapped difference clamped
// to maxDelta: twenty years of debt, an empty bucket after the carry.
func TestExportOlderSetStatePastItsTime(t *testing.T) {
	const ms = int64(time.Millisecond)
	v1 := []Rule{{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Second, Version: 1}}
	v2 := []Rule{{Name: "r", Algorithm: TokenBucket, Limit: 20, Period: time.Second, Version: 2}}
	tb := mustTable(t, 1)
	if err := tb.SetRules(1, v1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Check(0, 7, &v1[0], 0, 5); err != nil { // TAT = 500ms
		t.Fatal(err)
	}
	if err := tb.SetRules(2, v2, 100*ms); err != nil { // the state matters at 100ms
		t.Fatal(err)
	}
	now := 501 * ms // past the TAT, not yet carried over
	s := tb.Export(nil, 0, now)
	if !bytes.HasSuffix(s, []byte{0x01}) { // the TAT delta is the last byte
		t.Fatalf("export % x: want a TAT delta of 1", s)
	}
	in := mustTable(t, 1)
	if err := in.SetRules(2, v2, 100*ms); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Import(0, s, now); err != nil {
		t.Fatal(err)
	}
	want, err := tb.Check(0, 7, &v2[0], now, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := in.Check(0, 7, &v2[0], now, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The importer carries over a TAT 1ms+1ns later than the exporter's.
	if got.Remaining > want.Remaining || got.Remaining < want.Remaining-1 {
		t.Fatalf("imported state: %d remaining, exporter's %d: want at most 1 fewer", got.Remaining, want.Remaining)
	}
}

// A window state imported by a table whose clock differs from the
// exporter's — two members' clocks, or the time a hand-off took to
// arrive — stays in the window it was made in while the shift is under
// a quarter period, whether its latest admission was just after the
// window turned or just before it turns: windows are aligned to
// multiples of the period, so both tables then decide alike at every
// instant. Was: the state was packed as end + Last, so an importer 1 ns
// behind read an admission made as the window turned as one of the
// window before, already over (the count lost), and one 1 ms ahead read
// an admission made just before the turn as one of the next window (a
// whole window of denials).
func TestWindowImportSurvivesClockShift(t *testing.T) {
	const ms = int64(time.Millisecond)
	for _, a := range []Algorithm{FixedWindow, SlidingWindow} {
		r := &Rule{Name: "w", Algorithm: a, Limit: 5, Period: time.Minute}
		p := int64(r.Period)
		w0 := alignDown(int64(1<<60), p) // a window start
		for _, spendAt := range []int64{w0, w0 + p/2, w0 + p - ms/2} {
			for _, shift := range []int64{-1, 1, -ms, ms, -p/4 + 1, p/4 - 1} {
				src := mustTable(t, 1)
				for range 5 {
					if d, err := src.Check(0, 42, r, spendAt, 1); err != nil || !d.Allowed {
						t.Fatalf("spend: %+v, %v", d, err)
					}
				}
				exportAt := spendAt + ms/4
				dst := mustTable(t, 1)
				if _, err := dst.Import(0, src.Export(nil, 0, exportAt), exportAt+shift); err != nil {
					t.Fatal(err)
				}
				for _, later := range []int64{0, ms, p / 3, p} {
					at := exportAt + abs64(shift) + later
					want, err := src.Check(0, 42, r, at, 0)
					if err != nil {
						t.Fatal(err)
					}
					got, err := dst.Check(0, 42, r, at, 0)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("%v: spent at window start + %v, imported %v off, asked %v after the export: %+v, exporter %+v",
							a, time.Duration(spendAt-w0), time.Duration(shift), time.Duration(at-exportAt), got, want)
					}
				}
			}
		}
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
