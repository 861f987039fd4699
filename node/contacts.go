package node

import (
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
)

// contacts is, while this member leads, when it last heard from each
// member it expects to answer (detectLoop's record of contact, from the
// sending time of the last answered ping, or from when it began counting).
// detectLoop writes it; grantsLease reads it as members ask for their
// leases, and leaveKeepsQuorum as a leave is asked (both record first
// sight, as seen says).
type contacts struct {
	mu sync.Mutex
	at map[string]time.Time // guarded by mu
}

func (c *contacts) set(id string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = map[string]time.Time{}
	}
	c.at[id] = t
}

// seen returns when this member last heard from id, counting from at
// (and recording it) when it has no record of id: silence counts from
// first sight.
func (c *contacts) seen(id string, at time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.at[id]
	if !ok {
		if c.at == nil {
			c.at = map[string]time.Time{}
		}
		c.at[id], t = at, at
	}
	return t
}

func (c *contacts) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.at, id)
}

// reset forgets every contact (a leadership begins or ends).
func (c *contacts) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.at)
}

// retain forgets the members for which keep returns false.
func (c *contacts) retain(keep func(id string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.at {
		if !keep(id) {
			delete(c.at, id)
		}
	}
}

// grantsLease reports whether this member grants member id the lease it
// asks for at now (a PushPing from it): only while this member leads and
// holds its own lease, only to a member of the cluster that is neither
// dead nor down, and only while this member has heard from it within
// leaderLease(DeadAfter) (or has no record of it yet: a member active
// again, whose silence counts from now). A lease runs memberLease from the
// member's sending of its request (before it arrived here), so every
// lease granted ends leaseMargin before this member may mark it dead
// (DeadAfter of silence): a member this leader cannot reach, even one
// that still reaches it (a one-way cut), has stopped answering for its
// partitions before the others take them.
//
// Without its own lease the leader may be deposed without knowing it
// (its lease needs a quorum answering at its term, see leaderLeaseFrom),
// and a member that does not lead has no say over who is dead: a member
// that still takes either for the leader gets no lease from it.
func (n *Node) grantsLease(id string, now time.Time) bool {
	if !n.isLeader() {
		return false
	}
	if o := n.owner.Load(); o == nil || !o.Serving() {
		return false
	}
	// Its own lease as leader, at its current term: the owner's lease
	// (Serving) may still be the one this node was granted as a follower,
	// up to memberLease long, which outlives a deposed leader's grants'
	// bound (d/4 after the next election). Was: a leader just elected,
	// whose disk hung so that Raft could not step it down, granted leases
	// from that leftover one, and a member cut off with it answered after
	// the others had taken its partitions (17 of 30 audit runs).
	if l := n.leaderLeaseAt.Load(); l == nil || l.term != n.raft.raft.CurrentTerm() || !now.Before(l.until) {
		return false
	}
	if !n.expectsAnswers(id) {
		return false
	}
	// A member active again after being down or dead, or new, has no
	// record until the detector's next tick, which counts its silence
	// from then: count it from now, as the detector will from its first
	// sight. The detector forgets a member it marks dead only once the
	// state says so: asked again after the record, the state tells a
	// record just forgotten from one never made.
	at := n.contacts.seen(id, now)
	d := n.cfg.DeadAfter
	return n.expectsAnswers(id) && now.Sub(at) < d-memberLease(d)-leaseMargin(d)
}

// expectsAnswers reports whether the cluster lists member id as one the
// failure detector pings (pinged).
func (n *Node) expectsAnswers(id string) bool {
	m, ok := n.fsm.State().Member(id)
	return ok && pinged(m)
}

// pinged reports whether the leader's failure detector expects m to
// answer: neither dead nor down (its silence counts afresh from when it
// is active again).
func pinged(m fsm.Member) bool { return m.State != fsm.Dead && m.State != fsm.Down }

// The leases, for a DeadAfter of d. A member may be marked dead once it
// has been silent for d, and must have stopped answering for its
// partitions by then; the two leases share d between them:
//
//   - leaderLease (d/4) is the leader's own, from the Raft calls and pings
//     a quorum of voters answered (leaderLeaseFrom). A leader deposed
//     while it slept cannot renew it, so it ends by d/4 after the next
//     leader's election (a voter of that election answered it before
//     voting): the next leader marks a crashed leader dead as soon as
//     d/4 after its election (deposedSilentSince).
//   - memberLease (d − d/4 − leaseMargin) is a member's, granted by a
//     leader that holds its own. A grant by a deposed leader that still
//     holds its lease comes at most d/4 after the next election, and that
//     leader marks the member dead no sooner than d after its election:
//     the lease has ended by then. The leader grants only to a member it
//     heard from within d − memberLease − leaseMargin (d/4), so a stable
//     leader too marks no member dead before its lease ends.
//
// The member's is the long one because it is what keeps a cluster
// answering while a crashed leader is replaced: every member's lease
// comes from the leader, and the next one is elected 1–3 s later with
// Raft's default timeout. With d/2 each, at the default d of 5s, the
// members' leases ran out 2–2.5 s after the leader's crash and every
// member answered its checks degraded until the election (seen by a new
// user: 0.4 s of every key degraded, cluster-wide).
func leaderLease(d time.Duration) time.Duration { return d / 4 }

func memberLease(d time.Duration) time.Duration { return d - leaderLease(d) - leaseMargin(d) }

// leaseMargin is what the leader leaves between the end of any lease a
// member may hold and the instant it may mark that member dead: for
// clocks that run at slightly different rates, nothing more (durations on
// both sides are measured on monotonic clocks).
func leaseMargin(deadAfter time.Duration) time.Duration {
	return max(deadAfter/20, 10*time.Millisecond)
}

// last returns when this member last heard from id, without recording
// anything (seen counts from first sight; a reader must not start that
// count): false when it has no record of id.
func (c *contacts) last(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.at[id]
	return t, ok
}

// behindReports is, per member, the first and the last of its lease
// requests with an old ring or old rules since its last with current
// ones; and the rules versions this leader has applied lately, each with
// when it first saw it (settledRules).
type behindReports struct {
	mu    sync.Mutex
	at    map[string][2]time.Time // guarded by mu
	rules []seenRules             // guarded by mu; oldest first
}

// seenRules is a rules version and when the leader first saw it applied.
type seenRules struct {
	version uint64
	at      time.Time
}

// settledRules records cur as this leader's rules version at now and
// returns the newest version it has had for at least grace (0 when it
// has had none so long): a member whose lease request says an older one
// is behind. Rules written more often than grace keep the newest version
// unsettled; a member that follows them a little late is not behind.
// Only versions seen within grace are kept, and one before them.
func (b *behindReports) settledRules(cur uint64, now time.Time, grace time.Duration) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.rules) == 0 || b.rules[len(b.rules)-1].version != cur {
		b.rules = append(b.rules, seenRules{version: cur, at: now})
	}
	settled := -1
	for i, r := range b.rules {
		if now.Sub(r.at) >= grace {
			settled = i
		}
	}
	if settled < 0 {
		return 0
	}
	b.rules = b.rules[settled:]
	return b.rules[0].version
}

func (b *behindReports) note(id string, behind bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !behind {
		delete(b.at, id)
		return
	}
	if b.at == nil {
		b.at = map[string][2]time.Time{}
	}
	r, ok := b.at[id]
	if !ok {
		r[0] = now
	}
	r[1] = now
	b.at[id] = r
}

// since returns since when member id has asked with an old ring or old
// rules, while
// its last such request came within recent of now: a member that stops
// asking (it knows no leader for a while, say: an election it does not
// hear the end of) is judged by its pings alone. It was marked dead too,
// with another member, and partitions whose owner and backup both were
// came back full.
func (b *behindReports) since(id string, now time.Time, recent time.Duration) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.at[id]
	return r[0], ok && now.Sub(r[1]) < recent
}

func (b *behindReports) remove(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.at, id)
}

func (b *behindReports) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.at)
	b.rules = b.rules[:0]
}
