package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// TestOwnerKillThenJoin is scenario 12: SIGKILL of an owner, and a new
// member joins before the dead one is marked dead. The join moves some
// of the dead member's partitions to members that were not their backup
// (to the joiner, or between the others: the ring's loads are bounded),
// and makes the joiner the backup of others; nobody can hand those off.
// Their budgets must survive all the same: the backup of the ring before
// the join passes its copies on; and the checks of the partitions that
// await a hand-off from the dead member are answered at once, by their
// failure mode, not after the router's forward timeout. Budget keys (sliding_log, 30 of 50
// spent) are queried with cost 0 throughout; after the dead member is
// out of the ring each must admit exactly 20 more.
func TestOwnerKillThenJoin(t *testing.T) {
	skipUnlessChaos(t)
	const dead = 8 * time.Second
	const limit, spent = 50, 30
	c := start3(t, dead, []api.Rule{{Name: "budget", Algorithm: "sliding_log", Limit: limit, Period: "10m", FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	lead := c.leader(c.members[0])
	var victim *member
	var survivors []*member
	for _, m := range c.members {
		if victim == nil && m != lead && m != c.members[0] { // n4 joins through members[0]
			victim = m
		} else {
			survivors = append(survivors, m)
		}
	}
	vBefore := viewOf(t, survivors[0].http)
	keys := append(vBefore.keysOwnedBy("k", victim.id, 60, false), vBefore.keysOwnedBy("k", victim.id, 20, true)...)
	spend := checks("budget", 1, keys)
	preDegraded := preSpend(t, survivors[0], spend, spent, vBefore)
	time.Sleep(500 * time.Millisecond) // every backup holds every spend (backup lag is ~20 ms)

	l := newLoad(checks("budget", 0, keys), 4, 10, addrs(survivors)...)
	l.run()
	l.loadFor(2 * time.Second)
	tKill := l.since()
	victim.kill()
	n4 := c.add("n4")
	tJoined := l.since()
	l.setTargets(append(addrs(survivors), n4.http)...)
	rest := append(survivors, n4)
	tOut := waitOut(t, l, rest, victim.id, dead+30*time.Second)
	// Settled: every member ready (its partitions received or promoted)
	// in a ring of the three. The dead member stays listed, as dead, so
	// c.waitSettled does not apply.
	waitFor(t, "the three settled", 60*time.Second, func() bool {
		for _, m := range rest {
			if status(m.http, "/readyz") != 200 || len(activeIDs(m.http)) != len(rest) {
				return false
			}
		}
		return true
	})
	tSettled := l.since()
	l.loadFor(tSettled + 2*time.Second)
	l.stop()
	evs := l.snapshot()
	vAfter := viewOf(t, n4.http)

	movedTo := map[string]int{}
	for _, k := range keys[:60] {
		movedTo[vAfter.owner(k)]++
	}
	var maxRemaining int64
	for _, e := range evs {
		if e.ok && !e.degraded {
			maxRemaining = max(maxRemaining, e.remaining)
		}
	}
	more := map[string]int64{}
	for range limit - spent + 5 {
		for i, d := range batch(t, n4.http, spend) {
			if d.Allowed && !d.Degraded {
				more[keys[i]]++
			}
		}
	}
	reset, least, most := 0, int64(limit), int64(0)
	var mostKey string
	for _, k := range keys {
		if more[k] > limit-spent {
			reset++
		}
		if more[k] > most {
			most, mostKey = more[k], k
		}
		least = min(least, more[k])
	}
	bare := 0.0
	for _, m := range rest {
		if v, ok := metric(m.http, "ringlimit_partitions_served_from_nothing_total"); ok {
			bare += v
		}
	}

	if len(preDegraded) > 0 {
		rep.add("before the kill, a settled cluster answered pre-spend checks degraded (sent again): %v", preDegraded)
	}
	rep.add("scenario 12: SIGKILL of owner %s at t=%.2fs, --dead-after %v; n4 joined (ready) at t=%.2fs; %s out of the ring at t=%.2fs, settled at t=%.2fs",
		victim.id, tKill.Seconds(), dead, tJoined.Seconds(), victim.id, tOut.Seconds(), tSettled.Seconds())
	rep.add("the 60 keys %s owned now belong to: %v", victim.id, movedTo)
	rep.add("cost-0 queries of the %d keys: %v; from the kill until settled: %v; highest remaining seen %d (want ≤ %d)",
		len(keys), count(evs), count(window(evs, tKill, tSettled)), maxRemaining, limit-spent)
	rep.add("after the changes each key admitted between %d and %d more (want exactly %d; most: %s); %d of %d keys reset",
		least, most, limit-spent, mostKey, reset, len(keys))
	rep.add("partitions served from nothing, summed over the members: %.0f (want 0)", bare)
	describeFailures(rep, l, evs)
	rep.write()
	timeline(t, c.dir, fmt.Sprintf("SIGKILL of %s, n4 joins before it is marked dead", victim.id), evs, checks("budget", 0, keys),
		[]watched{{name: keys[0] + " (cost 0)", key: 0, bound: func(float64) float64 { return 0 }}},
		[]marker{{tKill, "SIGKILL " + victim.id}, {tJoined, "n4 ready"}, {tOut, victim.id + " out"}})

	if reset > 0 || maxRemaining > limit-spent {
		t.Errorf("budgets reset: %d of %d keys admitted more than the %d left (most: %s, %d), highest remaining seen %d",
			reset, len(keys), limit-spent, mostKey, most, maxRemaining)
	}
	if least < limit-spent {
		t.Errorf("a key admitted only %d of the %d left: counted more than was spent", least, limit-spent)
	}
	if p := count(evs).answeredPct(); p < 99.9 {
		t.Errorf("%.3f%% of queries answered within %v, want ≥ 99.9%% (degraded answers count)", p, answerTarget)
	}
	if bare > 0 {
		t.Errorf("%.0f partitions served from nothing, want 0", bare)
	}
}
