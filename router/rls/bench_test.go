package rls

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

type allowAll struct{}

func (allowAll) CheckBy(_ context.Context, _ time.Time, reqs []router.Request, out []router.Result) error {
	for i := range reqs {
		out[i] = router.Result{Decision: limiter.Decision{Allowed: true, Limit: 10, Remaining: 9}}
	}
	return nil
}

// BenchmarkService is the service's own cost per call, without gRPC or
// the cluster: matching, keys, the response, with and without the
// x-ratelimit-* headers.
//
//	go test -run='^$' -bench=Service -benchmem ./router/rls/
func BenchmarkService(b *testing.B) {
	c, err := ParseConfig(File{Name: "f.yaml", Data: []byte(basicConfig)})
	if err != nil {
		b.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, headers := range []bool{false, true} {
		svc := NewService(allowAll{}, headers, m)
		svc.SetConfig(c)
		for _, n := range []int{1, 5} {
			req := &rlspb.RateLimitRequest{Domain: "api"}
			for i := range n {
				req.Descriptors = append(req.Descriptors, desc("plan", "free", "user", fmt.Sprint("u", i)))
			}
			b.Run(fmt.Sprintf("descriptors=%d/headers=%v", n, headers), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
