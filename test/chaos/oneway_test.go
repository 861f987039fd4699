package chaos

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// cutTag starts the comment on every iptables rule scenario 8 inserts;
// the test process's id follows it, so that a run removes what a crashed
// run left behind without touching the rule of a run going on beside it.
const cutTag = "ringlimit-chaos-oneway-"

// iptables runs iptables and returns its standard output (the nft
// backend's warning about legacy tables goes to standard error).
func iptables(args ...string) (string, error) {
	cmd := exec.Command("iptables", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// needFirewall skips the scenario unless this process may insert rules
// into Docker's DOCKER-USER chain and bridged traffic between containers
// passes through it.
func needFirewall(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("scenario 8 cuts one direction of a link with an iptables rule, which needs root")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skipf("scenario 8 cuts one direction of a link with an iptables rule, and there is no iptables: %v", err)
	}
	if _, err := iptables("-S", "DOCKER-USER"); err != nil {
		t.Skipf("scenario 8 puts its rule in Docker's DOCKER-USER chain, which is missing: %v", err)
	}
	if b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Skip("scenario 8 needs bridged traffic between containers to pass iptables (net.bridge.bridge-nf-call-iptables=1)")
	}
}

// removeCuts deletes the DOCKER-USER rules tagged cutTag whose process id
// drop accepts (or cannot be read).
func removeCuts(drop func(pid int) bool) error {
	out, err := iptables("-S", "DOCKER-USER")
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "--comment")
		if len(f) < 2 || f[0] != "-A" || i < 0 || i+1 == len(f) || !strings.HasPrefix(f[i+1], cutTag) {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimPrefix(f[i+1], cutTag)); err == nil && !drop(pid) {
			continue
		}
		f[0] = "-D"
		if _, err := iptables(f...); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// alive reports whether a process with this id exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// oneWayCut drops every packet from one address to a TCP port of another:
// connections that side opens to that port, established ones included,
// carry nothing, while the answers on them and every other connection,
// either way, pass.
type oneWayCut struct {
	spec []string // the rule, after the chain's name
}

// cutOneWay inserts the rule. The test's cleanup removes it whatever
// happens, and first every rule a process that has gone left behind.
func cutOneWay(t *testing.T, from, to string, port int) *oneWayCut {
	t.Helper()
	me := os.Getpid()
	if err := removeCuts(func(pid int) bool { return pid == me || !alive(pid) }); err != nil {
		t.Fatalf("removing rules left behind: %v", err)
	}
	t.Cleanup(func() {
		if err := removeCuts(func(pid int) bool { return pid == me }); err != nil {
			t.Errorf("removing the cut: %v", err)
		}
	})
	// No --syn or conntrack state: a connection the side opened before
	// the cut (the data plane pools them) must carry nothing either.
	c := &oneWayCut{spec: []string{"-s", from + "/32", "-d", to + "/32", "-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(port),
		"-m", "comment", "--comment", cutTag + strconv.Itoa(me), "-j", "DROP"}}
	if _, err := iptables(append([]string{"-I", "DOCKER-USER"}, c.spec...)...); err != nil {
		t.Fatal(err)
	}
	return c
}

// packets returns how many packets the rule has dropped.
func (c *oneWayCut) packets() (int64, error) {
	out, err := iptables("-S", "DOCKER-USER", "-v")
	if err != nil {
		return 0, err
	}
	tag := c.spec[slices.Index(c.spec, "--comment")+1]
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if i := slices.Index(f, "-c"); i >= 0 && i+1 < len(f) && slices.Contains(f, tag) {
			return strconv.ParseInt(f[i+1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no rule tagged %s in DOCKER-USER", tag)
}

func (c *oneWayCut) heal() error {
	_, err := iptables(append([]string{"-D", "DOCKER-USER"}, c.spec...)...)
	return err
}

// sample is what the watcher saw at one moment (the load's clock): the
// victim's /readyz, and whether the victim is in the leader's, the third
// member's and its own ring.
type sample struct {
	at                  time.Duration
	ready               int
	why                 string // /readyz's body when not ready
	inLead, inThird, in bool
}

// watcher samples every 25ms until stopped.
type watcher struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	mu   sync.Mutex // guards got
	got  []sample
}

// watch starts a watcher; the test's cleanup stops it if the test ends
// first.
func watch(t *testing.T, l *load, victim, lead, third *member) *watcher {
	w := &watcher{stop: make(chan struct{})}
	t.Cleanup(func() { w.done() })
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			s := sample{at: l.since()}
			s.ready, s.why = readyz(victim.http)
			s.inLead = contains(activeIDs(lead.http), victim.id)
			s.inThird = contains(activeIDs(third.http), victim.id)
			s.in = contains(activeIDs(victim.http), victim.id)
			w.mu.Lock()
			w.got = append(w.got, s)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watcher) done() []sample {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got
}

// first returns the time of the first sample at or after from for which
// cond holds, or -1.
func first(ss []sample, from time.Duration, cond func(sample) bool) time.Duration {
	for _, s := range ss {
		if s.at >= from && cond(s) {
			return s.at
		}
	}
	return -1
}

// readyz returns the status of GET /readyz and, when not ready, its body.
func readyz(addr string) (int, string) {
	resp, err := ctlClient.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		return 200, ""
	}
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// logLine is one line of a member's JSON log.
type logLine struct {
	Time    time.Time `json:"time"`
	Msg     string    `json:"msg"`
	ID      string    `json:"id"`      // the member a line is about
	Members int       `json:"members"` // "ring changed": how many
}

// logged returns the lines of a container's log with message msg about
// member id.
func logged(container, msg, id string) []logLine {
	out, _ := docker("logs", container)
	var got []logLine
	for _, line := range strings.Split(out, "\n") {
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.ID == id {
			got = append(got, l)
		}
	}
	return got
}

// TestOneWayCut is scenario 8: the Raft leader can no longer reach one
// follower's data-plane port, while everything else passes (Raft both
// ways, the follower's own connections to the leader's data plane, the
// third member's to both). The follower keeps asking the leader for its
// lease and hears back, so only the leader's refusal to grant a lease to
// a member it has not heard from lately (node.grantsLease) ends it before
// the leader marks the member dead and the others take its partitions.
// The keys are budgets (sliding_log, 150 per 2 minutes) sent through all
// three members, the cut one included: no key may admit more than its
// limit, and each admission of a key must leave a different remaining,
// which two owners answering at once would not. With the cut in place the
// member stays dead (the leader's join check cannot reach its data
// plane); once it is lifted the member is back with its budgets.
func TestOneWayCut(t *testing.T) {
	skipUnlessChaos(t)
	needDocker(t, "scenario 8")
	needFirewall(t)
	const dead = 2 * time.Second
	const limit = 150
	const peerPort = 8082
	d := startDocker3(t, fmt.Sprintf("rlchaos-%d-s8", os.Getpid()), dead)
	c := d.cluster
	// A non-voter victim would leave the leader and the third member as
	// the only voters: not this scenario.
	c.waitVoters(3)
	c.setRules([]api.Rule{{Name: "s8", Algorithm: "sliding_log", Limit: limit, Period: "2m", FailureMode: "closed"}})
	rep := newReport(t, c.dir)
	lead := c.leader(c.members[0])
	var victim, third *member
	for _, m := range c.members {
		switch {
		case m == lead:
		case victim == nil:
			victim = m
		default:
			third = m
		}
	}
	v := viewOf(t, lead.http)
	victimKeys := v.keysOwnedBy("s8", victim.id, 20, false)
	keys := checks("s8", 1, victimKeys, v.keysOwnedBy("s8", victim.id, 20, true))
	isVictims := func(k int32) bool { return int(k) < len(victimKeys) }
	// 20 checks of every key a second, through all three members: the
	// others' keys run out at about 7.5 s, the victim's after it has left
	// the ring, before the cut is lifted.
	l := newLoad(keys, 4, 20, addrs(c.members)...)
	l.run()
	t.Cleanup(l.stop) // if the test ends before it stops the load itself
	w := watch(t, l, victim, lead, third)
	l.loadFor(3 * time.Second) // backups in place, and a baseline

	tCut := l.since() // the rule is in force once iptables returns
	cut := cutOneWay(t, d.ips[lead.id], d.ips[victim.id], peerPort)
	tOutSeen := waitOut(t, l, []*member{lead, third}, victim.id, 20*time.Second)
	// Hold the cut for 2 × dead-after after the victim left the ring (it
	// keeps trying to re-register), and until its keys have run out, so
	// that after the heal anything admitted would be over the limit.
	spent := func() bool {
		denied := map[int32]bool{}
		for _, e := range l.snapshot() {
			if isVictims(e.key) && e.ok && !e.allowed && !e.degraded {
				denied[e.key] = true
			}
		}
		return len(denied) == len(victimKeys)
	}
	for l.since() < tOutSeen+2*dead || !spent() {
		if l.since() > tOutSeen+10*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	dropped, perr := cut.packets()
	spentAtHeal := spent()
	tHeal := l.since()
	if err := cut.heal(); err != nil {
		t.Fatal(err)
	}
	tBack := time.Duration(-1)
	for l.since() < tHeal+30*time.Second {
		if c.settled(c.members) {
			tBack = l.since()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.loadFor(max(tBack, tHeal) + 3*time.Second)
	l.stop()
	ss := w.done()
	evs := l.snapshot()
	nowLead := c.leader(third)

	// When things happened, from the watcher's samples.
	tOut := first(ss, tCut, func(s sample) bool { return !s.inLead && !s.inThird })
	tOutFirst := first(ss, tCut, func(s sample) bool { return !s.inLead || !s.inThird })
	tSelfOut := first(ss, tCut, func(s sample) bool { return !s.in })
	tLeaseEnd := first(ss, tCut, func(s sample) bool { return s.ready != 200 && strings.Contains(s.why, "no lease") })
	tNotReady := first(ss, tCut, func(s sample) bool { return s.ready != 200 })
	var whyNotReady string
	for _, s := range ss {
		if s.at == tNotReady {
			whyNotReady = s.why
		}
	}
	tActive := first(ss, tHeal, func(s sample) bool { return s.inLead && s.inThird && s.in })
	var flaps []string
	was := false
	for _, s := range ss {
		if s.at < tOut || s.at >= tHeal {
			continue
		}
		if now := s.inLead || s.inThird; now != was {
			flaps = append(flaps, fmt.Sprintf("t=%.2fs in the leader's ring %v, the third's %v", s.at.Seconds(), s.inLead, s.inThird))
			was = now
		}
	}
	at := func(d time.Duration) string {
		if d < 0 {
			return "never"
		}
		return fmt.Sprintf("t=%.2fs", d.Seconds())
	}
	rep.add("scenario 8: leader %s, victim %s (follower), third member %s; --dead-after %v; binary %s", lead.id, victim.id, third.id, dead, binary(t))
	rep.add("the cut: iptables -I DOCKER-USER %s (%s → %s:%d), inserted at t=%.2fs, lifted at t=%.2fs; it dropped %d packets (%v)",
		strings.Join(cut.spec, " "), d.ips[lead.id], d.ips[victim.id], peerPort, tCut.Seconds(), tHeal.Seconds(), dropped, perr)
	rep.add("the victim's /readyz first not ready at %s (%q); lease over (\"no lease\") at %s; out of the leader's or the third's ring at %s, of both at %s (%.2fs after the cut; target ≤ --dead-after + 2s); out of its own ring at %s",
		at(tNotReady), whyNotReady, at(tLeaseEnd), at(tOutFirst), at(tOut), (tOut - tCut).Seconds(), at(tSelfOut))
	if tLeaseEnd >= 0 && tOutFirst >= 0 {
		rep.add("the victim's lease ended %.2fs after the cut and %.3fs before the first ring without it (sampled every 25ms)", (tLeaseEnd - tCut).Seconds(), (tOutFirst - tLeaseEnd).Seconds())
	}
	marked := logged(d.container(lead), "member marked dead", victim.id)
	var markedAt []string
	for _, m := range marked {
		markedAt = append(markedAt, fmt.Sprintf("t=%.2fs", m.Time.Sub(l.start).Seconds()))
	}
	joined := logged(d.container(lead), "member joined", victim.id)
	var joinedAt []string
	for _, m := range joined {
		if since := m.Time.Sub(l.start); since >= 0 {
			joinedAt = append(joinedAt, fmt.Sprintf("t=%.2fs", since.Seconds()))
		}
	}
	rep.add("the leader's log: %s marked dead at %v; joined again at %v", victim.id, markedAt, joinedAt)
	if len(flaps) == 0 {
		rep.add("with the cut in place (%.2fs from leaving the ring to the heal) %s stayed out of both rings", (tHeal - tOut).Seconds(), victim.id)
	} else {
		rep.add("with the cut in place %s came back into a ring: %v", victim.id, flaps)
	}
	rep.add("after the heal: %s active in all three rings at %s (%.2fs after), the cluster settled at %s (%.2fs after); leader at the end %s",
		victim.id, at(tActive), (tActive - tHeal).Seconds(), at(tBack), (tBack - tHeal).Seconds(), nowLead.id)

	// Who decided the victim's keys around the moment the leader marked
	// it dead (from the leader's log, to the millisecond; the containers
	// share the host's clock). Until the victim's own ring drops it (its
	// log), a check of its keys sent to it, or to the third member and
	// answered before that one's ring drops it, is decided by the victim
	// (one answered after may have been routed under the new ring, to
	// the partition's new owner: a CI run counted 5 sent 1 ms before the
	// third's "ring changed" line and answered 5 ms after, with every
	// budget exact and the victim's lease over 250 ms before); the
	// leader forwards nothing to it through the cut, and from the mark on
	// decides the partitions it gained from its backup copies. The fix
	// ends the victim's lease, and so its decisions, before the mark.
	tMarked, tVictimRing, tThirdRing := time.Duration(-1), time.Duration(-1), time.Duration(-1)
	if len(marked) > 0 {
		tMarked = marked[0].Time.Sub(l.start)
	}
	for _, r := range []struct {
		m  *member
		at *time.Duration
	}{{victim, &tVictimRing}, {third, &tThirdRing}} {
		for _, ln := range logged(d.container(r.m), "ring changed", "") {
			if at := ln.Time.Sub(l.start); at > tCut && ln.Members == 2 {
				*r.at = at
				break
			}
		}
	}
	var lastByVictim time.Duration = -1
	var afterMark []string
	for _, e := range evs {
		entry := idOf(c, (*l.targets.Load())[e.target])
		if !isVictims(e.key) || !e.ok || e.degraded || e.sent < tCut || e.recv >= tVictimRing ||
			entry != victim.id && (entry != third.id || e.recv >= tThirdRing) {
			continue
		}
		lastByVictim = max(lastByVictim, e.recv)
		if e.recv >= tMarked {
			afterMark = append(afterMark, fmt.Sprintf("%s via %s sent %.3fs answered %.3fs remaining %d", keys[e.key].key, entry, e.sent.Seconds(), e.recv.Seconds(), e.remaining))
		}
	}
	rep.add("%s's keys: last decided by %s (sent to it, or through %s) answered at %s, %.3fs before the leader marked it dead at %s; answered after the mark: %d %v; rings without it: %s's at %s, %s's own at %s (their logs)",
		victim.id, victim.id, third.id, at(lastByVictim), (tMarked - lastByVictim).Seconds(), at(tMarked), len(afterMark), afterMark[:min(len(afterMark), 3)],
		third.id, at(tThirdRing), victim.id, at(tVictimRing))
	toVictim := sentTo(l, evs, victim.http)
	// A member that has lost its lease holds the checks it would decide
	// itself for up to the lease wait (node/owner.go leaseWait, 2s):
	// the router's forward timeout bounds forwarded checks only.
	var held []string
	for _, e := range window(toVictim, tCut, tHeal) {
		if !e.ok {
			held = append(held, fmt.Sprintf("t=%.2fs", e.sent.Seconds()))
		}
	}
	held = slices.Compact(held)
	rep.add("batches sent to %s during the cut without a decision within the client's 2s: %d, sent at %v", victim.id, len(held), held)
	// The cut is one-way: the victim's calls to the leader's data plane
	// pass, so checks of the leader's keys sent to it are decided.
	var viaVictim int
	for _, e := range toVictim {
		if e.sent >= tCut && e.sent < tHeal && e.ok && !e.degraded && v.owner(keys[e.key].key) == lead.id {
			viaVictim++
		}
	}
	rep.add("checks of %s's keys sent to %s during the cut and decided by a limiter (the victim's calls to the leader pass): %d", lead.id, victim.id, viaVictim)

	// Budgets: at most the limit, and a different remaining for every
	// admission of a key.
	uses := perKey(evs, keys)
	var worst *keyUse
	for _, u := range uses {
		if worst == nil || u.admitted > worst.admitted || u.admitted == worst.admitted && u.key < worst.key {
			worst = u
		}
	}
	var repeats []string
	seen := map[[2]int64]float64{}
	for _, e := range evs {
		if !e.admitted() {
			continue
		}
		k := [2]int64{int64(e.key), e.remaining}
		if before, ok := seen[k]; ok {
			repeats = append(repeats, fmt.Sprintf("%s remaining %d at %.3fs and %.3fs", keys[e.key].key, e.remaining, before, e.recv.Seconds()))
		}
		seen[k] = e.recv.Seconds()
	}
	least := int64(limit)
	for _, u := range uses {
		least = min(least, u.admitted)
	}
	rep.add("budgets: every key admitted between %d and %d (limit %d); worst %s (owner %s); admissions that repeated a remaining: %d %v",
		least, worst.admitted, limit, keys[worst.key].key, v.owner(keys[worst.key].key), len(repeats), repeats[:min(len(repeats), 3)])
	var afterHeal, deniedAfter int
	for _, e := range window(evs, max(tBack, tHeal), time.Hour) {
		if isVictims(e.key) && e.admitted() {
			afterHeal++
		}
		if isVictims(e.key) && e.ok && !e.allowed && !e.degraded {
			deniedAfter++
		}
	}
	rep.add("%s's keys once it is back (all spent before the heal: %v): %d admitted, %d denied by the limiter; owner of %s now %s",
		victim.id, spentAtHeal, afterHeal, deniedAfter, victimKeys[0], viewOf(t, third.http).owner(victimKeys[0]))

	// Availability outside the failure windows: from the cut until the
	// victim is out of both rings, and from the heal until the cluster
	// has settled; a check in flight when one begins is in it.
	var outside, inside []event
	for _, e := range evs {
		if e.recv >= tCut && e.sent < tOut || e.recv >= tHeal && (tBack < 0 || e.sent < tBack) {
			inside = append(inside, e)
		} else {
			outside = append(outside, e)
		}
	}
	out := count(outside)
	rep.add("all checks: %v", count(evs))
	rep.add("outside the failure windows (target ≥ 99%% answered): %v", out)
	rep.add("inside them (cut → out of the rings, heal → settled, and the checks in flight at the cut or the heal): %v", count(inside))
	rep.add("from the victim leaving the rings to the heal: %v", count(window(evs, tOut, tHeal)))
	describeFailures(rep, l, evs)
	rep.write()
	writeEvents(t, c.dir, l, evs, keys)
	var marks []marker
	for _, m := range []marker{{tCut, "cut " + lead.id + " → " + victim.id + ":8082"}, {tLeaseEnd, "lease over"}, {tOut, "out of the rings"}, {tHeal, "cut lifted"}, {tBack, "settled"}} {
		if m.at >= 0 {
			marks = append(marks, m)
		}
	}
	timeline(t, c.dir, fmt.Sprintf("one-way cut %s → %s data plane, --dead-after %v", lead.id, victim.id, dead), evs, keys,
		[]watched{{name: keys[0].key + " (" + victim.id + "'s)", key: 0, bound: func(float64) float64 { return limit }}}, marks)

	// The cut took effect, and only one way.
	if perr != nil || dropped == 0 {
		t.Errorf("the rule dropped no packet (%d, %v): the cut did not take effect", dropped, perr)
	}
	if len(marked) == 0 {
		t.Errorf("the leader %s never logged %s marked dead", lead.id, victim.id)
	}
	if nowLead != lead {
		t.Errorf("the leader changed during the run (%s, then %s): the cut is no longer the leader's", lead.id, nowLead.id)
	}
	if viaVictim == 0 {
		t.Errorf("no check of %s's keys sent to %s during the cut was decided: the cut is not one-way", lead.id, victim.id)
	}
	// Each missed target fails, with what the run saw.
	if tOut < 0 || tOut-tCut > dead+2*time.Second {
		t.Errorf("%s left the majority's rings %.2fs after the cut, want ≤ --dead-after + 2s = %v", victim.id, (tOut - tCut).Seconds(), dead+2*time.Second)
	}
	if tLeaseEnd < 0 || tOutFirst >= 0 && tLeaseEnd >= tOutFirst {
		t.Errorf("%s's lease did not end before the first ring without it (lease over at %s, first ring without it at %s): it answered as owner while another member could",
			victim.id, at(tLeaseEnd), at(tOutFirst))
	}
	if len(afterMark) > 0 {
		t.Errorf("%s decided %d checks of its keys after the leader had marked it dead and taken them (%s), e.g. %v",
			victim.id, len(afterMark), at(tMarked), afterMark[:min(len(afterMark), 3)])
	}
	if worst.admitted > limit {
		t.Errorf("key %s admitted %d, limit %d: %s", keys[worst.key].key, worst.admitted, limit, strings.Join(admissions(c, l, evs, worst.key), "; "))
	}
	if len(repeats) > 0 {
		t.Errorf("%d admissions repeated a remaining already answered for their key (two owners, or a lost admission), e.g. %v", len(repeats), repeats[:min(len(repeats), 5)])
	}
	if len(flaps) > 0 {
		t.Errorf("%s came back into a ring while the leader could not reach it: %v", victim.id, flaps)
	}
	if tBack < 0 {
		t.Errorf("the cluster did not settle with %s back within 30s of the heal", victim.id)
	}
	if spentAtHeal && afterHeal > 0 {
		t.Errorf("%s's keys, spent before the heal, admitted %d checks once it was back", victim.id, afterHeal)
	}
	if p := out.answeredPct(); p < 99 {
		t.Errorf("%.3f%% of checks outside the failure windows answered within %v, want ≥ 99%%", p, answerTarget)
	}
}

// writeEvents writes every check as a line of events.csv, for a closer
// look than the summary gives.
func writeEvents(t *testing.T, dir string, l *load, evs []event, keys []check) {
	t.Helper()
	targets := *l.targets.Load()
	var b strings.Builder
	b.WriteString("sent_s,recv_s,key,entry,ok,allowed,degraded,remaining\n")
	for _, e := range evs {
		fmt.Fprintf(&b, "%.4f,%.4f,%s,%s,%v,%v,%v,%d\n", e.sent.Seconds(), e.recv.Seconds(), keys[e.key].key, targets[e.target], e.ok, e.allowed, e.degraded, e.remaining)
	}
	if err := os.WriteFile(filepath.Join(dir, "events.csv"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
}
