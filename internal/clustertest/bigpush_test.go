package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A hand-off larger than the data plane's largest frame goes all the
// same, as several pushes.
//
// A whole cluster stopped with busy sliding-log keys (a real-process
// run: 3,000 keys of 10,000 an hour, ~3,850 entries each) left them in
// its last member's bucket file; restarted last, that member handed
// each owner its partitions in one push. Exact logs (hand-offs carry
// every entry, backups 64 bins) made the push to one owner ~26 MB, over
// the data plane's 16 MiB frame: refused before it left, retried every
// second and logged at debug only, while its owner served the ~330
// partitions from nothing once its hand-off wait ended (a third of the
// keys back at full budget, in 2 restarts of ~4). Here a small frame
// (SetMaxFrame, once the last member holds every exact log) stands in
// for 16 MiB: one partition's logs fit in it, an owner's share of them
// does not.
func TestHandoffLargerThanAFrameGoesInPieces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := limiter.Rule{Name: "log", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Hour}
		const keys = 60
		c := New(t, 3, Options{DataDirs: true})
		c.PutRules("n1", rule)
		for i := range keys {
			for range rule.Limit { // one entry each: a log longer than a backup's 64 bins
				if r := c.Check(fmt.Sprintf("n%d", i%3+1), rule.Name, fmt.Sprintf("k%d", i), 1); !r.Allowed || r.Degraded {
					t.Fatalf("spending k%d: %+v", i, r)
				}
			}
		}
		c.Stop("n1", 10*time.Second)
		c.Stop("n2", 10*time.Second)
		c.Stop("n3", 10*time.Second) // the last active: its bucket file holds everything
		c.SetMaxFrame(8 << 10)       // ~14 KB an owner's share, under 4 KB a partition's
		c.Restart("n1")
		c.Restart("n2")
		c.WaitFor("n1 and n2 active", 30*time.Second, func() bool {
			v := c.Member("n1").Node().View()
			return v != nil && len(v.Ring.Members()) == 3
		})
		c.Restart("n3") // late, as a member loading a big bucket file is
		c.WaitSettled(3)
		for i := range keys {
			if r := c.Check(fmt.Sprintf("n%d", i%3+1), rule.Name, fmt.Sprintf("k%d", i), 1); r.Allowed {
				t.Errorf("k%d, spent before the stop, admitted after the restart: %+v (%s)", i, r, whereIs(c, fmt.Sprintf("k%d", i)))
			}
		}
	})
}

// Backup copies larger than the data plane's largest frame reach their
// backups all the same, as several pushes: a crashed owner's keys keep
// their budgets. Was: one push a backup member a round, so an owner
// whose copies for one backup came to more than 16 MiB (about a million
// token-bucket keys, in the round after a ring change, when whole
// partitions go) had every round's push refused by its own client, and
// its backups held nothing. A small frame stands in for 16 MiB.
func TestBackupsLargerThanAFrameGoInPieces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{MaxFrame: 2 << 10})
		c.PutRules("n1", logRule)
		var keys []string
		for i := range 300 { // ~6 KB of copies for each of n2's two backups
			keys = append(keys, c.KeyOwnedBy("n2", i))
		}
		spendHalf(t, c, keys)
		c.Crash("n2")
		waitDeadAndReady(c, "n2", "n1", "n3")
		wantHalfLeft(t, c, keys, "after n2's crash")
	})
}
