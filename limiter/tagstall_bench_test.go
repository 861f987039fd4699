package limiter

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSetRulesAllTagsTaken is what a rules write costs once every
// tag is taken: 1M live token-bucket states spread over the 254 newest
// rule sets of 1024 partitions, each set superseded a minute after the
// one before (so settled), then one more set per op, while another
// goroutine checks keys of every partition. Reported: ms per write
// (mean), the longest write, and the longest a check waited
// (max-check-ms: what a rules write stalls a member's checks by).
func BenchmarkSetRulesAllTagsTaken(b *testing.B) {
	const states = 1_000_000
	tbl, err := NewTable(benchParts)
	if err != nil {
		b.Fatal(err)
	}
	now := benchStart
	rule := func(v uint64) Rule {
		return Rule{Name: "tb", Algorithm: TokenBucket, Limit: 100 + int64(v), Period: 24 * time.Hour, Version: v}
	}
	v, k := uint64(0), uint64(0)
	for v < maxTags-1 {
		v++
		now += int64(time.Minute)
		if err := tbl.SetRules(v, []Rule{rule(v)}, now); err != nil {
			b.Fatal(err)
		}
		r := rule(v)
		for range states / (maxTags - 1) {
			k++
			h := BucketHash(mix64(k), 1)
			if _, err := tbl.Check(uint32(h%benchParts), h, &r, now, 1); err != nil {
				b.Fatal(err)
			}
		}
	}
	var (
		newest  atomic.Uint64
		clock   atomic.Int64
		stop    atomic.Bool
		waited  time.Duration
		checker sync.WaitGroup
	)
	newest.Store(v)
	clock.Store(now)
	checker.Go(func() {
		for i := uint64(0); !stop.Load(); i++ {
			r := rule(newest.Load())
			h := BucketHash(mix64(i%k+1), 1)
			start := time.Now()
			// ErrVersion: a write released the set after newest was read.
			if _, err := tbl.Check(uint32(h%benchParts), h, &r, clock.Load(), 1); err != nil && !errors.Is(err, ErrVersion) {
				b.Error(err)
				return
			}
			waited = max(waited, time.Since(start))
		}
	})
	b.ResetTimer()
	var total, longest time.Duration
	for b.Loop() {
		v++
		now += int64(time.Minute)
		clock.Store(now)
		start := time.Now()
		if err := tbl.SetRules(v, []Rule{rule(v)}, now); err != nil {
			b.Fatal(err)
		}
		newest.Store(v)
		took := time.Since(start)
		total, longest = total+took, max(longest, took)
	}
	b.StopTimer()
	stop.Store(true)
	checker.Wait()
	b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/write")
	b.ReportMetric(float64(longest.Microseconds())/1e3, "max-ms")
	b.ReportMetric(float64(waited.Microseconds())/1e3, "max-check-ms")
	b.ReportMetric(float64(tbl.Len()), "states")
}
