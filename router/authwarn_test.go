package router

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// refusingNet is a data plane whose every owner refuses the connection
// (ErrAuth: the router was given no cluster secret, or another one).
type refusingNet struct{}

func (refusingNet) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	return fmt.Errorf("%w: %s: %w", transport.ErrConnClosed, addr, &transport.RemoteError{Code: transport.CodeAuth, Message: "this port requires the cluster secret"})
}

// A router whose owners refuse its connections answers every check by
// its rule's failure mode, as for an owner that is down; it also says
// why at WARN, once per authWarnEvery, not once per batch. It said
// nothing above DEBUG: a router started without --cluster-secret
// admitted everything (fail-open rules) while /readyz said ready.
func TestRouterWarnsWhenOwnersRefuseItsConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logbuf.Buffer
		rt, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil, refusingNet{})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(view.New(mustRing(t, 1, "a", "b", "c"), 7, ruleList(testRules(t)), 0))
		check := func(i int) {
			out := make([]Result, 1)
			if err := rt.Check(context.Background(), []Request{{Rule: "closed", Key: fmt.Sprint("k", i), Cost: 1}}, out); err != nil {
				t.Fatal(err)
			}
			if !out[0].Degraded || out[0].Allowed {
				t.Fatalf("check %d through refusing owners: %+v, want degraded and denied (fail-closed rule)", i, out[0])
			}
		}
		warned := func(want int) {
			t.Helper()
			got := logs.String()
			if n := strings.Count(got, "level=WARN"); n != want || !strings.Contains(got, "--cluster-secret") || !strings.Contains(got, "requires the cluster secret") {
				t.Fatalf("%d WARN lines, want %d naming --cluster-secret and the owner's reason:\n%s", n, want, got)
			}
		}
		for i := range 20 {
			check(i)
		}
		warned(1)
		time.Sleep(authWarnEvery / 2)
		check(20)
		warned(1)
		time.Sleep(authWarnEvery / 2)
		check(21)
		warned(2)
	})
}
