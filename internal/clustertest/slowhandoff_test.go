package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A joining member keeps awaiting hand-offs that are still arriving when
// its hand-off wait ends, rather than serving what has not come yet from
// nothing. Was: served from nothing at the end of the wait (a joiner of
// a cluster of 8M keys on a starved machine: 159–198 partitions, their
// hand-offs still arriving in 16 MiB pushes). Here each push carries a
// partition or two (a 512-byte frame) and takes 1.5 s to arrive: n2's
// third comes 4.5 s after the ring that names n4.
func TestSlowHandoffIsAwaitedWhileItArrives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := limiter.Rule{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 2, Period: time.Hour, FailureMode: limiter.FailClosed}
		c := New(t, 3, Options{MaxFrame: 512}) // a push carries one or two partitions
		c.PutRules("n1", rule)
		keys := make([]string, 600)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i)
			for range rule.Limit {
				if r := c.Check(fmt.Sprintf("n%d", i%3+1), rule.Name, keys[i], 1); !r.Allowed || r.Degraded {
					t.Fatalf("spending %s: %+v", keys[i], r)
				}
			}
		}
		for _, from := range []string{"n1", "n2", "n3"} {
			c.SetHandoffDelay(from, "n4", 1500*time.Millisecond)
		}
		n4 := c.Join("n4")
		c.WaitFor("n4 holding its partitions", time.Minute, func() bool { return n4.Node().Owner().Awaiting() == 0 })
		c.Heal()
		if k := n4.Node().Owner().ServedFromNothing(); k != 0 {
			t.Errorf("n4 served %d partitions from nothing while their hand-offs were arriving", k)
		}
		for _, k := range keys {
			if r := c.Check("n1", rule.Name, k, 1); r.Allowed {
				t.Errorf("%s, spent before n4 joined, admitted after: %+v (%s)", k, r, whereIs(c, k))
			}
		}
	})
}
