package clustertest

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A member restarted over its data dir whose log the leader has
// compacted away gets the leader's snapshot (InstallSnapshot) instead of
// the entries it missed: the snapshot is newer than the log it restarted
// with, so its replay is done, and it recovers and is ready. Counting
// only the entries its FSM applied, it took itself for still replaying
// until the cluster's next command, which nothing it waited for would
// write (it marks itself down only once it has caught up).
func TestRestartedMemberCaughtUpByASnapshotIsReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour}) // no member marked dead: no command the test does not write
		rule := limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second}
		c.PutRules("n1", rule)
		// n3's first backup round: its backups hold whole copies of its
		// (idle) partitions, which the restart protocol promotes and hands
		// back. A crash before it leaves partitions that n3 took in a
		// hand-off backed up nowhere, whose backup then awaits them from
		// n3 as n3 awaits them back, for the whole hand-off wait (an hour
		// here; see the note on issue 14's session).
		time.Sleep(100 * time.Millisecond)
		c.Crash("n3")
		for i := range 3 {
			rule.Limit = int64(20 + i)
			c.PutRules("n1", rule)
		}
		// n1 and n2 keep no log behind a snapshot, and the lead moves: the
		// new leader has no entry n3 lacks to send it, only its snapshot,
		// and the old leader's retried calls (replicationRetry), which
		// carry entries n3 would apply, end with its term.
		old := c.Leader()
		for _, id := range []string{"n1", "n2"} {
			r := c.Member(id).Node().Raft()
			rc := r.ReloadableConfig()
			rc.TrailingLogs = 0
			if err := r.ReloadConfig(rc); err != nil {
				t.Fatal(err)
			}
			if err := r.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
		if err := old.Node().Raft().LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
		c.WaitFor("a new leader", 10*time.Second, func() bool { l := c.Leader(); return l != nil && l != old })

		c.Restart("n3")
		n3 := c.Member("n3")
		c.WaitFor("n3 has the leader's snapshot", 10*time.Second, func() bool {
			metas, err := n3.snaps.List()
			return err == nil && len(metas) > 0
		})
		c.WaitFor("n3 ready", 10*time.Second, func() bool { return n3.Node().Ready() == nil })
		if v := n3.Router().View(); v == nil || v.Rules["r"] == nil || v.Rules["r"].Limit != 22 {
			t.Errorf("n3's rules after the snapshot: %+v, want r at 22", v)
		}
	})
}
