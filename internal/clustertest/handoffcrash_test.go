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

// The same crash, but the member comes back over its data dir before it
// is marked dead, and most of its partitions are idle: the restart
// protocol (marked down, then active) moves them to the members that
// handed them off and back, and every one is served at once. Was: the
// copy kept of a hand-off did not count as a whole copy (based), so an
// idle partition's was taken for none; that member awaited the partition
// from the restarted one, which awaited it back, each answering the
// other's hand-off with "lost", for the whole hand-off wait (with
// --dead-after 1h, an hour). No backup round runs here: what the members
// hold of the new member's partitions is what they handed it.
func TestHandoffTargetRestartBeforeItsFirstBackupPush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour, BackupInterval: time.Hour})
		c.PutRules("n1", logRule)
		var keys []string
		for _, id := range []string{"n1", "n2", "n3"} {
			keys = append(keys, c.KeyOwnedBy(id, 0))
		}
		for _, k := range keys {
			if a, _ := spend(c, "n1", k, 5); a != 5 {
				t.Fatalf("%s: admitted %d of 5", k, a)
			}
		}
		n4 := c.Join("n4")
		if len(n4.Node().View().Ring.PartitionsOf("n4")) == 0 {
			t.Fatal("n4 owns no partition")
		}
		c.Crash("n4")
		c.Restart("n4")
		c.WaitFor("n4 ready", 10*time.Second, func() bool { return c.Member("n4").Node().Ready() == nil })
		c.WaitSettled(4)
		for _, k := range keys {
			if a, d := spend(c, "n1", k, 10); a != 5 || d != 0 {
				t.Errorf("%s: admitted %d more (degraded %d) after n4's restart, want the 5 left of 10", k, a, d)
			}
		}
	})
}
