package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
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

// rulesChanged returns two views of rg: rules version 1 with "default",
// "r" (burst 10) and "gone"; version 2 with "r" narrowed to burst 5 and
// "gone" deleted.
func rulesChanged(rg *ring.Ring) (older, newer *View) {
	def := limiter.Rule{Name: "default", Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second}
	wide := limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second, Burst: 10}
	narrow := wide
	narrow.Burst = 5
	gone := limiter.Rule{Name: "gone", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second}
	return view.New(rg, 7, []limiter.Rule{def, wide, gone}, 1), view.New(rg, 7, []limiter.Rule{def, narrow}, 2)
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
	older, newer := rulesChanged(ring1)
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

// lagging is a ViewSource whose reads give its views in turn, the last
// one again and again: a member that applies a rules write a moment
// after the owner did.
type lagging struct {
	mu    sync.Mutex
	views []*View
	reads int
}

func (l *lagging) FetchView(context.Context) (*View, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.views[min(l.reads, len(l.views)-1)]
	l.reads++
	return v, nil
}

func (l *lagging) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reads
}

// A following router that meets an owner with newer rules reads the
// view at once and, while the member it reads still serves the older
// rules, again every refetchGap until RefreshWait ends: a lone check of
// a rule just deleted, or whose burst was just lowered under its cost,
// is answered 404 or 400 once the member has the write, not by its
// failure mode. With no newer view, the failure mode answers after
// RefreshWait, the reads bounded by one per refetchGap, and Follow
// goes back to its period. A rule gone from the view just read is 404
// at once, not read for again. Was: one read; when it came a few ms early
// (an audit: a PUT sent to a follower, the view read from another
// member), the check waited the whole RefreshWait and was admitted
// degraded (fail-open) in 4 of 8 trials.
func TestRestaleReadsTheViewUntilItHasTheNewerRules(t *testing.T) {
	ring1 := mustRing(t, 1, "a")
	older, newer := rulesChanged(ring1)
	const wait = 500 * time.Millisecond // RefreshWait
	for _, tc := range []struct {
		name      string
		req       Request
		views     []*View       // the member's answers to the router's reads, in turn
		wantErr   error         // nil: answered by the failure mode (degraded)
		wantAfter time.Duration // when the check is answered
		wantReads int           // view reads by then (the first is Follow's start)
	}{
		{name: "deleted rule, the member a read behind", req: Request{Rule: "gone", Key: "k", Cost: 1},
			views: []*View{older, older, newer}, wantErr: ErrUnknownRule, wantAfter: refetchGap, wantReads: 3},
		{name: "cost over the lowered burst, the member two reads behind", req: Request{Rule: "r", Key: "k", Cost: 8},
			views: []*View{older, older, older, newer}, wantErr: api.ErrBadRequest, wantAfter: 2 * refetchGap, wantReads: 4},
		{name: "deleted rule, the member up to date", req: Request{Rule: "gone", Key: "k", Cost: 1},
			views: []*View{older, newer}, wantErr: ErrUnknownRule, wantAfter: 0, wantReads: 2},
		{name: "no newer view", req: Request{Rule: "gone", Key: "k", Cost: 1},
			views: []*View{older}, wantAfter: wait, wantReads: 1 + int(wait/refetchGap)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o, err := node.NewOwner("a", ring1.Config().Partitions, func() int64 { return 0 }, nil)
				if err != nil {
					t.Fatal(err)
				}
				o.Apply(newer, node.PlanMoves(nil, ring1, "a", nil, false, false))
				o.ExpireAwaiting(o.AwaitingParts())
				nw := &network{owners: map[string]*owner{"a:1": {Owner: o}}}
				rt, err := New(Config{Timeout: 5 * time.Second, RefreshWait: wait}, nil, nw)
				if err != nil {
					t.Fatal(err)
				}
				defer rt.Close()
				src := &lagging{views: tc.views}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				go func() { _ = rt.Follow(ctx, src, time.Hour) }()
				synctest.Wait()

				start := time.Now()
				out := make([]Result, 1)
				err = rt.Check(t.Context(), []Request{tc.req}, out)
				took := time.Since(start)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("Check = %v (%+v) after %v, want %v", err, out[0], took, tc.wantErr)
					}
				} else if err != nil || !out[0].Degraded {
					t.Fatalf("Check = %v, %+v, want the failure mode's answer", err, out[0])
				}
				if took != tc.wantAfter {
					t.Errorf("answered after %v, want %v", took, tc.wantAfter)
				}
				if n := src.count(); n != tc.wantReads {
					t.Errorf("%d view reads, want %d", n, tc.wantReads)
				}
				time.Sleep(10 * time.Minute) // the ask is over: back to the period (an hour)
				synctest.Wait()
				if n := src.count(); n != tc.wantReads {
					t.Errorf("%d view reads 10 minutes on, want still %d", n, tc.wantReads)
				}
			})
		})
	}
}
