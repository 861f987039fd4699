package clustertest

import (
	"testing"
	"time"
)

// Two members listed active restarted together (crashed, or stopped
// while no leader could mark them down) each have themselves marked down
// first, to recover from their backups. The one that asks second is then
// the last active member, whose mark-down the cluster refuses (nobody
// would take its partitions), and it took that refusal for a duplicate
// process holding its id: it never registered again, and the cluster
// never settled. It now needs no recovery, as a member listed the only
// active one at its restart does not.
func TestMembersListedActiveRestartedTogetherBothServe(t *testing.T) {
	eachRun(t, 10, func(t *testing.T) {
		c := New(t, 3, Options{DataDirs: true})
		spendTogether(t, c, 12)
		c.Stop("n1", 10*time.Second) // down: no part in what follows
		c.Crash("n2")
		c.Crash("n3")
		for _, id := range []string{"n1", "n2", "n3"} {
			c.Restart(id)
		}
		c.WaitSettled(3)
	})
}
