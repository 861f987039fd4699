package main

import (
	"context"
	"flag"
	"fmt"
	"math"
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
// together by ctx. First stopping turns readiness to 503 (stoppable) and
// d drains (its port closes; every answer closes its connection), in
// that order, so that an answer that closes its connection (its request
// came once d drained: httpapi.Server.serve) is never one that says
// ready: keep-alive clients open their next connection elsewhere after an
// answer, never under a request. (Was: d drained first, and a readiness
// check in between was answered "no cluster view yet" with Connection:
// close, a flaky TestRouterStopDrainsItsConnections.)
// The step ends when no
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
	stopping.Store(true)
	d.Drain()
	httpapi.WaitDrained(ctx, d, math.MaxInt64) // at most half of ctx
	return shutdown(ctx)
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
