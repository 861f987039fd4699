package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// BenchmarkRouterCheck measures a check through the router of member n1
// of a 2-member cluster (real Raft, real loopback data plane), for keys
// n1 owns (decided in place) and for keys n2 owns (forwarded in
// micro-batches): the difference is the forwarding cost.
//
//	go test -run=^$ -bench=RouterCheck -benchtime=2s ./server/
func BenchmarkRouterCheck(b *testing.B) {
	ss := benchCluster(b)
	rule := limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1_000_000, Period: time.Second, Burst: 1_000_000}
	if _, err := ss[0].Node.PutRules(context.Background(), []limiter.Rule{rule}); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the bench rule everywhere", func() bool {
		for _, s := range ss {
			if s.Router.View().Rules["bench"] == nil {
				return false
			}
		}
		return true
	})
	v := ss[0].Router.View()
	keysOwnedBy := func(id string) []string {
		var keys []string
		for i := 0; len(keys) < 10_000; i++ {
			k := fmt.Sprintf("user-%d", i)
			if m, _ := v.Ring.Owner(v.Ring.Partition(limiter.KeyHash(v.Seed, k))); m.ID == id {
				keys = append(keys, k)
			}
		}
		return keys
	}
	for _, where := range []struct{ name, owner string }{{"local", "n1"}, {"forwarded", "n2"}} {
		keys := keysOwnedBy(where.owner)
		for _, batch := range []int{1, 100} {
			for _, par := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/batch=%d/goroutines=%d", where.name, batch, par), func(b *testing.B) {
					var next, degraded atomic.Int64
					var mu sync.Mutex
					var lat []time.Duration // every call's latency, for p50/p99
					b.SetParallelism(par)   // × GOMAXPROCS
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						reqs := make([]router.Request, batch)
						out := make([]router.Result, batch)
						var mine []time.Duration
						for pb.Next() {
							base := int(next.Add(int64(batch)))
							for i := range reqs {
								reqs[i] = router.Request{Rule: "bench", Key: keys[(base+i)%len(keys)], Cost: 1}
							}
							start := time.Now()
							if err := ss[0].Router.Check(context.Background(), reqs, out); err != nil {
								b.Error(err) // Fatal may not be called from RunParallel's goroutines
								return
							}
							mine = append(mine, time.Since(start))
							for i := range out[:batch] {
								if out[i].Degraded { // an owner late past the forward timeout: a starved machine
									degraded.Add(1)
								}
							}
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
					b.StopTimer()
					b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "checks/s")
					b.ReportMetric(float64(degraded.Load())/float64(b.N*batch), "degraded/check")
					if len(lat) == 0 {
						return
					}
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2])/1e3, "p50-µs")
					b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-µs")
				})
			}
		}
	}
}

func benchCluster(b *testing.B) []*Server {
	b.Helper()
	var ss []*Server
	for i := range 2 {
		join := ""
		if i > 0 {
			join = ss[0].cfg.HTTPAdvertise
		}
		ls := listen(b)
		s, err := Start(Config{
			ID: fmt.Sprintf("n%d", i+1), HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: b.TempDir(), Join: []string{join}, RaftTimeout: 300 * time.Millisecond,
		}, ls)
		if err != nil {
			b.Fatal(err)
		}
		shutdownAtCleanup(b, s)
		ss = append(ss, s)
	}
	waitSettled(b, ss, 2)
	return ss
}
