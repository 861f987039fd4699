package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/router/httpapi"
)

// drainFlag is --drain-timeout of a router or a gateway: how long its
// stop may take (stopDraining).
func drainFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("drain-timeout", 10*time.Second,
		"how long SIGTERM may take: /readyz answers 503, the port closes and every answer closes its connection until none is open or none has sent for 250ms (at most half of this), then the connections left are closed once their requests in progress finish")
}

// checkDrain refuses a --drain-timeout that leaves no time to stop in.
func checkDrain(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("--drain-timeout: must be > 0, got %v", d)
	}
	return nil
}

// stopDraining is a router's or a gateway's stop, in two steps bounded
// together by ctx. First d drains (its port closes; every answer closes
// its connection) and stopping turns readiness to 503 (stoppable), in
// that order: keep-alive clients open their next connection elsewhere
// after an answer, never under a request. The step ends when no
// connection is open, or none has sent a request for
// httpapi.DrainQuiet, or half of ctx's time is spent. Then shutdown
// closes what is left once its requests in progress are answered.
//
// Was: SIGTERM closed the port and every idle keep-alive connection at
// once, under clients that were sending a request on one that very
// moment: a POST that left and got EOF or a reset, which its client
// cannot tell from one that was counted (0–15 a stop of a router under
// 32 busy clients; BENCHMARKS round twenty-nine).
func stopDraining(ctx context.Context, d httpapi.Drainer, stopping *atomic.Bool, shutdown func(context.Context) error) error {
	d.Drain()
	stopping.Store(true)
	step := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		step = time.Until(dl) / 2
	}
	first, cancel := context.WithTimeout(ctx, step)
	defer cancel()
	httpapi.DrainConns(first, d)
	return shutdown(ctx)
}

// drainHTTP drains a net/http server as httpapi.Server.Drain does its
// own: Drain closes its port (net/http goes on serving the connections
// it has), every answer from then on carries Connection: close (net/http
// then closes the connection after it), OpenConns counts the server's
// connections (hijacked ones leave the count) and LastRequest says when
// a request last came while draining.
type drainHTTP struct {
	draining atomic.Bool
	open     atomic.Int64
	lastReq  atomic.Int64 // while draining: when a request last came (Unix ns)
	ln       net.Listener
	once     sync.Once
}

// serve serves srv on ln, draining through d.
func (d *drainHTTP) serve(srv *http.Server, ln net.Listener) {
	h := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.draining.Load() {
			w.Header().Set("Connection", "close")
			d.lastReq.Store(time.Now().UnixNano())
		}
		h.ServeHTTP(w, r)
	})
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			d.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			d.open.Add(-1)
		}
	}
	d.ln = ln
	go func() { _ = srv.Serve(onceListener{ln, &d.once}) }()
}

func (d *drainHTTP) Drain() {
	d.draining.Store(true)
	_ = onceListener{d.ln, &d.once}.Close()
}

func (d *drainHTTP) OpenConns() int { return int(d.open.Load()) }

func (d *drainHTTP) LastRequest() time.Time {
	if ns := d.lastReq.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// onceListener closes its listener once, by Drain or by the server's
// Shutdown (which would report the second close as its error).
type onceListener struct {
	net.Listener
	once *sync.Once
}

func (l onceListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

// stoppable is ready, answering 503 once stopping is set: the first
// step of a stop (stopDraining) takes the process out of rotation.
func stoppable(stopping *atomic.Bool, ready func() error) func() error {
	return func() error {
		if stopping.Load() {
			return fmt.Errorf("%w: stopping (draining its connections)", api.ErrUnavailable)
		}
		return ready()
	}
}
