package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// TestStopWhileAnOwnerIsDown is scenario 13: SIGKILL of one member of
// five (n5), then a graceful stop (SIGTERM) of another (n2) before n5
// is marked dead, n2 staying down (maintenance). n2's stop moves some of
// its partitions to n5, whose hand-off cannot land, and n2 was the
// backup of some of n5's partitions, whose copies must go on to their
// new backups before n2 exits, which it does once they hold them, cleanly
// (not after its whole drain, with an error). Budget keys (sliding_log, 30 of 50 spent)
// of both; once n5 is out of the ring each must admit exactly 20 more,
// with n2 still down, and nothing more once n2 is back.
func TestStopWhileAnOwnerIsDown(t *testing.T) {
	skipUnlessChaos(t)
	const dead = 15 * time.Second // longer than n2's stop (its --drain-timeout, 10s): its hand-offs to n5 cannot wait for the mark
	const limit, spent = 50, 30
	c := newCluster(t, dead)
	for i := 1; i <= 5; i++ {
		c.add(fmt.Sprintf("n%d", i))
	}
	c.waitSettled(c.members)
	c.waitVoters(5)
	c.setRules([]api.Rule{{Name: "budget", Algorithm: "sliding_log", Limit: limit, Period: "10m", FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	n1, n2, n5 := c.byID("n1"), c.byID("n2"), c.byID("n5")
	v := viewOf(t, n1.http)
	keys := append(v.keysOwnedBy("k", "n2", 60, false), v.keysOwnedBy("k", "n5", 60, false)...)
	spend := checks("budget", 1, keys)
	if pre := preSpend(t, n1, spend, spent, v); len(pre) > 0 {
		rep.add("before the faults, pre-spend checks answered degraded (sent again): %v", pre)
	}
	time.Sleep(500 * time.Millisecond) // every backup holds every spend

	start := time.Now()
	n5.kill()
	took, codes := stopAll([]*member{n2})
	if codes[0] == -1 {
		t.Fatal("n2 still ran 30s after SIGTERM")
	}
	errs := errorLines(t, []*member{n2})
	rest := []*member{n1, c.byID("n3"), c.byID("n4")}
	waitFor(t, "n5 out of the ring and the three ready", dead+30*time.Second, func() bool {
		for _, m := range rest {
			if status(m.http, "/readyz") != 200 || len(activeIDs(m.http)) != len(rest) {
				return false
			}
		}
		return true
	})
	settled := time.Since(start)
	left := func(via *member) (reset, short int, most int64) {
		more := map[string]int64{}
		for range limit - spent + 5 {
			for i, d := range batch(t, via.http, spend) {
				if d.Allowed && !d.Degraded {
					more[keys[i]]++
				}
			}
		}
		for _, k := range keys {
			switch {
			case more[k] > limit-spent:
				reset++
			case more[k] < limit-spent:
				short++
			}
			most = max(most, more[k])
		}
		return reset, short, most
	}
	reset, short, most := left(n1)
	bare := 0.0
	for _, m := range rest {
		if x, ok := metric(m.http, "ringlimit_partitions_served_from_nothing_total"); ok {
			bare += x
		}
	}
	n2.start(t)
	waitFor(t, "n2 back and ready", 60*time.Second, func() bool { return status(n2.http, "/readyz") == 200 })
	again := 0
	for i, d := range batch(t, n2.http, spend) {
		if d.Allowed && !d.Degraded {
			again++
			t.Logf("%s admitted after n2's return", keys[i])
		}
	}

	rep.add("scenario 13: SIGKILL of n5, then SIGTERM of n2 (it exited %.2fs after the SIGTERM, code %d, %d ERROR lines); n5 out of the ring and n1, n3, n4 ready %.2fs after the kill, --dead-after %v",
		took[0].Seconds(), codes[0], len(errs), settled.Seconds(), dead)
	rep.add("%d budget keys (60 of n2's, 60 of n5's), %d of %d spent: afterwards %d keys admitted more than the %d left (most %d), %d fewer",
		len(keys), spent, limit, reset, limit-spent, most, short)
	rep.add("partitions served from nothing, summed over n1, n3, n4: %.0f (want 0)", bare)
	rep.add("after n2's return, one more check of each key admitted %d (want 0)", again)
	rep.write()

	if reset > 0 || short > 0 {
		t.Errorf("%d keys reset (most admitted %d of the %d left), %d admitted fewer", reset, most, limit-spent, short)
	}
	if bare > 0 {
		t.Errorf("%.0f partitions served from nothing, want 0", bare)
	}
	if took[0] > 5*time.Second || codes[0] != 0 || len(errs) > 0 {
		t.Errorf("n2's stop took %v (its drain 10s), exit code %d, ERROR lines %q; want it over once its hand-offs to n5 are with their backups, exit 0, none",
			took[0], codes[0], errs)
	}
	if again > 0 {
		t.Errorf("%d keys admitted after n2's return, want 0", again)
	}
}
