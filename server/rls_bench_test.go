package server

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/router/rls"
	"github.com/ringlimit/ringlimit/transport"
)

// benchRLSConfig never denies: the benchmark measures the path, not the limit.
const benchRLSConfig = `
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
`

// BenchmarkRLS measures ShouldRateLimit over real gRPC (generated client,
// loopback TCP) against 1 member, 3 members (the client spreads its
// streams over the members' gRPC ports, as Envoy spreads over replicas),
// and a stateless router in front of the 3 members — and, as the
// baseline, the same service with decisions faked (gRPC's own cost on
// this machine); with 1 and 5
// descriptors per call and 1, 16 and 64 concurrent streams, all in one
// run so the ratios compare like with like.
//
//	go test -run='^$' -bench=RLS -benchtime=3s ./server/
func BenchmarkRLS(b *testing.B) {
	_, one := startRLSCluster(b, 1, benchRLSConfig)
	three, threeClients := startRLSCluster(b, 3, benchRLSConfig)
	viaRouter := benchRLSServer(b, benchRouter(b, three))
	grpcOnly := benchRLSServer(b, allowAll{})
	targets := []struct {
		name    string
		clients []rlspb.RateLimitServiceClient
	}{
		{"grpc-only", []rlspb.RateLimitServiceClient{grpcOnly}}, // the same service, decisions faked: gRPC's own cost
		{"members=1", one},
		{"members=3", threeClients},
		{"router+3", []rlspb.RateLimitServiceClient{viaRouter}},
	}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	for _, tg := range targets {
		for _, nd := range []int{1, 5} {
			for _, streams := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("%s/descriptors=%d/streams=%d", tg.name, nd, streams), func(b *testing.B) {
					benchCalls(b, tg.clients, keys, nd, streams)
				})
			}
		}
	}
}

func benchCalls(b *testing.B, clients []rlspb.RateLimitServiceClient, keys []string, nd, streams int) {
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[g%len(clients)]
			req := &rlspb.RateLimitRequest{Domain: "bench"}
			for range nd {
				req.Descriptors = append(req.Descriptors, &commonpb.RateLimitDescriptor{
					Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user"}}})
			}
			var mine []time.Duration
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					break
				}
				for j, d := range req.Descriptors {
					d.Entries[0].Value = keys[(int(n)*nd+j)%len(keys)]
				}
				start := time.Now()
				resp, err := c.ShouldRateLimit(context.Background(), req)
				mine = append(mine, time.Since(start))
				if err != nil {
					b.Error(err)
					return
				}
				if resp.OverallCode != rlspb.RateLimitResponse_OK {
					b.Errorf("answer %v", resp.OverallCode)
					return
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(b.N*nd)/b.Elapsed().Seconds(), "descriptors/s")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-µs")
}

// allowAll allows every check without deciding anything.
type allowAll struct{}

func (allowAll) CheckBy(_ context.Context, _ time.Time, reqs []router.Request, out []router.Result) error {
	for i := range reqs {
		out[i] = router.Result{Decision: limiter.Decision{Allowed: true, Limit: 1, Remaining: 1}}
	}
	return nil
}

// benchRouter is a stateless router (not a member) built from the
// cluster's view.
func benchRouter(b *testing.B, ss []*Server) *router.Router {
	av, err := ss[0].Node.RouterView(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	rv, err := router.ViewFromAPI(httpapi.ViewOf(av)) // through the wire form, as a router gets it
	if err != nil {
		b.Fatal(err)
	}
	pool := transport.NewPool(transport.DefaultClientConfig())
	b.Cleanup(func() { pool.Close() })
	rt, err := router.New(router.Config{}, nil, pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rt.Close)
	rt.SetView(rv)
	return rt
}

// benchRLSServer serves the RLS with the bench config on checker and
// returns a client of it.
func benchRLSServer(b *testing.B, checker rls.Checker) rlspb.RateLimitServiceClient {
	s, err := rls.New(rls.Options{}, checker)
	if err != nil {
		b.Fatal(err)
	}
	c, err := rls.ParseConfig(rls.File{Name: "bench.yaml", Data: []byte(benchRLSConfig)})
	if err != nil {
		b.Fatal(err)
	}
	s.Service().SetConfig(c)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	b.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return rlspb.NewRateLimitServiceClient(cc)
}
