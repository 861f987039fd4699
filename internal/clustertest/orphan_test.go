package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A leave cut short by the leader's crash between its two halves (the
// member removed from the ring, not yet from Raft) left a voter in Raft's
// configuration that was no member, and whose process exited: in a
// cluster of 4, the crashed leader and it made 2 of 4 voters silent, so
// the next leader lost its quorum and stepped down (no leader, no lease,
// every check degraded). Now the leaving member stays a Raft voter until
// it is out of Raft's configuration, and the next leader removes the
// orphan at once: the 3 others keep a leader and take writes.
func TestLeaveCutShortByTheLeadersCrashIsFinished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 4, Options{})
		l := c.Leader()
		victim := otherThan(c, l.ID)
		// The leader waits for the victim to apply its removal before the
		// Raft half (awaitRemovalSeen): cutting its calls to the victim
		// holds it there, and it crashes meanwhile.
		c.CutCalls(l.ID, victim)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = l.Node().Leave(ctx, victim) // the leader crashes under it
		}()
		c.WaitFor(victim+" out of the leader's ring", 10*time.Second, func() bool {
			v := l.Node().View()
			if v == nil {
				return false
			}
			_, in := v.Ring.Member(victim)
			return !in
		})
		c.Crash(l.ID)
		c.Heal()
		c.WaitFor(victim+" out of Raft under a new leader", 20*time.Second, func() bool {
			n := c.Leader()
			return n != nil && n != l && n.ID != victim && !inRaft(c, victim)
		})
		c.WaitFor(victim+" stopped", 20*time.Second, func() bool { return !c.Member(victim).Running() })
		// Raft's quorum is the 3 left of {crashed leader, 2 others}: a
		// write commits, and keeps committing.
		for range 3 {
			c.PutRules(c.Leader().ID, limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second})
			time.Sleep(5 * time.Second)
		}
		if n := c.Leader(); n == nil || n == l {
			t.Fatalf("no leader 15s after the crash")
		}
	})
}

// inRaft reports whether id is a server of the leader's Raft
// configuration.
func inRaft(c *Cluster, id string) bool {
	_, ok := raftServer(c, id)
	return ok
}
