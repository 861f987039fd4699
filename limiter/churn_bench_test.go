package limiter

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkTableChurn checks uniformly random keys of a rule whose states
// die between two checks of one key (token bucket 1000 per second, 100,000
// keys, 1M checks per second of benchmark clock): the workload of
// bench/run.sh. Most checks then meet a dead or absent state, so the
// stores insert, fill up and sweep all the time.
func BenchmarkTableChurn(b *testing.B) {
	const keys = 100_000
	r := &Rule{Name: "churn", Algorithm: TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
	if err := r.Validate(); err != nil {
		b.Fatal(err)
	}
	t, _ := NewTable(1024)
	salt := RuleSalt(benchSeed, r.Name, r.Algorithm)
	hashes := keyHashes(keys)
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int32, 1<<20)
	for i := range order {
		order[i] = int32(rng.IntN(keys))
	}
	now := benchStart
	c := startCPU(b)
	for i := range b.N {
		kh := hashes[order[i&(len(order)-1)]]
		now += 1000 // 1µs of benchmark clock per check
		if _, err := t.Check(uint32(kh%1024), BucketHash(kh, salt), r, now, 1); err != nil {
			b.Fatal(err)
		}
	}
	c.stop(b)
}
