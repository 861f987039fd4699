package limiter

import (
	"testing"
	"time"
)

// BenchmarkExport exports one partition of about 10,000 live states of
// each kind (TAT, window, a log of 3 entries): the owner's side of a hand-off
// and of a whole backup push. ns/state is per exported state.
func BenchmarkExport(b *testing.B) {
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
