package chaos

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// defaultDeadAfter is serve's --dead-after default (API.md).
const defaultDeadAfter = 5 * time.Second

// loadFor lets the load run until it has run for d in total: a
// measurement window, not a wait for a condition.
func (l *load) loadFor(d time.Duration) {
	if w := d - l.since(); w > 0 {
		time.Sleep(w)
	}
}

func checks(rule string, cost int64, keys ...[]string) []check {
	var out []check
	for _, ks := range keys {
		for _, k := range ks {
			out = append(out, check{rule: rule, key: k, cost: cost})
		}
	}
	return out
}

// pickFollower returns a member that is not the leader, and the others.
func (c *cluster) pickFollower() (victim *member, others []*member) {
	lead := c.leader(c.members[0])
	for _, m := range c.members {
		if m != lead && victim == nil {
			victim = m
		} else {
			others = append(others, m)
		}
	}
	return victim, others
}

func addrs(ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.http)
	}
	return out
}

// waitOut waits until no member in ms has id in its ring, and returns
// the load's clock at that moment.
func waitOut(t *testing.T, l *load, ms []*member, id string, d time.Duration) time.Duration {
	t.Helper()
	waitFor(t, id+" out of the ring", d, func() bool {
		for _, m := range ms {
			ids := activeIDs(m.http)
			if ids == nil || contains(ids, id) {
				return false
			}
		}
		return true
	})
	return l.since()
}

// lagSampler records the highest ringlimit_backup_lag_seconds a member
// reports while it runs.
type lagSampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex // guards max, n
	max  float64
	n    int
}

func sampleLag(addr string) *lagSampler {
	s := &lagSampler{stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			if v, ok := metric(addr, "ringlimit_backup_lag_seconds"); ok {
				s.mu.Lock()
				s.max, s.n = max(s.max, v), s.n+1
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *lagSampler) done() (float64, int) {
	close(s.stop)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.n
}

// TestOwnerKill is scenario 1: SIGKILL of a member that owns watched keys,
// under load sent to the survivors.
func TestOwnerKill(t *testing.T) {
	skipUnlessChaos(t)
	for _, dead := range []time.Duration{2 * time.Second, defaultDeadAfter} {
		t.Run(fmt.Sprintf("dead-after=%v", dead), func(t *testing.T) {
			flag := dead
			if dead == defaultDeadAfter {
				flag = 0 // the default: no --dead-after flag
			}
			ownerKill(t, dead, flag)
		})
	}
}

func ownerKill(t *testing.T, dead, flag time.Duration) {
	// A burst far above what the run can spend: the buckets never fill
	// up to it, so tokens a promoted backup resurrects are not hidden by
	// the refill during the detection window (fail closed, nothing
	// spent); they show in the first "remaining" the new owner reports.
	const rate, burst = 20, 2000
	c := start3(t, flag, []api.Rule{{Name: "s1", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst, FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	victim, survivors := c.pickFollower()
	v := viewOf(t, survivors[0].http)
	keys := checks("s1", 1, v.keysOwnedBy("s1", victim.id, 20, false), v.keysOwnedBy("s1", victim.id, 20, true))

	l := newLoad(keys, 4, 2*rate, addrs(survivors)...)
	lag := sampleLag(victim.http)
	l.run()
	l.loadFor(4 * time.Second)
	maxLag, samples := lag.done()
	tKill := l.since()
	victim.kill()
	tOut := waitOut(t, l, survivors, victim.id, dead+30*time.Second)
	l.loadFor(tOut + 4*time.Second)
	l.stop()
	evs := l.snapshot()

	rep.add("scenario 1: SIGKILL of owner %s (follower) at t=%.2fs, --dead-after %v, load %d keys × %d checks/s to the survivors",
		victim.id, tKill.Seconds(), dead, len(keys), 2*rate)
	all := count(evs)
	rep.add("all checks: %v", all)
	rep.add("from the kill until out of the ring: %v", count(window(evs, tKill, tOut)))
	after := count(window(evs, tOut, time.Hour))
	rep.add("after out of the ring: %v", after)
	outAfter := tOut - tKill
	rep.add("dead member out of every survivor's ring %.2fs after the kill (target ≤ %v)", outAfter.Seconds(), dead+2*time.Second)
	rep.add("backup lag of %s before the kill: max %.4fs over %d samples", victim.id, maxLag, samples)
	uses := perKey(evs, keys)
	bound := func(u *keyUse) float64 { return tokenBound(u, rate, burst) }
	worst, totalOver := worstOver(uses, bound)
	rep.add("admitted against burst+rate×elapsed over the run: worst key %s over by %.1f", keys[worst.key].key, totalOver)
	resurrected := failoverOver(evs, keys, tKill, rate)
	worstKey, over := int32(-1), -1e9
	for k, o := range resurrected {
		if o > over || (o == over && k < worstKey) {
			worstKey, over = k, o
		}
	}
	worst = uses[worstKey]
	allowedOver := rate * (maxLag + 1)
	owner := v.owner(keys[worstKey].key)
	rep.add("over-admission at the failover (tokens the new owner reports beyond the last answer before the kill plus the refill since): worst key %s (owner %s) %.1f (target ≤ rate×(lag+1s) = %.1f); over the victim's %d keys: %s",
		keys[worstKey].key, owner, over, allowedOver, len(resurrected)/2, overList(resurrected, keys, v, victim.id))
	describeFailures(rep, l, evs)
	rep.write()
	timeline(t, c.dir, fmt.Sprintf("SIGKILL of owner %s, --dead-after %v", victim.id, dead), evs, keys,
		[]watched{{name: keys[worst.key].key, key: worst.key, bound: func(s float64) float64 { return burst + rate*s }}},
		[]marker{{tKill, "SIGKILL " + victim.id}, {tOut, victim.id + " out of the ring"}})

	if p := all.answeredPct(); p < 99.9 {
		t.Errorf("%.3f%% of checks answered within %v, want ≥ 99.9%%", p, answerTarget)
	}
	if outAfter > dead+2*time.Second {
		t.Errorf("dead member out of the ring after %v, want ≤ %v", outAfter, dead+2*time.Second)
	}
	if after.degraded > 0 || after.failed > 0 {
		t.Errorf("after the dead member left the ring: %d degraded, %d failed checks, want none", after.degraded, after.failed)
	}
	if over > allowedOver {
		t.Errorf("over-admission of %s = %.1f, want ≤ %.1f", keys[worstKey].key, over, allowedOver)
	}
}

// TestOwnerSleep is scenario 2: SIGSTOP of an owner for 2× --dead-after,
// then SIGCONT (a gray failure). Its keys are budgets (sliding_log, 40 per
// 2 minutes): 20 spent before the stop, the rest under load while it
// sleeps; nothing may pass after it wakes.
func TestOwnerSleep(t *testing.T) {
	skipUnlessChaos(t)
	const dead = 2 * time.Second
	const limit, spent = 40, 20
	c := start3(t, dead, []api.Rule{{Name: "s2", Algorithm: "sliding_log", Limit: limit, Period: "2m", FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	victim, survivors := c.pickFollower()
	v := viewOf(t, survivors[0].http)
	keys := checks("s2", 1, v.keysOwnedBy("s2", victim.id, 20, false), v.keysOwnedBy("s2", victim.id, 20, true))

	// Spend part of every budget (through a survivor) and let it reach
	// the backups; the load goes to all three members, the sleeper
	// included.
	other := spendAndReplicate(t, survivors[0], victim, survivors, keys, spent, 20, v)
	l := newLoad(keys, 4, 10, addrs(c.members)...)
	tStop, tOut, tWake := sleepPast(t, l, victim, survivors, 2*dead, nil)
	c.waitSettled(c.members)
	tBack := l.since()
	l.loadFor(tBack + 3*time.Second)
	l.stop()
	evs := l.snapshot()

	if len(other) > 0 {
		rep.add("before the fault, a settled cluster answered pre-spend checks degraded (sent again): %v", other)
	}
	rep.add("scenario 2: SIGSTOP of owner %s at t=%.2fs, out of the ring at %.2fs (%.2fs after the stop; target ≤ --dead-after %v + 2s), SIGCONT at %.2fs, active again and settled at %.2fs",
		victim.id, tStop.Seconds(), tOut.Seconds(), (tOut - tStop).Seconds(), dead, tWake.Seconds(), tBack.Seconds())
	rep.add("all checks (load to all 3 members, the sleeper included): %v", count(evs))
	rep.add("after the wake: %v", count(window(evs, tWake, time.Hour)))
	rep.add("after the sleeper is active again: %v", count(window(evs, tBack, time.Hour)))
	rep.add("sent to the woken member: %v", count(window(sentTo(l, evs, victim.http), tWake, time.Hour)))
	worst, worstAfter := budgetUse(evs, keys, tWake)
	total := spent + worst.admitted
	rep.add("worst key %s (owner %s): %d admitted in total (%d before the stop, %d under load from the stop on), limit %d; most admitted by one key after the wake: %d",
		keys[worst.key].key, v.owner(keys[worst.key].key), total, spent, worst.admitted, limit, worstAfter)
	describeFailures(rep, l, evs)
	rep.add("admissions of %s from the stop on: %s", keys[worst.key].key, strings.Join(admissions(c, l, evs, worst.key), "; "))
	stale := staleAdmissions(l, evs, keys, victim.http, tWake)
	rep.add("checks the sleeper admitted after it woke that had reached it while asleep (stale ownership): %d %v", len(stale), stale)
	rep.write()
	timeline(t, c.dir, fmt.Sprintf("SIGSTOP/SIGCONT of owner %s, --dead-after %v", victim.id, dead), evs, keys,
		[]watched{{name: keys[worst.key].key, key: worst.key, bound: func(float64) float64 { return limit - spent }}},
		[]marker{{tStop, "SIGSTOP " + victim.id}, {tOut, "out of the ring"}, {tWake, "SIGCONT"}, {tBack, "active again"}})

	// Each missed target fails, with what the run saw.
	var bugs []string
	if total > limit {
		if len(stale) > 0 {
			bugs = append(bugs, fmt.Sprintf("missed target (gray failure answers from stale ownership): key %s admitted %d, limit %d; the woken %s answered %d checks that reached it while it slept "+
				"with allowed=true, not degraded, after the majority had moved its partitions (e.g. %s): its lease does not stop it answering before its ring catches up",
				keys[worst.key].key, total, limit, victim.id, len(stale), stale[0]))
		} else {
			t.Errorf("key %s admitted %d, limit %d", keys[worst.key].key, total, limit)
		}
	}
	if tOut-tStop > dead+2*time.Second {
		bugs = append(bugs, fmt.Sprintf("missed target (failure detection of a hung member): %s was marked dead %.2fs after SIGSTOP, want ≤ --dead-after + 2s = %v; "+
			"the leader only sees FailedHeartbeatObservation after the Raft transport's 10s I/O timeout (node/raft.go NewNetworkTransport timeout, node/detect.go)",
			victim.id, (tOut-tStop).Seconds(), dead+2*time.Second))
	}
	for _, b := range bugs {
		t.Error(b)
	}
}

// preSpend spends n (cost 1) of every key's budget through m. A degraded
// (fail closed) answer spends nothing the client counts, so such checks
// are sent again (bounded); it returns how many there were by owner — a
// settled cluster should give none, and the scenarios report them.
func preSpend(t *testing.T, m *member, keys []check, n int64, v ownerView) map[string]int {
	t.Helper()
	spent := make(map[string]int64)
	degraded := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var short []check
		for _, k := range keys {
			if spent[k.key] < n {
				short = append(short, k)
			}
		}
		if len(short) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre-spend via %s: %d keys still short of %d after 20s; degraded answers by owner: %v", m.id, len(short), n, degraded)
		}
		for i, d := range batch(t, m.http, short) {
			switch {
			case d.Allowed && !d.Degraded:
				spent[short[i].key]++
			case d.Degraded:
				degraded["owner "+v.owner(short[i].key)]++
			default:
				t.Fatalf("pre-spend of %s denied by its owner %s: %+v", short[i].key, v.owner(short[i].key), d)
			}
		}
	}
	if len(degraded) > 0 {
		t.Logf("note: the settled cluster answered pre-spend checks degraded (sent again): %v", degraded)
	}
	return degraded
}

// batch sends one check per key, cost as given, and returns the decisions.
func batch(t *testing.T, addr string, keys []check) []api.Decision {
	t.Helper()
	req := api.BatchRequest{}
	for _, k := range keys {
		cost := k.cost
		req.Checks = append(req.Checks, api.CheckRequest{Rule: k.rule, Key: k.key, Cost: &cost})
	}
	body, _ := json.Marshal(req)
	code, out := post(addr, "/v1/check", "POST", body)
	var res api.BatchResponse
	if code != 200 || json.Unmarshal([]byte(out), &res) != nil || len(res.Results) != len(keys) {
		t.Fatalf("POST /v1/check to %s = %d %s", addr, code, out)
	}
	return res.Results
}

// TestLeaderKill is scenario 3: SIGKILL of the Raft leader; a membership
// write must succeed again within 5 s.
func TestLeaderKill(t *testing.T) {
	skipUnlessChaos(t)
	const dead = 2 * time.Second
	const rate, burst = 20, 20
	c := start3(t, dead, []api.Rule{{Name: "s3", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst, FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	lead, followers := c.leaderAndFollowers()
	write := func() (int, string) {
		body, _ := json.Marshal(api.StateRequest{ID: followers[0].id, State: "active"})
		return post(followers[1].http, "/v1/cluster/state", "POST", body)
	}
	if code, out := write(); code != 200 {
		t.Fatalf("membership write before the fault = %d %s", code, out)
	}
	v := viewOf(t, followers[0].http)
	keys := checks("s3", 1, v.keysOwnedBy("s3", lead.id, 15, false), v.keysOwnedBy("s3", lead.id, 15, true))
	l := newLoad(keys, 3, 2*rate, addrs(followers)...)
	l.run()
	l.loadFor(3 * time.Second)
	tKill := l.since()
	lead.kill()
	var tries int
	var last string
	waitFor(t, "a membership write to succeed", 30*time.Second, func() bool {
		tries++
		code, out := write()
		last = fmt.Sprintf("%d %s", code, out)
		return code == 200
	})
	tWrite := l.since()
	newLead := c.leader(followers[0])
	tOut := waitOut(t, l, followers, lead.id, 30*time.Second)
	l.loadFor(tOut + 3*time.Second)
	l.stop()
	evs := l.snapshot()

	took := tWrite - tKill
	rep.add("scenario 3: SIGKILL of leader %s at t=%.2fs; first membership write (POST /v1/cluster/state via %s) accepted %.2fs later after %d tries (last answer %s); new leader %s; %s out of the ring %.2fs after the kill",
		lead.id, tKill.Seconds(), followers[1].id, took.Seconds(), tries, last, newLead.id, lead.id, (tOut - tKill).Seconds())
	rep.add("all checks: %v", count(evs))
	rep.add("after out of the ring: %v", count(window(evs, tOut, time.Hour)))
	uses := perKey(evs, keys)
	bound := func(u *keyUse) float64 { return tokenBound(u, rate, burst) }
	worst, over := worstOver(uses, bound)
	rep.add("worst key %s (owner %s): admitted %d, bound %.1f, over-admission %.1f", keys[worst.key].key, v.owner(keys[worst.key].key), worst.admitted, bound(worst), over)
	describeFailures(rep, l, evs)
	rep.write()
	timeline(t, c.dir, fmt.Sprintf("SIGKILL of leader %s, --dead-after %v", lead.id, dead), evs, keys,
		[]watched{{name: keys[worst.key].key, key: worst.key, bound: func(s float64) float64 { return burst + rate*s }}},
		[]marker{{tKill, "SIGKILL leader " + lead.id}, {tWrite, "membership write ok"}, {tOut, lead.id + " out of the ring"}})
	if took > 5*time.Second {
		t.Errorf("membership writes succeeded again %v after the leader died, want ≤ 5s", took)
	}
}

// TestLeaderKillOthersAnswer is scenario 9: SIGKILL of the Raft leader at
// the default --dead-after, under load on keys the two other members own,
// sent to them. Every member's lease comes from the leader; they must
// outlast the election (1–3 s here), so the survivors answer their own
// keys at once throughout: no degraded answer, none late. Before the
// members' lease was made the long one (3/4 of dead-after), a new user
// saw every key of the cluster degraded for ~0.4 s about 2.3 s after the
// kill.
func TestLeaderKillOthersAnswer(t *testing.T) {
	skipUnlessChaos(t)
	const rate, burst = 1000, 1000 // never limiting: every answer is allowed unless degraded
	c := start3(t, 0, []api.Rule{{Name: "s9", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst, FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	lead, followers := c.leaderAndFollowers()
	v := viewOf(t, followers[0].http)
	keys := checks("s9", 1, v.keysOwnedBy("s9a", followers[0].id, 20, false), v.keysOwnedBy("s9b", followers[1].id, 20, false))
	l := newLoad(keys, 4, 20, addrs(followers)...) // 20 rounds a second: a gap of 50 ms shows
	l.run()
	l.loadFor(3 * time.Second)
	tKill := l.since()
	lead.kill()
	var cl api.Cluster
	waitFor(t, "a new leader", 30*time.Second, func() bool {
		return getJSON(followers[0].http, "/v1/cluster", &cl) == 200 && cl.Leader != "" && cl.Leader != lead.id
	})
	tElected, newLead := l.since(), c.byID(cl.Leader)
	tOut := waitOut(t, l, followers, lead.id, 30*time.Second)
	l.loadFor(tOut + 2*time.Second)
	l.stop()
	evs := l.snapshot()

	after := window(evs, tKill, time.Hour)
	tl := count(after)
	rep.add("scenario 9: SIGKILL of leader %s at t=%.2fs, default --dead-after (%v); new leader %s seen %.2fs after the kill; %s out of the ring %.2fs after it; load: %d keys owned by %s and %s, sent to them",
		lead.id, tKill.Seconds(), defaultDeadAfter, newLead.id, (tElected - tKill).Seconds(), lead.id, (tOut - tKill).Seconds(), len(keys), followers[0].id, followers[1].id)
	rep.add("all checks: %v", count(evs))
	rep.add("from the kill on: %v (target: none degraded, all answered within %v)", tl, answerTarget)
	describeFailures(rep, l, evs)
	rep.write()
	timeline(t, c.dir, fmt.Sprintf("SIGKILL of leader %s, default --dead-after", lead.id), evs, keys,
		[]watched{{name: keys[0].key, key: 0, bound: func(s float64) float64 { return burst + rate*s }}},
		[]marker{{tKill, "SIGKILL leader " + lead.id}, {tElected, newLead.id + " leads"}, {tOut, lead.id + " out of the ring"}})
	if tl.degraded > 0 || tl.answered < tl.checks {
		t.Errorf("the survivors' own keys after the leader's kill: %d of %d checks degraded, %d not answered within %v (slowest %v), want none",
			tl.degraded, tl.checks, tl.checks-tl.answered, answerTarget, tl.slowest)
	}
}

// TestRollingRestart is scenario 4: SIGTERM, restart with the same command
// line, wait until ready, next — all 3 members under load. 50 keys of a
// sliding_log limit-100 rule and 50 of a token_bucket rule.
func TestRollingRestart(t *testing.T) {
	skipUnlessChaos(t)
	const rate, burst, logLimit = 10, 20, 100
	c := start3(t, 2*time.Second, []api.Rule{
		{Name: "log", Algorithm: "sliding_log", Limit: logLimit, Period: "10m", FailureMode: "closed"},
		{Name: "tb", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst, FailureMode: "closed"},
	})
	rep := newReport(t, c.dir)
	keys := rollingKeys()
	l := newLoad(keys, 4, 2*rate, addrs(c.members)...)
	l.run()
	l.loadFor(3 * time.Second)
	marks := c.restartEach(l, 0)
	l.loadFor(marks[len(marks)-1].at + 3*time.Second)
	l.stop()
	evs := l.snapshot()

	rep.add("scenario 4: rolling restart (SIGTERM, same command line, ready, settled) of n1, n2, n3 under load to all members; restarts took %s",
		durations(marks))
	rep.add("all checks: %v", count(evs))
	b := rollingBudgets(evs, keys, rate, burst)
	b.report(rep, keys, logLimit, rate, burst, "", "")
	describeFailures(rep, l, evs)
	rep.write()
	timeline(t, c.dir, "rolling restart of n1, n2, n3", evs, keys, []watched{
		{name: keys[b.worstLog.key].key, key: b.worstLog.key, bound: func(float64) float64 { return logLimit }},
		{name: keys[b.worstTB.key].key, key: b.worstTB.key, bound: func(s float64) float64 { return burst + rate*s }},
	}, marks)
	b.check(t, keys, logLimit)
}

// rollingKeys are the keys of the rolling restarts (scenarios 4 and 11):
// 50 of the "log" rule and 50 of "tb", cost 1.
func rollingKeys() []check {
	var logKeys, tbKeys []string
	for i := range 50 {
		logKeys = append(logKeys, fmt.Sprintf("log-%d", i))
		tbKeys = append(tbKeys, fmt.Sprintf("tb-%d", i))
	}
	return append(checks("log", 1, logKeys), checks("tb", 1, tbKeys)...)
}

// restartEach stops each member in turn with SIGTERM, leaves it down for
// down, starts it again with the same command line and waits until the
// cluster has settled; it returns a marker at each stop and each return.
func (c *cluster) restartEach(l *load, down time.Duration) []marker {
	t := c.t
	t.Helper()
	var marks []marker
	for _, m := range c.members {
		marks = append(marks, marker{l.since(), "SIGTERM " + m.id})
		m.signal(syscall.SIGTERM)
		if !m.exited(30 * time.Second) {
			t.Fatalf("%s did not exit within 30s of SIGTERM", m.id)
		}
		time.Sleep(down) // a restart's downtime, as a new binary's would be
		m.start(t)
		c.waitSettled(c.members)
		marks = append(marks, marker{l.since(), m.id + " back"})
	}
	return marks
}

// rollingBudget is what the rolling restarts admitted: the sliding_log
// key admitted most, and the token bucket key furthest over burst +
// rate × elapsed (over, ≤ 0 when none is).
type rollingBudget struct {
	worstLog, worstTB *keyUse
	over, tbBound     float64
}

func rollingBudgets(evs []event, keys []check, rate float64, burst int64) rollingBudget {
	var b rollingBudget
	tbUses := map[int32]*keyUse{}
	for k, u := range perKey(evs, keys) {
		if keys[k].rule == "log" {
			if b.worstLog == nil || u.admitted > b.worstLog.admitted {
				b.worstLog = u
			}
		} else {
			tbUses[k] = u
		}
	}
	bound := func(u *keyUse) float64 { return tokenBound(u, rate, burst) }
	b.worstTB, b.over = worstOver(tbUses, bound)
	b.tbBound = bound(b.worstTB)
	return b
}

// report adds the budget lines; logMode and tbMode name the rules'
// failure modes in them, when the scenario says.
func (b rollingBudget) report(rep *report, keys []check, logLimit, rate int, burst int64, logMode, tbMode string) {
	rep.add("sliding_log limit %d per 10m%s: worst key %s admitted %d (target ≤ %d)", logLimit, logMode, keys[b.worstLog.key].key, b.worstLog.admitted, logLimit+1)
	rep.add("token_bucket %d/s burst %d%s: worst key %s admitted %d, burst+rate×elapsed %.1f, over by %.1f (target ≤ 0)",
		rate, burst, tbMode, keys[b.worstTB.key].key, b.worstTB.admitted, b.tbBound, b.over)
}

// check fails the test when a budget target is missed.
func (b rollingBudget) check(t *testing.T, keys []check, logLimit int64) {
	t.Helper()
	if b.worstLog.admitted > logLimit+1 {
		t.Errorf("sliding_log key %s admitted %d, want ≤ %d", keys[b.worstLog.key].key, b.worstLog.admitted, logLimit+1)
	}
	if b.over > 0 {
		t.Errorf("token_bucket key %s admitted %d, more than burst + rate × elapsed = %.1f", keys[b.worstTB.key].key, b.worstTB.admitted, b.tbBound)
	}
}

func durations(marks []marker) string {
	var s []string
	for i := 0; i+1 < len(marks); i += 2 {
		s = append(s, fmt.Sprintf("%.1fs", (marks[i+1].at-marks[i].at).Seconds()))
	}
	return fmt.Sprint(s)
}

// TestLeaveJoin is scenario 5: spend 30 of a 50 budget on 60 keys, then
// under load a new member joins and an old one leaves (`ringlimit leave`);
// the rest of each budget must be exactly what was left.
func TestLeaveJoin(t *testing.T) {
	skipUnlessChaos(t)
	const limit, spent = 50, 30
	const rate, burst = 20, 20
	c := start3(t, 2*time.Second, []api.Rule{
		{Name: "budget", Algorithm: "sliding_log", Limit: limit, Period: "10m", FailureMode: "closed"},
		{Name: "bg", Algorithm: "token_bucket", Limit: rate, Period: "1s", Burst: burst, FailureMode: "closed"},
	})
	rep := newReport(t, c.dir)
	var budget, bg []string
	for i := range 60 {
		budget = append(budget, fmt.Sprintf("budget-%d", i))
		bg = append(bg, fmt.Sprintf("bg-%d", i))
	}
	budgetKeys := checks("budget", 1, budget)
	vBefore := viewOf(t, c.members[0].http)
	preDegraded := preSpend(t, c.members[0], budgetKeys, spent, vBefore)
	// Under load: background token-bucket keys spend, the budgets are
	// queried with cost 0 (remaining must stay limit-spent throughout).
	keys := append(checks("budget", 0, budget), checks("bg", 1, bg)...)
	l := newLoad(keys, 4, 2*rate, c.members[0].http, c.members[2].http)
	l.run()
	l.loadFor(2 * time.Second)
	tJoin := l.since()
	n4 := c.add("n4")
	c.waitSettled(c.members)
	tJoined := l.since()
	leaving := c.members[1]
	out, err := exec.Command(binary(t), "leave", "--addr", c.members[0].http, "--id", leaving.id, "--admin-token", adminToken).CombinedOutput()
	if err != nil {
		t.Fatalf("ringlimit leave %s: %v\n%s", leaving.id, err, out)
	}
	if !leaving.exited(30 * time.Second) {
		t.Errorf("%s still runs 30s after leave", leaving.id)
	}
	rest := []*member{c.members[0], c.members[2], n4}
	c.waitSettled(rest)
	tLeft := l.since()
	l.loadFor(tLeft + 2*time.Second)
	l.stop()
	evs := l.snapshot()
	vAfter := viewOf(t, c.members[0].http)

	moved := 0
	for _, k := range budget {
		if vBefore.owner(k) != vAfter.owner(k) {
			moved++
		}
	}
	// Spend the rest: each key must admit exactly limit-spent more.
	rest1 := map[string]int64{}
	for range limit - spent + 5 {
		for i, d := range batch(t, n4.http, budgetKeys) {
			if d.Allowed && !d.Degraded {
				rest1[budget[i]]++
			}
		}
	}
	var most, least int64 = 0, limit
	var mostKey string
	for _, k := range budget {
		if rest1[k] > most {
			most, mostKey = rest1[k], k
		}
		least = min(least, rest1[k])
	}
	var maxRemaining int64
	var budgetEvs []event
	for _, e := range evs {
		if keys[e.key].rule == "budget" {
			budgetEvs = append(budgetEvs, e)
			if e.ok && !e.degraded {
				maxRemaining = max(maxRemaining, e.remaining)
			}
		}
	}
	if len(preDegraded) > 0 {
		rep.add("before the changes, a settled cluster answered pre-spend checks degraded (sent again): %v", preDegraded)
	}
	rep.add("scenario 5: n4 joined at t=%.2fs (settled %.2fs), `ringlimit leave` of %s done and settled at %.2fs; %d of %d budget keys changed owner",
		tJoin.Seconds(), tJoined.Seconds(), leaving.id, tLeft.Seconds(), moved, len(budget))
	rep.add("all checks: %v", count(evs))
	rep.add("budget queries (cost 0) during the changes: %v; highest remaining seen %d (want %d)", count(budgetEvs), maxRemaining, limit-spent)
	rep.add("after the changes each key admitted between %d and %d more (want exactly %d; most: %s)", least, most, limit-spent, mostKey)
	rep.write()
	var budgetIdx int32
	timeline(t, c.dir, "n4 joins, then n2 leaves", evs, keys, []watched{{name: "bg-0 (token bucket)", key: int32(len(budget)), bound: func(s float64) float64 { return burst + rate*s }}, {name: budget[0] + " (cost 0)", key: budgetIdx, bound: func(float64) float64 { return 0 }}},
		[]marker{{tJoin, "n4 joins"}, {tJoined, "n4 settled"}, {tLeft, leaving.id + " left"}})

	if most > limit-spent || maxRemaining > limit-spent {
		t.Errorf("a budget was reset: key %s admitted %d more after the changes (want ≤ %d), highest remaining seen %d", mostKey, most, limit-spent, maxRemaining)
	}
	if least < limit-spent {
		t.Logf("note: a key admitted only %d of its remaining %d (counted more than was spent)", least, limit-spent)
	}
}

// describeFailures adds when degraded answers came, and the first reasons
// for checks without a decision.
func describeFailures(rep *report, l *load, evs []event) {
	targets := *l.targets.Load()
	var first, last time.Duration = -1, 0
	via := map[string]int{}
	for _, e := range evs {
		if e.ok && e.degraded {
			if first < 0 {
				first = e.sent
			}
			last = e.sent
			if int(e.target) < len(targets) {
				via[targets[e.target]]++
			}
		}
	}
	if first >= 0 {
		rep.add("degraded answers sent between t=%.2fs and t=%.2fs, by entry member: %v", first.Seconds(), last.Seconds(), via)
	}
	for _, f := range l.failed() {
		rep.add("no decision: %s", f)
	}
}

// failoverOver returns, per key, how many tokens its owner after the
// fault reports beyond what the last answer before it allows: with R1 the
// remaining of the last limiter answer received before the fault (sent at
// s1) and R2 that of the first limiter answer sent after it (received at
// r2), a token bucket can hold at most R1 + rate×(r2−s1) − cost at r2;
// anything above was resurrected (admissions the new owner never heard
// of), so it can be admitted twice.
func failoverOver(evs []event, keys []check, fault time.Duration, rate float64) map[int32]float64 {
	type ans struct {
		e   event
		set bool
	}
	pre, post := map[int32]ans{}, map[int32]ans{}
	for _, e := range evs {
		if !e.ok || e.degraded {
			continue
		}
		if e.recv <= fault && (!pre[e.key].set || e.recv > pre[e.key].e.recv) {
			pre[e.key] = ans{e, true}
		}
		if e.sent >= fault && (!post[e.key].set || e.sent < post[e.key].e.sent) {
			post[e.key] = ans{e, true}
		}
	}
	out := map[int32]float64{}
	for k, a := range pre {
		b, ok := post[k]
		if !ok {
			continue
		}
		most := float64(a.e.remaining) + rate*(b.e.recv-a.e.sent).Seconds() - float64(keys[k].cost)
		out[k] = float64(b.e.remaining) - most
	}
	return out
}

// overList formats the victim's keys' over-admission, largest first.
func overList(over map[int32]float64, keys []check, v ownerView, victim string) string {
	var vals []float64
	for k, o := range over {
		if v.owner(keys[k].key) == victim {
			vals = append(vals, o)
		}
	}
	slices.Sort(vals)
	slices.Reverse(vals)
	var s []string
	for _, x := range vals {
		s = append(s, fmt.Sprintf("%.1f", x))
	}
	return "[" + strings.Join(s, " ") + "]"
}

func idOf(c *cluster, addr string) string {
	for _, m := range c.members {
		if m.http == addr {
			return m.id
		}
	}
	return addr
}
