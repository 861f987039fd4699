package clustertest

import (
	"testing"
	"testing/synctest"
	"time"
)

// A member that joins takes its partitions' hand-offs and crashes before
// its first backup push (within one backup interval): its partitions are
// promoted by their new backup — the member that handed them off, which
// keeps what it handed off as its copy — with their budgets. Was: the
// old owner dropped what it handed off and held no copy, so every key of
// those partitions started afresh (48 of 50 runs). Found by an audit of
// node/'s failover paths.
func TestHandoffTargetCrashBeforeItsFirstBackupPush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: 2 * time.Second})
		c.PutRules("n1", logRule)
		var keys []string
		for _, id := range []string{"n1", "n2", "n3"} {
			for i := range 20 {
				keys = append(keys, c.KeyOwnedBy(id, i))
			}
		}
		for _, k := range keys {
			if a, _ := spend(c, "n1", k, 5); a != 5 {
				t.Fatalf("%s: admitted %d of 5", k, a)
			}
		}
		time.Sleep(time.Second) // every backup has every state; nothing is spent from here on
		c.add("n4", true)
		for { // n4 took every hand-off (polled every 200µs of virtual time)
			n := c.Member("n4").Node()
			if v, o := n.View(), n.Owner(); v != nil && o != nil && len(v.Ring.PartitionsOf("n4")) > 0 && o.Awaiting() == 0 {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		c.Crash("n4")
		c.WaitFor("n4 marked dead", 20*time.Second, func() bool {
			return len(c.Member("n1").Node().View().Ring.Members()) == 3
		})
		c.WaitSettled(3)
		for _, k := range keys {
			if a, d := spend(c, "n1", k, 10); a != 5 || d != 0 {
				t.Errorf("%s: admitted %d more (degraded %d) after n4's crash, want the 5 left of 10", k, a, d)
			}
		}
	})
}
