package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// viewMember is a member's GET /v1/cluster/view in memory (an
// http.RoundTripper): it answers the view while up, 503 otherwise.
type viewMember struct {
	body []byte
	up   atomic.Bool
}

func newViewMember(t *testing.T) *viewMember {
	t.Helper()
	r, err := ring.New(ring.Config{Partitions: 8, ReplicationFactor: 4, Load: 1.25}, 1, []ring.Member{{ID: "a", HTTP: "a:8080", Peer: "a:1"}})
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(httpapi.ViewOf(view.New(r, 1, rules.Effective(nil), 1)))
	if err != nil {
		t.Fatal(err)
	}
	return &viewMember{body: body}
}

func (m *viewMember) RoundTrip(req *http.Request) (*http.Response, error) {
	status, body := http.StatusOK, m.body
	if !m.up.Load() || req.URL.Path != "/v1/cluster/view" {
		status, body = http.StatusServiceUnavailable, []byte(`{"error":"unavailable","message":"stopping"}`)
	}
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(body)), Request: req}, nil
}

// A router's /readyz follows its Ring's readiness, as README says: 503
// before its first view, 200 once it has one, and 503 again ("cluster
// view stale") once no member has given it one for 10 refreshes (10 s
// at least), until one does; GET /v1/rules meanwhile still lists the
// old view's rules, which its checks still decide by. Was: ready for as
// long as it had any view (httpapi.RouterFront), so a router whose one
// member had stopped answered 200 and routed by its old ring. Fake time:
// the Ring reads the view through an in-memory transport.
func TestRouterReadyzFollowsViewAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newViewMember(t)
		rc, err := client.NewRing(client.RingConfig{Members: []string{"a:8080"}, Refresh: time.Second,
			HTTPClient: &http.Client{Transport: m}})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		h := routerHandler(rc, ringReadiness(rc), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		get := func(path string) (int, string) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			return rec.Code, rec.Body.String()
		}
		start := time.Now()
		for _, step := range []struct {
			at        time.Duration // since start (reads at every whole second)
			up        bool          // the member answers from then on
			wantReady int
			wantWhy   string // in /readyz's body
			wantRules int
		}{
			{0, false, 503, "no cluster view yet", 503},
			{1500 * time.Millisecond, true, 503, "no cluster view yet", 503}, // up after the read at 1s
			{2500 * time.Millisecond, false, 200, "ready", 200},              // read at 2s; the member then stops
			{11500 * time.Millisecond, false, 200, "ready", 200},             // 9.5s since the last read
			{12500 * time.Millisecond, false, 503, "cluster view stale: last read 11s ago", 200},
			{30500 * time.Millisecond, true, 503, "cluster view stale: last read 29s ago", 200},
			{31500 * time.Millisecond, true, 200, "ready", 200}, // read at 31s
		} {
			time.Sleep(time.Until(start.Add(step.at)))
			synctest.Wait()
			code, body := get("/readyz")
			rules, _ := get("/v1/rules")
			if code != step.wantReady || !strings.Contains(body, step.wantWhy) || rules != step.wantRules {
				t.Errorf("at %v: /readyz %d %s, /v1/rules %d; want %d saying %q, rules %d",
					step.at, code, strings.TrimSpace(body), rules, step.wantReady, step.wantWhy, step.wantRules)
			}
			if step.wantReady == 503 && !strings.Contains(body, `"error":"`+api.CodeUnavailable+`"`) {
				t.Errorf("at %v: /readyz %s, want error %q", step.at, body, api.CodeUnavailable)
			}
			m.up.Store(step.up)
		}
	})
}

// A router's gRPC health service (beside its RLS) follows its /readyz:
// with no view (its one --cluster member refuses), /readyz answers 503
// and the health of "" and of the RLS service is NOT_SERVING. Was:
// SERVING while every RLS call failed Unavailable, so Envoy kept it in
// rotation. Real sockets (runRouter as the command runs it): the waits
// are bounded polls.
func TestRouterHealthFollowsReadyz(t *testing.T) {
	member, httpAddr, grpcAddr := freePort(t), freePort(t), freePort(t) // member: nothing listens
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- runRouter(ctx, []string{"--http", httpAddr, "--cluster", member, "--grpc", grpcAddr, "--log-level", "error"},
			func(string) string { return "" }, io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("router exited %d", code)
		}
	}()
	var readyz string
	eventually(t, "/readyz answering", func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		readyz = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
		return true
	})
	if !strings.HasPrefix(readyz, "503 ") || !strings.Contains(readyz, "no cluster view yet") {
		t.Fatalf("/readyz %s, want 503 no cluster view yet", readyz)
	}
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for _, svc := range []string{"", rlspb.RateLimitService_ServiceDesc.ServiceName} {
		hctx, hcancel := context.WithTimeout(ctx, 10*time.Second) // bounds a hang only
		r, err := hc.Check(hctx, &healthpb.HealthCheckRequest{Service: svc})
		hcancel()
		if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("/readyz %s; health of %q: %v, %v; want NOT_SERVING", readyz, svc, r.GetStatus(), err)
		}
	}
}
