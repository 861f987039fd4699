package rls

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

// down is an owner that never answers.
type down struct{}

func (down) Do(ctx context.Context, _ string, _ *transport.BatchRequest, _ *transport.BatchResponse) error {
	<-ctx.Done()
	return ctx.Err()
}

// serviceOwnerDown is a service whose every key's owner never answers
// (the router's timeout is 250ms), with one open and one closed limit.
// Call it inside a synctest bubble.
func serviceOwnerDown(t *testing.T) (*Service, *metrics) {
	t.Helper()
	rg, err := ring.New(ring.Config{Partitions: 16, ReplicationFactor: 8, Load: 1.25}, 1, []ring.Member{{ID: "far", Peer: "far:1"}})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(router.Config{Timeout: 250 * time.Millisecond}, nil, down{})
	if err != nil {
		t.Fatal(err)
	}
	return openClosedService(t, rt, rg, false, "second", 1)
}

// openClosedService is a service on rt (its view: ring rg, seed 3) of
// domain d with two limits of perUnit per unit, keys open and closed,
// failing open and closed.
func openClosedService(t *testing.T, rt *router.Router, rg *ring.Ring, headers bool, unit string, perUnit int) (*Service, *metrics) {
	t.Helper()
	t.Cleanup(rt.Close)
	rt.SetView(&router.View{Ring: rg, Seed: 3})
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(rt, headers, m)
	c, err := ParseConfig(File{Name: "f.yaml", Data: []byte(fmt.Sprintf(`
domain: d
descriptors:
  - key: open
    rate_limit: {unit: %[1]s, requests_per_unit: %[2]d}
  - key: closed
    rate_limit: {unit: %[1]s, requests_per_unit: %[2]d, failure_mode: closed}
`, unit, perUnit))})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(c)
	return svc, m
}

// When a key's owner does not answer within the router's timeout, each
// limit's failure_mode answers: open is OK, closed is OVER_LIMIT; both
// are counted as degraded. Fake time: the timeout passes instantly.
func TestOwnerDownFailureMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc, m := serviceOwnerDown(t)
		start := time.Now()
		resp, err := svc.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "d",
			Descriptors: []*commonpb.RateLimitDescriptor{desc("open", "x"), desc("closed", "x")}})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 250*time.Millisecond {
			t.Errorf("answered after %v, want the router's timeout 250ms", waited)
		}
		if resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over || resp.OverallCode != over {
			t.Fatalf("owner down: %v; want open OK, closed OVER_LIMIT", resp)
		}
		// The closed limit's denial says when to try again, as the HTTP
		// API's retry_after_ms does (a period, at most 1 s). Was: 0s.
		if got := resp.Statuses[1].DurationUntilReset.AsDuration(); got != time.Second {
			t.Errorf("closed, owner down: duration_until_reset %v, want 1s", got)
		}
		// The open limit's pass knows nothing of its count: a bare OK,
		// with no current_limit for Envoy to turn into "0 remaining".
		if st := resp.Statuses[0]; st.CurrentLimit != nil || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
			t.Errorf("open, owner down: %v; want a bare OK", st)
		}
		if got := testutil.ToFloat64(m.degraded); got != 2 {
			t.Fatalf("degraded counted %v, want 2", got)
		}
	})
}

// The poll loop puts a changed file in force within one interval and
// the settle wait (100 ms), keeps the old config while the file is bad,
// and never puts in force a file caught while it is being written. Fake
// time: no waiting.
func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: one\n")
	synctest.Test(t, func(t *testing.T) {
		s, err := New(Options{ConfigPath: dir, Interval: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.watch(ctx)
		domains := func() []string {
			var ds []string
			for d := range s.Service().Config().domains {
				ds = append(ds, d)
			}
			return ds
		}
		write("domain: two\n")
		time.Sleep(time.Second + 100*time.Millisecond)
		synctest.Wait()
		if ds := domains(); len(ds) != 1 || ds[0] != "two" {
			t.Fatalf("after a change and one interval: domains %v, want [two]", ds)
		}
		write("domain: [\n")
		time.Sleep(time.Second + 100*time.Millisecond)
		synctest.Wait()
		if ds := domains(); len(ds) != 1 || ds[0] != "two" {
			t.Fatalf("after a bad file: domains %v, want [two] still", ds)
		}
		write("domain: three\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
		time.Sleep(time.Second + 100*time.Millisecond)
		synctest.Wait()
		if ds := domains(); len(ds) != 1 || ds[0] != "three" || s.Service().Config().Limits() != 1 {
			t.Fatalf("after a fix: domains %v, want [three]", ds)
		}
		// Half written at the poll, whole 50 ms later: the half is never
		// in force (it is valid YAML, one limit short), the whole is at
		// the next poll. Was: the half was put in force until then.
		whole := "domain: four\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 1}\n"
		write(whole[:strings.Index(whole, "  - key: b")]) // at 3.3 s; the poll at 4 s reads it
		time.Sleep(750 * time.Millisecond)
		write(whole) // at 4.05 s, in the settle wait
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if ds := domains(); len(ds) != 1 || ds[0] != "three" {
			t.Fatalf("a file caught half written: domains %v, want [three] still", ds)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if ds := domains(); len(ds) != 1 || ds[0] != "four" || s.Service().Config().Limits() != 2 {
			t.Fatalf("the whole file at the next poll: domains %v with %d limits, want [four] with 2", ds, s.Service().Config().Limits())
		}
		cancel()
	})
}

// Envoy calls with a deadline (its filter's timeout, 20ms by default),
// shorter than the router's owner timeout: the limits' failure modes
// answer just before it, so a closed limit denies instead of the call
// failing and Envoy deciding for every limit alike.
func TestFailureModeBeforeTheCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc, m := serviceOwnerDown(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		resp, err := svc.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "d",
			Descriptors: []*commonpb.RateLimitDescriptor{desc("open", "x"), desc("closed", "x")}})
		if err != nil {
			t.Fatalf("call with a 20ms deadline and the owner down: %v", err)
		}
		if waited := time.Since(start); waited != 15*time.Millisecond {
			t.Errorf("answered after %v, want 15ms (a quarter of the deadline kept)", waited)
		}
		if resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
			t.Fatalf("owner down: %v; want open OK, closed OVER_LIMIT", resp)
		}
		if got := testutil.ToFloat64(m.degraded); got != 2 {
			t.Fatalf("degraded counted %v, want 2", got)
		}
	})
}

// halfDown answers every check sent to near:1 (allowed, 5 remaining) and
// never answers those sent to far:1.
type halfDown struct{}

func (halfDown) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	if addr != "near:1" {
		<-ctx.Done()
		return ctx.Err()
	}
	resp.Epoch = 1
	resp.Results = resp.Results[:0]
	for range req.Checks {
		resp.Results = append(resp.Results, transport.Result{Status: transport.StatusOK, Allowed: true, Limit: 10, Remaining: 5})
	}
	return nil
}

// When one owner is slow and the caller's deadline comes first, only the
// descriptors that owner holds are answered by their failure mode; the
// others keep their owners' answers. Was: every descriptor of the call
// was answered by its failure mode, closed ones OVER_LIMIT, although
// their owners had decided (and spent) them — and the closed denials
// said duration_until_reset 0s.
func TestDeadlineDegradesOnlyTheSlowOwnersDescriptors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg, err := ring.New(ring.Config{Partitions: 16, ReplicationFactor: 8, Load: 1.25}, 1,
			[]ring.Member{{ID: "near", Peer: "near:1"}, {ID: "far", Peer: "far:1"}})
		if err != nil {
			t.Fatal(err)
		}
		rt, err := router.New(router.Config{Timeout: 250 * time.Millisecond}, nil, halfDown{})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(&router.View{Ring: rg, Seed: 3})
		svc, _ := serviceOwnerDown(t)
		svc.checker = rt
		var ds []*commonpb.RateLimitDescriptor
		for i := range 20 {
			ds = append(ds, desc([]string{"open", "closed"}[i%2], fmt.Sprint("v", i)))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		resp, err := svc.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "d", Descriptors: ds})
		if err != nil {
			t.Fatalf("call with a 20ms deadline and one owner down: %v", err)
		}
		answered, degraded := 0, 0
		for i, st := range resp.Statuses {
			closed := i%2 == 1
			switch {
			case st.Code == ok && st.LimitRemaining == 5:
				answered++ // near's answer
			case closed && st.Code == over && st.DurationUntilReset.AsDuration() == time.Second,
				!closed && st.Code == ok && st.CurrentLimit == nil && st.DurationUntilReset == nil:
				degraded++ // far's keys: the failure mode
			default:
				t.Errorf("descriptor %d (closed %v): %v; want near's answer (OK, 5 remaining) or the failure mode", i, closed, st)
			}
		}
		if answered == 0 || degraded == 0 {
			t.Fatalf("%d answered by their owner, %d by the failure mode; want some of each (two owners, one down)", answered, degraded)
		}
	})
}

// A Kubernetes ConfigMap volume: the files are symlinks through ..data to
// a hidden timestamped directory, and an update swaps ..data. The
// directory's files load through the links, the hidden entries are not
// read as config, and the swap is seen as a change.
func TestConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	version := func(name, domain string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "limits.yaml"), []byte("domain: "+domain+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_30_01", "first")
	if err := os.Symlink(filepath.Join("..data", "limits.yaml"), filepath.Join(dir, "limits.yaml")); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{ConfigPath: dir, Interval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Service().Config().domains["first"]; !ok || s.Service().Config().Domains() != 1 {
		t.Fatalf("domains %v, want [first]", s.Service().Config().domains)
	}
	version("..2026_11_30_02", "second")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Service().Config().domains["second"]; !ok || s.Service().Config().Domains() != 1 {
		t.Fatalf("after the swap: domains %v, want [second]", s.Service().Config().domains)
	}
}

// The server answers gRPC's health checks, as envoyproxy/ratelimit's
// does (Envoy health-checks its rate-limit cluster with them): SERVING
// for the server and the RLS service, until Shutdown (no Options.Ready:
// always ready; see TestHealthFollowsReadiness). Was: Unimplemented.
// Real loopback gRPC: the deadline only bounds a hang.
func TestHealthService(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{ConfigPath: dir, Interval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v, %v; want SERVING", svc, resp, err)
		}
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v, %v", r, err)
	}
	// An open watch (gRPC clients health-check with one) neither keeps
	// Shutdown waiting nor outlives it: it sees NOT_SERVING, or its end.
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a health watch open: %v", err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			break
		}
		if r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("watch during Shutdown: %v; want NOT_SERVING or the stream's end", r)
		}
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// A directory's config files are its *.yaml and *.yml files, whatever
// the case of the extension (was: A.YAML skipped without a word); a
// config that holds no domain (another layout, an empty directory) is
// loaded, and said in a warning, since every call is then answered OK.
func TestConfigDirectoryFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "A.YAML"), []byte("domain: upper\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{ConfigPath: dir, Interval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Service().Config().domains["upper"]; !ok {
		t.Fatalf("domains %v, want [upper] from A.YAML", s.Service().Config().domains)
	}
	var logs logbuf.Buffer
	other := t.TempDir()
	if err := os.Mkdir(filepath.Join(other, "config"), 0o755); err != nil { // envoyproxy/ratelimit's layout
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "config", "d.yaml"), []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{ConfigPath: other, Interval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "level=WARN msg=\"envoy config holds no domain") {
		t.Fatalf("no warning for a config with no domain; logs:\n%s", logs.String())
	}
}

// A config whose domain has descriptors but no rate_limit in any (a file
// cut short by a writer that stalled: its domain and first key) is
// loaded, as envoyproxy/ratelimit loads it, and said in a warning that
// names the domain; a domain with a limit somewhere below is not named.
// Was: loaded with 0 limits in silence, every call answered OK (a helper
// attacking the RLS door).
func TestConfigDomainWithoutLimitsIsWarned(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cut.yaml", "domain: cut\ndescriptors:\n  - key: message_type\n")
	write("nested.yaml", "domain: nested\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 5}\n")
	var logs logbuf.Buffer
	if _, err := New(Options{ConfigPath: dir, Interval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN msg=\"envoy config: domains with no rate_limit") || !strings.Contains(out, "domains=[cut]") {
		t.Fatalf("want a warning naming domain cut alone; logs:\n%s", out)
	}
}

// serviceHalfDown is a service with headers on whose keys are owned by
// "self" (a live owner at t0) or by "far" (never answers; the router's
// timeout is 250ms), with one open and one closed limit per minute; and
// a function returning a value of key whose descriptor is owned by id.
// Call it inside a synctest bubble.
func serviceHalfDown(t *testing.T) (*Service, func(key, id string) string) {
	t.Helper()
	rg, err := ring.New(ring.Config{Partitions: 16, ReplicationFactor: 8, Load: 1.25}, 1,
		[]ring.Member{{ID: "self", Peer: "self:1"}, {ID: "far", Peer: "far:1"}})
	if err != nil {
		t.Fatal(err)
	}
	tab, err := limiter.NewTable(16)
	if err != nil {
		t.Fatal(err)
	}
	live := &owner{table: tab}
	live.now.Store(t0)
	rt, err := router.New(router.Config{Self: "self", Timeout: 250 * time.Millisecond}, live, down{})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := openClosedService(t, rt, rg, true, "minute", 5)
	ownedBy := func(key, id string) string {
		for i := range 1000 {
			v := fmt.Sprint("v", i)
			_, m, _ := rg.OwnerOfKey(limiter.KeyHash(3, svc.counterKey(new(scratch), desc(key, v).Entries)))
			if m.ID == id {
				return v
			}
		}
		t.Fatalf("no value of %s owned by %s", key, id)
		return ""
	}
	return svc, ownedBy
}

// The x-ratelimit-* headers describe what an owner decided. A status
// its limit's failure mode answered (the owner did not) says nothing of
// the limit's state: an open one that let the hit through is not
// described; a closed one that denied is, as the denial, with its 1 s
// retry. So an OK answer whose every limit was degraded has no headers.
// Was: the degraded open status (0 remaining, reset 0) won the least
// remaining, and an allowed answer said x-ratelimit-remaining: 0.
func TestHeadersSkipDegradedStatuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc, ownedBy := serviceHalfDown(t)
		openLive, openFar, closedFar := desc("open", ownedBy("open", "self")), desc("open", ownedBy("open", "far")), desc("closed", ownedBy("closed", "far"))
		for _, tt := range []struct {
			name string
			ds   []*commonpb.RateLimitDescriptor
			code rlspb.RateLimitResponse_Code
			want map[string]string // nil: no x-ratelimit headers
		}{
			{"open decided, open degraded", []*commonpb.RateLimitDescriptor{openLive, openFar}, ok,
				map[string]string{"x-ratelimit-limit": "5, 5;w=60", "x-ratelimit-remaining": "4", "x-ratelimit-reset": "60"}},
			{"open degraded, open decided", []*commonpb.RateLimitDescriptor{openFar, openLive}, ok,
				map[string]string{"x-ratelimit-limit": "5, 5;w=60", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "60"}},
			{"open degraded alone", []*commonpb.RateLimitDescriptor{openFar}, ok, nil},
			{"closed degraded", []*commonpb.RateLimitDescriptor{closedFar}, over,
				map[string]string{"x-ratelimit-limit": "5, 5;w=60", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"}},
			{"open decided, closed degraded", []*commonpb.RateLimitDescriptor{openLive, closedFar}, over,
				map[string]string{"x-ratelimit-limit": "5, 5;w=60", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"}},
		} {
			resp, err := svc.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "d", Descriptors: tt.ds})
			if err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			var got map[string]string
			for _, h := range resp.ResponseHeadersToAdd {
				if got == nil {
					got = map[string]string{}
				}
				got[h.Key] = h.Value
			}
			if resp.OverallCode != tt.code || !maps.Equal(got, tt.want) {
				t.Errorf("%s: %v with headers %v; want %v with %v", tt.name, resp.OverallCode, got, tt.code, tt.want)
			}
		}
	})
}
