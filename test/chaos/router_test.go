package chaos

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
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
	var logKeys, tbKeys []string
	for i := range 50 {
		logKeys = append(logKeys, fmt.Sprintf("log-%d", i))
		tbKeys = append(tbKeys, fmt.Sprintf("tb-%d", i))
	}
	keys := append(checks("log", 1, logKeys), checks("tb", 1, tbKeys)...)
	// One key per worker: single checks, one per key a second, as an
	// application's traffic comes (batches touch every owner at every
	// round, and so refresh the router's view as the ring moves).
	l := newLoad(keys, len(keys), 1, rt.http)
	l.run()
	l.loadFor(3 * time.Second)
	var marks []marker
	for _, m := range c.members {
		marks = append(marks, marker{l.since(), "SIGTERM " + m.id})
		m.signal(syscall.SIGTERM)
		if !m.exited(30 * time.Second) {
			t.Fatalf("%s did not exit within 30s of SIGTERM", m.id)
		}
		time.Sleep(3 * time.Second) // down a while, as a restart with a new binary is
		m.start(t)
		c.waitSettled(c.members)
		marks = append(marks, marker{l.since(), m.id + " back"})
	}
	l.loadFor(marks[len(marks)-1].at + 3*time.Second)
	l.stop()
	evs := l.snapshot()

	all := count(evs)
	rep.add("scenario 11: rolling restart (SIGTERM, same command line, ready, settled) of n1, n2, n3 under load through a ringlimit router (view re-read every 1s); restarts took %s",
		durations(marks))
	rep.add("all checks: %v", all)
	uses := perKey(evs, keys)
	var worstLog *keyUse
	tbUses := map[int32]*keyUse{}
	for k, u := range uses {
		if keys[k].rule == "log" {
			if worstLog == nil || u.admitted > worstLog.admitted {
				worstLog = u
			}
		} else {
			tbUses[k] = u
		}
	}
	bound := func(u *keyUse) float64 { return tokenBound(u, rate, burst) }
	worstTB, over := worstOver(tbUses, bound)
	rep.add("degraded answers: %d (target 0)", all.degraded)
	rep.add("sliding_log limit %d per 10m (closed): worst key %s admitted %d (target ≤ %d)", logLimit, keys[worstLog.key].key, worstLog.admitted, logLimit+1)
	rep.add("token_bucket %d/s burst %d (open): worst key %s admitted %d, burst+rate×elapsed %.1f, over by %.1f (target ≤ 0)",
		rate, burst, keys[worstTB.key].key, worstTB.admitted, bound(worstTB), over)
	describeFailures(rep, l, evs)
	rep.write()
	if all.degraded > 0 {
		t.Errorf("%d degraded answers through the router during graceful restarts, want 0", all.degraded)
	}
	if worstLog.admitted > logLimit+1 {
		t.Errorf("sliding_log key %s admitted %d, want ≤ %d", keys[worstLog.key].key, worstLog.admitted, logLimit+1)
	}
	if over > 0 {
		t.Errorf("token_bucket key %s admitted %d, more than burst + rate × elapsed = %.1f", keys[worstTB.key].key, worstTB.admitted, bound(worstTB))
	}
}
