package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// viewOnAnswer is a network whose every answer is followed, before the
// caller reads it, by the router's view moving to next (as a member's
// view follows the rules write its owner already applied), when next is
// set.
type viewOnAnswer struct {
	*network
	rt   *Router
	next *View
}

func (n *viewOnAnswer) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	err := n.network.Do(ctx, addr, req, resp)
	if n.next != nil {
		n.rt.SetView(n.next)
	}
	return err
}

// Rules written a moment ago reach the owners before a router's view: a
// rule deleted, or its burst lowered under a cost in flight. The owner
// answers "no such rule" or "bad request", and the router looks again
// under the newer view: a call of that one check fails as the router's
// own validation would (404, 400); in a call of several, the check keeps
// its failure answer and the others are decided. A check still valid
// under the newer view is decided. With no newer view within
// RefreshWait, the failure mode answers, as before. Was: every such
// check answered by the failure mode (degraded; a fail-open rule's
// checks admitted uncounted), an audit's 12 to 3,855 per delete.
func TestChecksOfRulesJustChangedAreLookedAtAgain(t *testing.T) {
	ring1 := mustRing(t, 1, "a", "b")
	def := limiter.Rule{Name: "default", Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second}
	wide := limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second, Burst: 10}
	narrow := wide
	narrow.Burst = 5
	gone := limiter.Rule{Name: "gone", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second}
	older := view.New(ring1, 7, []limiter.Rule{def, wide, gone}, 1)
	newer := view.New(ring1, 7, []limiter.Rule{def, narrow}, 2)
	nw := &network{owners: map[string]*owner{}}
	for _, id := range []string{"a", "b"} {
		o, err := node.NewOwner(id, ring1.Config().Partitions, func() int64 { return 0 }, nil)
		if err != nil {
			t.Fatal(err)
		}
		o.Apply(newer, node.PlanMoves(nil, ring1, id, nil, false, false))
		o.ExpireAwaiting(o.AwaitingParts())
		nw.owners[id+":1"] = &owner{Owner: o}
	}
	for _, tc := range []struct {
		name    string
		reqs    []Request
		noView  bool   // no newer view comes
		wantErr error  // the call's error
		want    []bool // per check: degraded (with no error)
	}{
		{name: "deleted rule, alone", reqs: []Request{{Rule: "gone", Key: "k", Cost: 1}}, wantErr: ErrUnknownRule},
		{name: "cost over the lowered burst, alone", reqs: []Request{{Rule: "r", Key: "k", Cost: 8}}, wantErr: api.ErrBadRequest},
		{name: "deleted rule among others", reqs: []Request{{Rule: "gone", Key: "k", Cost: 1}, {Rule: "default", Key: "k", Cost: 1}}, want: []bool{true, false}},
		{name: "no newer view", reqs: []Request{{Rule: "gone", Key: "k", Cost: 1}}, noView: true, want: []bool{true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := &viewOnAnswer{network: nw}
			rt, err := New(Config{Timeout: 5 * time.Second, RefreshWait: 50 * time.Millisecond}, nil, net)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			net.rt = rt
			if !tc.noView {
				net.next = newer
			}
			rt.SetView(older)
			out := make([]Result, len(tc.reqs))
			err = rt.Check(context.Background(), tc.reqs, out)
			if tc.wantErr != nil {
				var ie *ItemError
				if !errors.Is(err, tc.wantErr) || !errors.As(err, &ie) || ie.Index != 0 {
					t.Fatalf("Check = %v, want %v for checks[0]", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range tc.want {
				if out[i].Degraded != d {
					t.Errorf("checks[%d] (%s): %+v, want degraded %v", i, tc.reqs[i].Rule, out[i], d)
				}
			}
		})
	}
}
