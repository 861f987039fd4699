package client_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/cputime"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// BenchmarkRingCheck is the Go client's rows of the side-by-side run in
// one process: a Ring over the data plane to one member (real Raft,
// loopback TCP), 32 callers, 1 check per Ring.Check call (concurrent
// calls share frames) and 100 per call through its router. cpu-ns/check
// is the whole process's CPU (client and member together).
//
//	go test -run=^$ -bench=RingCheck -benchtime=2s ./client/
func BenchmarkRingCheck(b *testing.B) {
	m := startMembers(b, 1, limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1_000_000, Period: time.Second, Burst: 1_000_000})
	rc, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testToken, Refresh: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	eventually(b, "the ring client's first view", rc.Ready)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d/callers=32", batch), func(b *testing.B) {
			var next atomic.Int64
			var degraded atomic.Int64
			b.SetParallelism(16) // × GOMAXPROCS (2 here): 32 callers
			b.ReportAllocs()
			cpu := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				reqs := make([]router.Request, batch)
				out := make([]router.Result, batch)
				for pb.Next() {
					base := int(next.Add(int64(batch)))
					if batch == 1 {
						d, err := rc.Check(b.Context(), "bench", keys[base%len(keys)], 1)
						if err != nil {
							b.Error(err)
							return
						}
						if d.Degraded {
							degraded.Add(1)
						}
						continue
					}
					for i := range reqs {
						reqs[i] = router.Request{Rule: "bench", Key: keys[(base+i)%len(keys)], Cost: 1}
					}
					if err := rc.Router().Check(b.Context(), reqs, out); err != nil {
						b.Error(err)
						return
					}
					if out[0].Degraded {
						degraded.Add(1)
					}
				}
			})
			b.StopTimer()
			checks := float64(b.N * batch)
			b.ReportMetric(checks/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
			// A member starved of CPU may lose its lease for a moment and
			// answer by failure mode: counted, not fatal.
			b.ReportMetric(float64(degraded.Load())/float64(b.N), "degraded/op")
		})
	}
}
