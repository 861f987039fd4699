package chaos

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// TestRollingRestartThroughRouter is scenario 11: scenario 4's rolling
// restart (SIGTERM, the same command line, settled, next) with all the
// load through a `ringlimit router`, which follows the cluster's view
// (re-read every second). A stopping member hands its partitions off,
// marks itself down and closes its port within that second, so the
// router's view still names it for a moment. Targets: no degraded
// answer (a graceful stop is not a failure), a fail-open token bucket
// never over burst + rate × elapsed, a fail-closed sliding log never
// over its limit + 1.
func TestRollingRestartThroughRouter(t *testing.T) {
	skipUnlessChaos(t)
	const rate, burst, logLimit = 10, 20, 100
	c := start3(t, 2*time.Second, []api.Rule{
		{Name: "log", Algorithm: "sliding_log", Limit: logLimit, Period: "10m", FailureMode: "closed"},
		{Name: "tb", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst}, // open: a degraded answer admits
	})
	rt := &member{id: "router", http: freeAddr(t), logPath: filepath.Join(c.dir, "router.log")}
	var members []string
	for _, m := range c.members {
		members = append(members, m.http)
	}
	rt.args = []string{"router", "--http", rt.http, "--cluster", strings.Join(members, ","), "--admin-token", adminToken}
	rt.start(t)
	t.Cleanup(rt.kill)
	waitFor(t, "router ready", 30*time.Second, func() bool { return status(rt.http, "/readyz") == 200 })
	rep := newReport(t, c.dir)
	keys := rollingKeys()
	// One key per worker: single checks, one per key a second, as an
	// application's traffic comes (batches touch every owner at every
	// round, and so refresh the router's view as the ring moves).
	l := newLoad(keys, len(keys), 1, rt.http)
	l.run()
	l.loadFor(3 * time.Second)
	marks := c.restartEach(l, 3*time.Second)
	l.loadFor(marks[len(marks)-1].at + 3*time.Second)
	l.stop()
	evs := l.snapshot()

	all := count(evs)
	rep.add("scenario 11: rolling restart (SIGTERM, same command line, ready, settled) of n1, n2, n3 under load through a ringlimit router (view re-read every 1s); restarts took %s",
		durations(marks))
	rep.add("all checks: %v", all)
	b := rollingBudgets(evs, keys, rate, burst)
	rep.add("degraded answers: %d (target 0)", all.degraded)
	b.report(rep, keys, logLimit, rate, burst, " (closed)", " (open)")
	describeFailures(rep, l, evs)
	rep.write()
	if all.degraded > 0 {
		t.Errorf("%d degraded answers through the router during graceful restarts, want 0", all.degraded)
	}
	b.check(t, keys, logLimit)
}
