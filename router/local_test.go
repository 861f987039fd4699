package router

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// stuckOwner is a local owner that would wait (no lease, say): it is not
// prompt, and it decides nothing before its context ends.
type stuckOwner struct{ prompt bool }

func (o *stuckOwner) Prompt(*transport.BatchRequest) bool { return o.prompt }

func (o *stuckOwner) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	<-ctx.Done()
	for i := range resp.Results {
		resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
	}
}

// A local owner that would wait is waited for Timeout, as a remote owner
// is, whatever the caller's context allows: then the rule's failure mode
// answers. It was waited for as long as the owner chose (2 s for a lease).
func TestRouterWaitsForALocalOwnerNoLongerThanTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := testRules(t)
		r1 := mustRing(t, 1, "a")
		rt, err := New(Config{Self: "a", Timeout: 250 * time.Millisecond}, &stuckOwner{}, &network{})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rt.SetView(view.New(r1, 7, ruleList(rules), 0))
		start := time.Now()
		out := make([]Result, 1)
		if err := rt.Check(context.Background(), []Request{{Rule: "closed", Key: "x", Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 250*time.Millisecond {
			t.Errorf("answered after %v, want the router's timeout of 250ms", took)
		}
		if out[0].Allowed || !out[0].Degraded {
			t.Errorf("got %+v, want denied and degraded (fail closed)", out[0])
		}
	})
}
