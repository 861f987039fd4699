package rls

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// idleListener accepts no connection until it is closed: Serve runs
// (and starts its pollers) inside a synctest bubble without a socket.
type idleListener struct {
	closed chan struct{}
	once   sync.Once
}

func (l *idleListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *idleListener) Close() error              { l.once.Do(func() { close(l.closed) }); return nil }
func (l *idleListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// The health service follows the serving process's readiness
// (Options.Ready, its /readyz): NOT_SERVING until Serve has read it,
// then SERVING only while it is ready, for the server ("") and the RLS
// service alike, within readyPoll of a change, and NOT_SERVING from
// Shutdown on. Was: SERVING whatever the readiness, so Envoy kept a
// router with no view (every call Unavailable) or a member with no Raft
// leader in rotation. Fake time: the status is read from the health
// server in process.
func TestHealthFollowsReadiness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var notReady atomic.Pointer[error] // nil = ready
		noView := errors.New("unavailable: no cluster view yet")
		notReady.Store(&noView)
		var calls atomic.Int64
		s, err := New(Options{Interval: -1, Ready: func() error {
			calls.Add(1)
			if e := notReady.Load(); e != nil {
				return *e
			}
			return nil
		}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
			r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("Check(%q): %v", svc, err)
			}
			return r.Status
		}
		const serving, notServing = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
		expect := func(when string, want healthpb.HealthCheckResponse_ServingStatus) {
			t.Helper()
			for _, svc := range []string{"", rlspb.RateLimitService_ServiceDesc.ServiceName} {
				if got := status(svc); got != want {
					t.Errorf("%s: health of %q = %v, want %v", when, svc, got, want)
				}
			}
		}
		expect("before Serve, not ready", notServing)
		ln := &idleListener{closed: make(chan struct{})}
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		synctest.Wait()
		expect("served, no view yet", notServing)

		start := time.Now()
		for _, step := range []struct {
			at    time.Duration // since Serve
			ready bool          // from then on
			want  healthpb.HealthCheckResponse_ServingStatus
		}{
			{0, true, notServing},                            // read at Serve: not ready
			{readyPoll - time.Millisecond, true, notServing}, // ready since 0; not read yet
			{readyPoll, false, serving},                      // read: ready
			{2*readyPoll - time.Millisecond, false, serving},
			{2 * readyPoll, false, notServing}, // read: not ready (a stale view, no leader)
			{5 * readyPoll, true, notServing},
			{6 * readyPoll, true, serving},
		} {
			time.Sleep(time.Until(start.Add(step.at)))
			synctest.Wait()
			expect("at "+step.at.String(), step.want)
			if step.ready {
				notReady.Store(nil)
			} else {
				notReady.Store(&noView)
			}
		}
		if n := calls.Load(); n != 7 {
			t.Errorf("Ready read %d times in 6 polls' time, want 7 (once at Serve, then once a poll)", n)
		}

		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		expect("after Shutdown, ready", notServing)
		time.Sleep(2 * readyPoll)
		synctest.Wait()
		expect("after Shutdown, 2 polls later", notServing)
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	})
}
