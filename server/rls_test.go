package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/rls"
)

// rlsConfig is what every replica loads, each from its own file, as
// Envoy users deploy envoyproxy/ratelimit.
const rlsConfig = `
domain: shop
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 50
      algorithm: sliding_log   # exact whatever the clock: no window boundary mid-test
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 5
      algorithm: sliding_log
`

// startRLSCluster starts n members, each serving the Envoy RLS on its own
// gRPC listener with its own copy of config, and returns a generated
// client per member.
func startRLSCluster(t testing.TB, n int, config string) ([]*Server, []rlspb.RateLimitServiceClient) {
	t.Helper()
	var ss []*Server
	var clients []rlspb.RateLimitServiceClient
	for i := range n {
		dir := t.TempDir()
		path := filepath.Join(dir, "ratelimit.yaml")
		if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		ls := listen(t)
		var err error
		if ls.GRPC, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		join := ""
		if i > 0 {
			join = ss[0].cfg.HTTPAdvertise
		}
		s, err := Start(Config{
			ID: fmt.Sprintf("n%d", i+1), HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: filepath.Join(dir, "data"), Join: []string{join}, Ring: ring.Config{Partitions: 128, ReplicationFactor: 64, Load: 1.25},
			RaftTimeout: testRaftTimeout,
			Router:      router.Config{Timeout: testRouterTimeout, RefreshWait: 2 * time.Second},
			RLS:         rls.Options{ConfigPath: path},
		}, ls)
		if err != nil {
			t.Fatal(err)
		}
		shutdownAtCleanup(t, s)
		ss = append(ss, s)
		cc, err := grpc.NewClient(ls.GRPC.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		clients = append(clients, rlspb.NewRateLimitServiceClient(cc))
	}
	waitSettled(t, ss, n)
	waitPromoted(t, ss)
	return ss, clients
}

func rlsCall(t testing.TB, c rlspb.RateLimitServiceClient, ds ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitResponse {
	resp, err := c.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "shop", Descriptors: ds})
	if err != nil {
		t.Error(err)
		return &rlspb.RateLimitResponse{}
	}
	return resp
}

func rlsDesc(key, value string) *commonpb.RateLimitDescriptor {
	return &commonpb.RateLimitDescriptor{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// Three members, each with its own copy of the Envoy config and its own
// gRPC port: a descriptor's limit holds exactly across them (the owner
// decides under the rule each call carries), not three times over.
func TestRLSExactAcrossThreeMembers(t *testing.T) {
	ss, clients := startRLSCluster(t, 3, rlsConfig)

	t.Run("one descriptor, 300 concurrent calls, limit 50", func(t *testing.T) {
		var okCount atomic.Int64
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if rlsCall(t, clients[i%3], rlsDesc("user", "hot")).GetOverallCode() == rlspb.RateLimitResponse_OK {
					okCount.Add(1)
				}
			}()
		}
		wg.Wait()
		if okCount.Load() != 50 {
			t.Fatalf("3 members admitted %d, want exactly 50", okCount.Load())
		}
	})

	t.Run("200 descriptors x 10 calls, limit 5", func(t *testing.T) {
		var mu sync.Mutex
		perKey := map[string]int{}
		var wg sync.WaitGroup
		// At most maxInFlight calls at once, in key order: a key's 10
		// calls still race each other on three members. With all 2000 at
		// once (thousands of goroutines runnable under -race on a loaded
		// 2-core machine) an owner's data-plane connection once brought
		// nothing back for a second, which the transport takes for a
		// dead peer: it dropped the connection, and every check in
		// flight on it was answered by the limit's failure mode (open:
		// over-admitted), though the router would have waited 5s.
		const maxInFlight = 100
		slots := make(chan struct{}, maxInFlight)
		for k := range 200 {
			for i := range 10 {
				wg.Add(1)
				slots <- struct{}{}
				go func() {
					defer func() { <-slots; wg.Done() }()
					v := fmt.Sprintf("tenant-%d", k)
					if rlsCall(t, clients[(k+i)%3], rlsDesc("tenant", v)).GetOverallCode() == rlspb.RateLimitResponse_OK {
						mu.Lock()
						perKey[v]++
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		for k := range 200 {
			if got := perKey[fmt.Sprintf("tenant-%d", k)]; got != 5 {
				t.Fatalf("tenant-%d admitted %d, want exactly 5", k, got)
			}
		}
	})

	// No answer was degraded, and the checks were decided on all three
	// members (the inline rules reached owners that never loaded them
	// from Raft).
	var forwarded float64
	for _, s := range ss {
		mf, _ := s.Registry.Gather()
		for _, f := range mf {
			switch f.GetName() {
			case "ringlimit_rls_degraded_total":
				if v := f.GetMetric()[0].GetCounter().GetValue(); v != 0 {
					t.Errorf("%s: %v degraded answers", s.Node.ID(), v)
				}
			case "ringlimit_forwarded_checks_total":
				forwarded += f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		if s.Node.View().Rules["rls:shop/user#0"] != nil {
			t.Errorf("%s: the descriptor limit is in the cluster's rules", s.Node.ID())
		}
	}
	if forwarded == 0 {
		t.Fatal("no check was forwarded to another owner")
	}
}

// A member's gRPC health service follows its readiness (/readyz,
// Node.Ready): NOT_SERVING while it is not ready (a member whose --join
// seed never answers has no Raft leader), SERVING once it is (a lone
// seed, once it leads). Was: SERVING from the start whatever the
// readiness, so Envoy kept a member that could decide nothing in
// rotation. Real loopback gRPC: the waits are bounded polls.
func TestRLSHealthFollowsReadiness(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := dead.Addr().String()
	dead.Close() // refuses: the joiner never finds a leader
	start := func(id, join string) (*Server, healthpb.HealthClient) {
		dir := t.TempDir()
		ls := listen(t)
		if ls.GRPC, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		s, err := Start(Config{
			ID: id, HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: filepath.Join(dir, "data"), Join: []string{join}, Ring: ring.Config{Partitions: 16, ReplicationFactor: 8, Load: 1.25},
			RaftTimeout: testRaftTimeout, Router: router.Config{Timeout: testRouterTimeout},
		}, ls)
		if err != nil {
			t.Fatal(err)
		}
		shutdownAtCleanup(t, s)
		cc, err := grpc.NewClient(ls.GRPC.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return s, healthpb.NewHealthClient(cc)
	}
	status := func(hc healthpb.HealthClient, svc string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds a hang only
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health of %q: %v", svc, err)
		}
		return r.Status
	}
	services := []string{"", rlspb.RateLimitService_ServiceDesc.ServiceName}

	lost, lostHC := start("n2", nowhere)
	if err := lost.Node.Ready(); err == nil {
		t.Fatal("a member whose seed never answers is ready")
	}
	for _, svc := range services {
		if got := status(lostHC, svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("not ready (%v): health of %q = %v, want NOT_SERVING", lost.Node.Ready(), svc, got)
		}
	}

	seed, seedHC := start("n1", "")
	eventually(t, "the lone seed ready", func() bool { return seed.Node.Ready() == nil })
	for _, svc := range services {
		eventually(t, fmt.Sprintf("health of %q SERVING once ready", svc), func() bool {
			return status(seedHC, svc) == healthpb.HealthCheckResponse_SERVING
		})
	}
}
