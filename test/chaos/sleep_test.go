package chaos

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// What the SIGSTOP scenarios share: budgets spent before the
// stop and backed up, a sleep until the others have taken the sleeper's
// partitions, and what the sleeper answered once it woke.

// spendAndReplicate spends n of every key's budget through via (preSpend)
// and waits until the members in backups hold at least want backup keys,
// then for two replication rounds as victim measures them: no check is in
// flight when the victim stops, so replication lag plays no part in what
// a sleep scenario measures (scenario 1 measures that). It returns
// preSpend's degraded answers by owner.
func spendAndReplicate(t *testing.T, via, victim *member, backups []*member, keys []check, n int64, want int, v ownerView) map[string]int {
	t.Helper()
	degraded := preSpend(t, via, keys, n, v)
	waitFor(t, "backups of "+victim.id+"'s keys", 10*time.Second, func() bool {
		var got float64
		for _, m := range backups {
			x, _ := metric(m.http, "ringlimit_backup_keys")
			got += x
		}
		return got >= float64(want)
	})
	lag, _ := metric(victim.http, "ringlimit_backup_lag_seconds")
	time.Sleep(time.Duration(2 * lag * float64(time.Second)))
	return degraded
}

// sleepPast sends SIGSTOP to victim and starts the load l (the load
// starts at the stop), lets victim sleep for at least d and until every
// member of others has taken it out of its ring, then sends SIGCONT. Should
// detection be late it sleeps on until they have (at most 30s), so that
// waking after losing its partitions is still what is tested; the late
// detection is for the caller to report. poll, if not nil, is called
// every 20ms while it sleeps. Times are the load's clock.
func sleepPast(t *testing.T, l *load, victim *member, others []*member, d time.Duration, poll func()) (tStop, tOut, tWake time.Duration) {
	t.Helper()
	out := func() bool {
		for _, m := range others {
			if ids := activeIDs(m.http); ids == nil || contains(ids, victim.id) {
				return false
			}
		}
		return true
	}
	victim.signal(syscall.SIGSTOP)
	l.run()
	tStop, tOut = l.since(), -1
	for l.since() < tStop+d || tOut < 0 {
		if tOut < 0 && out() {
			tOut = l.since()
		}
		if poll != nil {
			poll()
		}
		if l.since() > tStop+30*time.Second {
			t.Fatalf("%s still in the ring 30s after SIGSTOP", victim.id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	tWake = l.since()
	victim.signal(syscall.SIGCONT)
	return tStop, tOut, tWake
}

// sentTo returns the events whose batch went to addr.
func sentTo(l *load, evs []event, addr string) []event {
	targets := *l.targets.Load()
	var out []event
	for _, e := range evs {
		if targets[e.target] == addr {
			out = append(out, e)
		}
	}
	return out
}

// staleAdmissions describes the checks the member at addr admitted once
// it woke at tWake that had reached it while it slept: answers from
// ownership the others had already taken over.
func staleAdmissions(l *load, evs []event, keys []check, addr string, tWake time.Duration) []string {
	var stale []string
	for _, e := range sentTo(l, evs, addr) {
		if e.admitted() && e.recv >= tWake && e.sent < tWake {
			stale = append(stale, fmt.Sprintf("%s sent %.2fs answered %.2fs remaining %d", keys[e.key].key, e.sent.Seconds(), e.recv.Seconds(), e.remaining))
		}
	}
	return stale
}

// budgetUse returns the key that admitted the most over evs and the most
// one key admitted from tWake on.
func budgetUse(evs []event, keys []check, tWake time.Duration) (worst *keyUse, mostAfter int64) {
	for _, u := range perKey(evs, keys) {
		if worst == nil || u.admitted > worst.admitted || u.admitted == worst.admitted && u.key < worst.key {
			worst = u
		}
	}
	for _, u := range perKey(window(evs, tWake, time.Hour), keys) {
		mostAfter = max(mostAfter, u.admitted)
	}
	return worst, mostAfter
}

// admissions describes every admission of key k: when, through which member.
func admissions(c *cluster, l *load, evs []event, k int32) []string {
	targets := *l.targets.Load()
	var adm []string
	for _, e := range evs {
		if e.key == k && e.admitted() {
			adm = append(adm, fmt.Sprintf("sent %.2fs answered %.2fs via %s remaining %d", e.sent.Seconds(), e.recv.Seconds(), idOf(c, targets[e.target]), e.remaining))
		}
	}
	return adm
}
