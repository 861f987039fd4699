package limiter

import (
	"testing"
	"time"
)

// BenchmarkExport exports one partition of about 10,000 live states of
// each kind (TAT, window, a log of 3 entries): the owner's side of a hand-off
// and of a whole backup push. ns/state is per exported state.
func BenchmarkExport(b *testing.B) {
	tb, now := exportFixture(b)
	states := tb.Len()
	buf := tb.Export(nil, 0, now)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		buf = tb.Export(buf[:0], 0, now)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*states), "ns/state")
}

// BenchmarkRestamp restamps BenchmarkExport's stream by 100ms: what a
// hand-off costs its sender at each attempt.
func BenchmarkRestamp(b *testing.B) {
	tb, now := exportFixture(b)
	states := tb.Len()
	src := tb.Export(nil, 0, now)
	var buf []byte
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var err error
		if buf, err = tb.Restamp(buf[:0], src, now, now+int64(100*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*states), "ns/state")
}

// exportFixture is a table whose partition 0 holds about 10,000 live
// states of each kind, and the instant they were last checked.
func exportFixture(b *testing.B) (*Table, int64) {
	const perKind = 10_000
	tb := mustTable(b, 1)
	rules := []*Rule{
		{Name: "tb", Algorithm: TokenBucket, Limit: 100, Period: time.Minute},
		{Name: "sw", Algorithm: SlidingWindow, Limit: 100, Period: time.Minute},
		{Name: "sl", Algorithm: SlidingLog, Limit: 10, Period: time.Minute},
	}
	now := benchStart
	for i, r := range rules {
		for h := range uint64(perKind) {
			for range 3 {
				now += benchTick
				if _, err := tb.Check(0, (h+uint64(i)*perKind+1)*0x9e3779b97f4a7c15, r, now, 1); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	return tb, now
}

// BenchmarkExportLongLogs exports a partition of 100 sliding logs of
// 5,000 entries each (a 10,000-per-hour rule's busy keys; half of them
// weighted, their costs kept per entry): exact, as a
// hand-off does (Export) and as a backup push did before its logs were
// coarsened, and coarse, as a backup push does (ExportChanges).
func BenchmarkExportLongLogs(b *testing.B) {
	tb := mustTable(b, 1)
	tb.TrackChanges()
	r := &Rule{Name: "sl", Algorithm: SlidingLog, Limit: MaxLogLimit, Period: time.Hour}
	now := benchStart
	for i := range 5000 {
		now += int64(time.Hour) / 10_000
		for h := range uint64(100) {
			cost := int64(1)
			if h%2 == 1 && i == 0 {
				cost = 2 // a weighted log from here on (it keeps its costs)
			}
			if _, err := tb.Check(0, (h+1)*0x9e3779b97f4a7c15, r, now, cost); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, bc := range []struct {
		name   string
		export func([]byte) []byte
	}{
		{"exact", func(dst []byte) []byte { return tb.Export(dst, 0, now) }},
		{"coarse", func(dst []byte) []byte { s, _ := tb.ExportChanges(dst, 0, now, true, nil); return s }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			buf := bc.export(nil)
			b.ReportAllocs()
			for b.Loop() {
				buf = bc.export(buf[:0])
			}
			b.ReportMetric(float64(len(buf)), "bytes/export")
		})
	}
}
