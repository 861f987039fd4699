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
// orphan (after the dead-after and a margin): the 3 others keep a leader
// and take writes.
func TestLeaveCutShortByTheLeadersCrashIsFinished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 4, Options{})
		l := c.Leader()
		victim := otherThan(c, l.ID)
		// The leader waits for the victim to apply its removal before the
		// Raft half (awaitRemovalSeen): cutting its calls to the victim
		// holds it there, and it crashes meanwhile.
		c.CutCalls(l.ID, victim)
		leaveAndCrashLeader(c, l, victim)
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

// leaveAndCrashLeader has leader l remove victim and crashes l once the
// removal is in l's ring, before l has finished the leave (the caller
// holds l's calls to victim, on which it waits before the Raft half).
func leaveAndCrashLeader(c *Cluster, l *Member, victim string) {
	c.t.Helper()
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
}

// inRaft reports whether id is a server of the leader's Raft
// configuration.
func inRaft(c *Cluster, id string) bool {
	_, ok := raftServer(c, id)
	return ok
}

// A member leaving while the leader dies hands its partitions to their
// new owners, the dead leader's included: it stays in Raft (an orphan the
// next leader removes only after the dead-after and a margin) long enough
// to see the ring that marks the leader dead, and readdresses to the
// partitions' owners then. Removed from Raft at once, it never saw that
// ring: the partitions bound for the leader were served afresh (a new user
// saw 27-35 of 25 admitted).
func TestLeaveAsTheLeaderDiesLosesNoHandoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 4, Options{})
		l := c.Leader()
		victim := otherThan(c, l.ID)
		rule := limiter.Rule{Name: "hourly", Algorithm: limiter.SlidingLog, Limit: 2, Period: time.Hour, FailureMode: limiter.FailClosed}
		c.PutRules(l.ID, rule)
		var keys []string
		for i := range 24 {
			k := c.KeyOwnedBy(victim, i)
			keys = append(keys, k)
			for range 2 {
				if r := c.Check(victim, "hourly", k, 1); !r.Allowed || r.Degraded {
					t.Fatalf("spend of %s: %+v", k, r)
				}
			}
		}
		// The victim's hand-offs to the leader never arrive (it dies), and
		// the leader's removal of the victim from Raft is cut short.
		c.CutCalls(victim, l.ID)
		c.CutCalls(l.ID, victim)
		leaveAndCrashLeader(c, l, victim)
		c.WaitFor(victim+" stopped", 60*time.Second, func() bool { return !c.Member(victim).Running() })
		var via string
		for _, m := range c.Members() {
			if m.Running() {
				via = m.ID
				break
			}
		}
		c.WaitSettled(2)
		admitted := 0
		for _, k := range keys {
			if r := c.Check(via, "hourly", k, 1); r.Allowed {
				admitted++
			}
		}
		if admitted > 0 {
			t.Fatalf("%d of %d keys spent before the leave admitted again after it", admitted, len(keys))
		}
	})
}
