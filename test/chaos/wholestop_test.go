package chaos

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// TestWholeClusterStopTogether is scenario 10: every member of a cluster
// stopped with one SIGTERM each at the same moment, then all started
// again together over their data dirs. The cluster never marks its last
// active member down, so the budgets end in the bucket files of the
// members that stopped last (with five, several: the last ones lose the
// Raft quorum and cannot be marked down), and the restart must hand them
// on: no key spent before the stop is admitted after it. Every member
// must exit 0 within its drain, and no log may hold an ERROR line (README:
// a normal stop logs none).
func TestWholeClusterStopTogether(t *testing.T) {
	skipUnlessChaos(t)
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d members", n), func(t *testing.T) { wholeClusterStopTogether(t, n) })
	}
}

func wholeClusterStopTogether(t *testing.T, n int) {
	const keys, limit = 60, 2
	c := newCluster(t, 0)
	for i := range n {
		c.add(fmt.Sprintf("n%d", i+1))
	}
	c.waitSettled(c.members)
	c.waitVoters(min(n, 5))
	c.setRules([]api.Rule{{Name: "budget", Algorithm: "sliding_log", Limit: limit, Period: "1h", FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	var ks []string
	for i := range keys {
		ks = append(ks, fmt.Sprintf("k%d", i))
	}
	// Spend every budget, each key through the members in turn.
	through := func(cost int64) (admitted, degraded int) {
		for i, k := range ks {
			d := batch(t, c.members[i%n].http, checks("budget", cost, []string{k}))[0]
			if d.Allowed {
				admitted++
			}
			if d.Degraded {
				degraded++
			}
		}
		return admitted, degraded
	}
	if a, d := through(limit); a != keys || d != 0 {
		t.Fatalf("spending: %d of %d admitted, %d degraded; want all admitted, none degraded", a, keys, d)
	}

	took, codes := stopAll(c.members)
	var slowest time.Duration
	for _, d := range took {
		slowest = max(slowest, d)
	}
	errs := errorLines(t, c.members)
	rep.add("scenario 10: %d members, %d keys spent (sliding_log %d per hour, closed), one SIGTERM to every member at once", n, keys, limit)
	rep.add("stop: slowest member exited after %.2fs (per member %s), exit codes %v, ERROR lines %d", slowest.Seconds(), fmtDurations(took), codes, len(errs))

	start := time.Now()
	for _, m := range c.members {
		m.start(t)
	}
	c.waitSettled(c.members)
	settled := time.Since(start)
	admitted, degraded := through(1)
	rep.add("restart of all %d together: settled after %.1fs; spent keys admitted again %d of %d (target 0), degraded %d", n, settled.Seconds(), admitted, keys, degraded)
	rep.write()

	if admitted > 0 {
		t.Errorf("%d of %d keys spent before the stop admitted after the restart", admitted, keys)
	}
	if slowest > 8*time.Second {
		t.Errorf("a member took %v to stop, longer than a stop that waits for nothing should", slowest)
	}
	for i, code := range codes {
		if code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", c.members[i].id, code)
		}
	}
	for _, e := range errs {
		t.Errorf("ERROR line at a whole-cluster stop: %s", e)
	}
}

// stopAll sends SIGTERM to every member at once and returns, per member,
// how long it took to exit and its exit code (-1: still running after
// 30s, then killed).
func stopAll(ms []*member) ([]time.Duration, []int) {
	took, codes := make([]time.Duration, len(ms)), make([]int, len(ms))
	start := time.Now()
	for _, m := range ms {
		m.signal(syscall.SIGTERM)
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			if !m.exited(30 * time.Second) {
				m.kill()
				took[i], codes[i] = time.Since(start), -1
				return
			}
			took[i] = time.Since(start)
			cmd, _ := m.proc()
			codes[i] = cmd.ProcessState.ExitCode()
		})
	}
	wg.Wait()
	return took, codes
}

// errorLines returns the log lines at level ERROR of every member so far.
func errorLines(t *testing.T, ms []*member) []string {
	t.Helper()
	var out []string
	for _, m := range ms {
		b, err := os.ReadFile(m.logPath)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(b)) {
			if strings.Contains(l, `"level":"ERROR"`) {
				out = append(out, m.id+": "+strings.TrimSpace(l))
			}
		}
	}
	return out
}

func fmtDurations(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, fmt.Sprintf("%.2fs", d.Seconds()))
	}
	return "[" + strings.Join(s, " ") + "]"
}
