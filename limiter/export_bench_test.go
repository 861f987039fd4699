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
