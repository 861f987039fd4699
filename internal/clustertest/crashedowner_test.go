package clustertest

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A member crashes and, before it is marked dead, the ring changes for
// another reason (a member joins): partitions of the crashed member move
// to members that were not their backup. Their new owners await the
// crashed member's hand-off, which never comes, and then serve from the
// copy their backup in the ring before handed them. Was: that backup
// dropped its copy (it backs the partition up no more) and the new
// owners served those partitions from nothing, every key's budget full
// again.
func TestCrashedOwnersPartitionsMovedBeforeItIsMarkedDeadKeepTheirBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: 30 * time.Second})
		c.PutRules("n1", logRule)
		var keys []string
		for i := range 60 {
			keys = append(keys, c.KeyOwnedBy("n3", i))
		}
		for _, k := range keys {
			if a, _ := spend(c, "n1", k, 5); a != 5 {
				t.Fatalf("%s: admitted %d of 5", k, a)
			}
		}
		time.Sleep(time.Second) // every backup has every state
		v := c.Member("n1").Node().View()
		before := v.Ring
		c.Crash("n3")
		c.Join("n4")
		after := c.Member("n1").Node().View().Ring
		moved := 0
		for _, k := range keys {
			p := before.Partition(limiter.KeyHash(v.Seed, k))
			o, _ := after.Owner(p)
			if b, _ := before.Backup(p); o.ID != "n3" && o.ID != b.ID {
				moved++
			}
		}
		if moved == 0 {
			t.Fatal("no key of n3's moved away from n3 to a member that was not its backup")
		}
		c.WaitFor("n3 marked dead", 2*time.Minute, func() bool {
			return len(c.Member("n1").Node().View().Ring.Members()) == 3
		})
		c.WaitSettled(3)
		for _, k := range keys {
			if a, d := spend(c, "n1", k, 10); a != 5 || d != 0 {
				t.Errorf("%s: admitted %d more (degraded %d) after n3's crash and n4's join, want the 5 left of 10", k, a, d)
			}
		}
	})
}
