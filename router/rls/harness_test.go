package rls

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

// owner is a one-member cluster's owner without Raft: it decides every
// check (every group of joined checks, all-or-nothing) with a real
// bucket table at a clock the test sets, under the check's inline rule,
// refusing one without it (this package only ever sends inline rules).
type owner struct {
	table *limiter.Table
	now   atomic.Int64
}

func (o *owner) HandleBatch(_ context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	resp.Epoch = 1
	for i := 0; i < len(req.Checks); {
		end := i + 1 // a group: the joined checks after i
		for end < len(req.Checks) && req.Checks[end].Joined {
			end++
		}
		items := make([]limiter.Item, 0, end-i)
		for _, c := range req.Checks[i:end] {
			in := c.Inline
			r := &limiter.Rule{Name: c.Rule, Algorithm: limiter.Algorithm(in.Algorithm), FailureMode: limiter.FailureMode(in.FailureMode), Limit: in.Limit, Period: in.Period, Burst: in.Burst}
			if r.Validate() != nil {
				items = nil
				break
			}
			items = append(items, limiter.Item{Part: c.Partition, Bucket: limiter.BucketHash(c.KeyHash, limiter.RuleSalt(3, r.Name, r.Algorithm)), Rule: r, Cost: int64(c.Cost)})
		}
		ds := make([]limiter.Decision, end-i)
		_, err := o.table.CheckGroup(items, o.now.Load(), ds)
		for k := range ds {
			d := ds[k]
			resp.Results[i+k] = transport.Result{Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter}
			if items == nil || err != nil {
				resp.Results[i+k] = transport.Result{Status: transport.StatusBadRequest}
			}
		}
		i = end
	}
}

// env is a Server on a one-member router over an in-memory gRPC
// connection, with the generated client.
type env struct {
	owner  *owner
	srv    *Server
	reg    *prometheus.Registry
	client rlspb.RateLimitServiceClient
	cc     *grpc.ClientConn // for calls the generated client cannot make
	dir    string
}

// t0 is a minute boundary, so a fixed window of a minute starts there.
const t0 = int64(1_800_000_000) * int64(time.Second)

// newEnv writes config (when not "") to a file in a temp dir and serves it.
func newEnv(t *testing.T, config string, opts Options) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), reg: prometheus.NewRegistry()}
	if config != "" {
		opts.ConfigPath = filepath.Join(e.dir, "config.yaml")
		writeFile(t, opts.ConfigPath, config)
	}
	tab, err := limiter.NewTable(16)
	if err != nil {
		t.Fatal(err)
	}
	e.owner = &owner{table: tab}
	e.owner.now.Store(t0)
	rg, err := ring.New(ring.Config{Partitions: 16, ReplicationFactor: 8, Load: 1.25}, 1, []ring.Member{{ID: "self", Peer: "self:1"}})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(router.Config{Self: "self"}, e.owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt.SetView(&router.View{Ring: rg, Seed: 3})
	t.Cleanup(rt.Close)
	opts.Registerer = e.reg
	opts.Interval = -1 // tests reload by hand
	e.srv, err = New(opts, rt)
	if err != nil {
		t.Fatal(err)
	}
	ln := bufconn.Listen(1 << 20)
	go func() { _ = e.srv.Serve(ln) }()
	t.Cleanup(func() { _ = e.srv.Shutdown(context.Background()) })
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	e.cc, e.client = cc, rlspb.NewRateLimitServiceClient(cc)
	return e
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonpb.RateLimitDescriptor {
	d := &commonpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (e *env) call(t *testing.T, domain string, hits uint32, ds ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := e.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s, %v): %v", domain, ds, err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// counter returns ringlimit_rls_descriptors_total{key, result}.
func (e *env) counter(key, result string) float64 {
	return testutil.ToFloat64(e.srv.m.descriptors.WithLabelValues(key, result))
}

// step is one call and what its first descriptor's status must be.
type step struct {
	domain string
	hits   uint32
	d      *commonpb.RateLimitDescriptor
	code   rlspb.RateLimitResponse_Code
	remain uint32
	limit  uint32 // current_limit.requests_per_unit
	none   bool   // no current_limit expected
}

func (e *env) run(t *testing.T, steps []step) {
	t.Helper()
	for i, s := range steps {
		st := e.call(t, s.domain, s.hits, s.d).Statuses[0]
		var limit uint32
		if st.CurrentLimit != nil {
			limit = st.CurrentLimit.RequestsPerUnit
		}
		if st.Code != s.code || st.LimitRemaining != s.remain || limit != s.limit || s.none != (st.CurrentLimit == nil) {
			t.Errorf("step %d: ShouldRateLimit(%s, %v, hits %d) = %v remaining %d limit %v; want %v remaining %d limit %d",
				i, s.domain, s.d.Entries, s.hits, st.Code, st.LimitRemaining, st.CurrentLimit, s.code, s.remain, s.limit)
		}
	}
}

// testutilValue returns ringlimit_rls_config_loads_total{result}.
func testutilValue(e *env, result string) float64 {
	return testutil.ToFloat64(e.srv.m.reloads.WithLabelValues(result))
}
