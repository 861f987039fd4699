package node

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/cputime"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// BenchmarkOwnerHandleBatch is the owner's side of a data-plane frame:
// one member owning all 1024 partitions, 100,000 uniform keys of the
// side-by-side's rule (token bucket 1000/s, burst 1000, so most checks
// find their state idle and make a fresh one), frames of 512 checks
// decided by two goroutines at once, as two workers of the data plane
// on 2 cores. No transport: only the table (its fences and locks) and
// the results.
//
//	go test -run '^$' -bench OwnerHandleBatch ./node/
func BenchmarkOwnerHandleBatch(b *testing.B) {
	const keys, frame = 100_000, 512
	var now atomic.Int64
	now.Store(1e18)
	o, err := NewOwner("a", 1024, func() int64 { return now.Load() }, nil)
	if err != nil {
		b.Fatal(err)
	}
	r, err := ring.New(ring.Config{Partitions: 1024, ReplicationFactor: 32, Load: 1.25}, 1, []ring.Member{{ID: "a", Peer: "a:1"}})
	if err != nil {
		b.Fatal(err)
	}
	rule := limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
	v := view.New(r, 9, []limiter.Rule{rule}, 1)
	o.Apply(v, PlanMoves(nil, v.Ring, "a", func(string) bool { return true }, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	var seed atomic.Uint64
	b.ReportAllocs()
	cpu := cputime.Process()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 7))
		req := transport.BatchRequest{Epoch: 1, Checks: make([]transport.Check, frame)}
		resp := transport.BatchResponse{Results: make([]transport.Result, frame)}
		for pb.Next() {
			for i := range req.Checks {
				kh := rng.Uint64N(keys) * 0x9e3779b97f4a7c15
				req.Checks[i] = transport.Check{Rule: "bench", KeyHash: kh, Partition: r.Partition(kh), Cost: 1}
			}
			now.Add(int64(time.Millisecond)) // the side-by-side's pace: ~2 frames per ms
			o.HandleBatch(context.Background(), &req, &resp)
			if resp.Results[frame-1].Status != transport.StatusOK {
				b.Errorf("status %v", resp.Results[frame-1].Status)
				return
			}
		}
	})
	checks := float64(b.N * frame)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/checks, "ns/check")
	b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
}
