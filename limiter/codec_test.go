package limiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
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
	// A window's DeadAt is its end plus the offset of its latest
	// admission from its start: now + 1s for an admission at now.
	want := buildStream(2,
		testRec{0, kindTAT, []uint64{100 * ms}, 0},
		testRec{0x0201, kindTAT, []uint64{300 * ms}, 0},
		testRec{0x0201, kindWindow, []uint64{1000 * ms, 4}, 0},
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
		{"log imported", kindLog, []uint64{2, 5, 1, 6, 1}, []uint64{1, 3, 1}, []uint64{1, 3, 1}},
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
