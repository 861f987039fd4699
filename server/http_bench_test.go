package server

import (
	"bytes"
	"context"
	"fmt"
	"github.com/ringlimit/ringlimit/internal/cputime"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// BenchmarkHTTPCheck is POST /v1/check on one member over loopback HTTP
// (keep-alive, 16 callers per CPU), single and in batches of 100, with
// 100,000 keys: the path the side-by-side run (bench/) measures from
// outside, here in one process so that -cpuprofile and -benchmem see it.
// allocs/op counts both ends (net/http's client included); allocs per
// check on the server side alone are in router/httpapi's benchmarks.
//
//	go test -run=^$ -bench=HTTPCheck -benchmem ./server/
func BenchmarkHTTPCheck(b *testing.B) {
	ls := listen(b)
	s, err := Start(Config{
		ID: "n1", HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
		DataDir: b.TempDir(), RaftTimeout: 300 * time.Millisecond,
	}, ls)
	if err != nil {
		b.Fatal(err)
	}
	shutdownAtCleanup(b, s)
	waitSettled(b, []*Server{s}, 1)
	rule := limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
	if _, err := s.Node.PutRules(context.Background(), []limiter.Rule{rule}); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the bench rule", func() bool { return s.Router.View().Rules["bench"] != nil })
	url := "http://" + s.cfg.HTTPAdvertise + "/v1/check"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			cpu := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var body []byte
				sink := make([]byte, 64<<10)
				for pb.Next() {
					base := next.Add(int64(batch))
					body = body[:0]
					if batch > 1 {
						body = append(body, `{"checks":[`...)
					}
					for i := range batch {
						if i > 0 {
							body = append(body, ',')
						}
						body = append(body, `{"rule":"bench","key":"key-`...)
						body = strconv.AppendInt(body, (base+int64(i))%100_000, 10)
						body = append(body, `","cost":1}`...)
					}
					if batch > 1 {
						body = append(body, "]}"...)
					}
					resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					n, _ := io.ReadFull(resp.Body, sink)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("%d %s", resp.StatusCode, sink[:n])
						return
					}
				}
			})
			b.StopTimer()
			checks := float64(b.N * batch)
			b.ReportMetric(checks/b.Elapsed().Seconds(), "checks/s")
			// Client and server together (one process).
			b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
		})
	}
}
