package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// A group of two rules on one key, sent through a member that does not
// own it: once the tight rule denies, the group spends nothing on the
// roomy one (issue 12), whichever member the group is sent through.
func TestDeniedGroupSpendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		tight := limiter.Rule{Name: "tight", Algorithm: limiter.TokenBucket, Limit: 2, Period: time.Hour}
		c.PutRules("n1", logRule, tight)
		key := c.KeyOwnedBy("n3", 0)
		group := []router.Request{{Rule: "log", Key: key, Cost: 1}, {Rule: "tight", Key: key, Cost: 1, Joined: true}}
		for i, via := range []string{"n1", "n2", "n3", "n1", "n2"} {
			out := make([]router.Result, 2)
			if err := c.Member(via).Router().Check(context.Background(), group, out); err != nil {
				t.Fatal(err)
			}
			if want := i < 2; out[0].Allowed != want || out[1].Allowed != want || out[0].Degraded {
				t.Fatalf("group %d via %s: %+v, want allowed %v", i, via, out, want)
			}
		}
		if q := c.Check("n2", "log", key, 0); q.Remaining != 8 {
			t.Fatalf("log remaining %d, want 8: only the two passing groups spent", q.Remaining)
		}
	})
}
