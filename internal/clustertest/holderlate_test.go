package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/router"
)

// A whole cluster stopped together, whose member holding every budget
// (its buckets.rlsnap) starts again 3 s after the others, within the
// hand-off wait (3.75 s at --dead-after 5s), keeps every budget spent
// before the stop, as README promises: the members back first wait for
// its hand-offs, and it hands them their partitions when it returns.
//
// The first member back awaited the holder's partitions; when the second
// rejoined, some moved on to it, and the first, holding nothing, said so
// (a Lost part) after lostDelay: the second, holding nothing either,
// served them from nothing at once (~0.8 s after the restart, 2.2 s
// before the holder came back), and their spent keys were admitted their
// whole limit again until the holder's state was merged (37 of 40 runs
// here; the auditor's real processes: up to 24 of 20). A Lost part now
// ends a wait only at a member that holds a copy to serve; one that holds
// nothing waits out its hand-off wait (0 of 40 runs with the holder back
// 1–3.7 s late; at 4 s, past the wait, 28 of 40 admit spent keys again,
// as README says).
//
// And a member that stopped awaiting partitions it had passed on as its
// (empty) backup copies kept those copies in its bucket file (its target
// had taken them just before the stop counted them), and at its next
// start handed them to their owners, which, still awaiting the holder,
// served the partitions from them (3 of 30 keys admitted again, about 1
// run in 60): such a stand-in is never saved now, and a stop no longer
// saves a hand-off its target has taken.
func TestHolderBackWithinHandoffWaitKeepsBudgets(t *testing.T) {
	holderBackLate(t, 10, 3*time.Second)
}

// holderBackLate runs, runs times, a cluster of three whose keys are
// spent, stopped together and started again: the two members that do not
// hold the bucket file at once, the holder late after them. Each spent
// key is checked every 100 ms from the others' restart until a second
// after the holder has settled; a spent key admitted (not degraded) at
// any of those checks fails the run.
func holderBackLate(t *testing.T, runs int, late time.Duration) {
	const keys = 30
	eachRun(t, runs, func(t *testing.T) {
		c := New(t, 3, Options{DataDirs: true, DeadAfter: 5 * time.Second})
		spendTogether(t, c, keys)
		stopTogether(c)
		holder := bucketHolder(t, c)
		var others []*Member
		for _, m := range c.Members() {
			if m != holder {
				others = append(others, m)
			}
		}
		start := time.Now()
		for _, m := range others {
			c.Restart(m.ID)
		}
		var (
			mu       sync.Mutex
			admitted = map[int]int{} // key → admissions after the restart; guarded by mu
			first    time.Duration   // since start, of the first; guarded by mu
		)
		done := make(chan struct{})
		var probes sync.WaitGroup
		for i := range keys {
			rt := others[i%len(others)].Router()
			req := []router.Request{{Rule: tightRule.Name, Key: fmt.Sprintf("k%d", i), Cost: 1}}
			probes.Go(func() {
				out := make([]router.Result, 1)
				for {
					// An error is a router with no view yet.
					if err := rt.Check(context.Background(), req, out); err == nil && out[0].Allowed && !out[0].Degraded {
						mu.Lock()
						if len(admitted) == 0 {
							first = time.Since(start)
						}
						admitted[i]++
						if admitted[i] == 1 {
							t.Logf("k%d admitted at %v via %s: %s", i, time.Since(start), others[i%len(others)].ID, whereIs(c, fmt.Sprintf("k%d", i)))
						}
						mu.Unlock()
					}
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			})
		}
		time.Sleep(late)
		c.Restart(holder.ID)
		c.WaitSettled(3)
		time.Sleep(time.Second)
		close(done)
		probes.Wait()
		if len(admitted) > 0 {
			most := 0
			for _, k := range admitted {
				most = max(most, k)
			}
			t.Errorf("%d of %d spent keys admitted again (up to %d more each, over a limit of %d), the first %v after the others' restart; %s, the holder, back at %v",
				len(admitted), keys, most, tightRule.Limit, first, holder.ID, late)
		}
	})
}

// bucketHolder is the member whose data dir holds the largest bucket
// file after a whole cluster stopped together: the one it kept active.
func bucketHolder(t *testing.T, c *Cluster) *Member {
	t.Helper()
	var holder *Member
	var size int64
	for _, m := range c.Members() {
		fi, err := os.Stat(filepath.Join(m.dir, "buckets.rlsnap"))
		if err == nil && fi.Size() > size {
			holder, size = m, fi.Size()
		}
	}
	if holder == nil {
		t.Fatal("no member saved a bucket file")
	}
	return holder
}
