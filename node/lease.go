package node

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/transport"
)

// pingEvery is the period of the leader's pings and of the members'
// lease requests: DeadAfter/10, at most 250ms, at least 10ms.
func (n *Node) pingEvery() time.Duration {
	return max(min(n.cfg.DeadAfter/10, 250*time.Millisecond), 10*time.Millisecond)
}

// leaderLease renews the leader's own lease while a quorum of the voters
// of Raft's latest configuration (servers; itself included) answered its
// pings within the lease, a quorum of them answered its Raft calls at its
// term within the lease and none at a newer term (leaderLeaseFrom), and
// its ring has caught up with its log. acked is scratch space.
func (n *Node) leaderLease(servers []raft.Server, answered, acked map[string]time.Time, now time.Time, lease time.Duration) {
	o := n.owner.Load()
	if o == nil || !n.viewCurrent() {
		return
	}
	term := n.raft.raft.CurrentTerm()
	superseded := n.raft.terms.acks(term, acked)
	if base, ok := leaderLeaseFrom(n.cfg.ID, servers, answered, acked, superseded, now, lease); ok {
		o.SetLeaseUntil(base.Add(lease))
		n.leaderLeaseAt.Store(&termLease{until: base.Add(lease), term: term})
	}
}

// leaderLeaseFrom is when the leader's lease counts from: the earlier of
// leaderLeaseBase over the answers to its pings (answered) and over the
// answers to its Raft calls at its term (acked, see termWatch); false
// unless both give one, or when an answer carried a newer term
// (superseded).
//
// An answer to a ping says that its member is alive, not that it follows
// this leader. A leader that Raft has not stepped down yet (a paused
// process just woken, or one whose disk hangs: Raft's leader loop is what
// would notice the newer term) still pings, and members that follow a
// newer leader still answer - at the epoch this one knows, until that
// leader marks this one dead: a lease taken from those answers outlives
// the mark by up to the lease while the backups already serve this
// one's partitions, so checking the answers' epochs is not enough
// either. A voter that answered a Raft call sent at t at this leader's
// term had not voted for a newer leader by then, so with a quorum of them
// no newer leader was elected before the quorum's base, and none marks
// this one dead sooner than DeadAfter after it: past the lease.
func leaderLeaseFrom(self string, servers []raft.Server, answered, acked map[string]time.Time, superseded bool, now time.Time, lease time.Duration) (time.Time, bool) {
	if superseded {
		return time.Time{}, false
	}
	pinged, ok := leaderLeaseBase(self, servers, answered, now, lease)
	if !ok {
		return time.Time{}, false
	}
	inTerm, ok := leaderLeaseBase(self, servers, acked, now, lease)
	if !ok {
		return time.Time{}, false
	}
	if inTerm.Before(pinged) {
		return inTerm, true
	}
	return pinged, true
}

// leaderLeaseBase is leaseBase over the voters of Raft's configuration
// servers, for the leader self, from answered (each member's last answer
// to its pings); false when self is not one of those voters.
//
// The voters are Raft's, not the cluster state's Voter flags: Raft's
// voters elect the next leader, which then marks a leader it cannot
// reach dead and gives its partitions to others, so only a quorum of
// Raft's voters can stand for "no other leader can be elected without
// one of these". The flags are written after the Raft change they record
// and lag it; counted over them, a voter missing from the flags shrinks
// the quorum (two missing of three or five voters let a leader lease
// itself from a minority, or alone) and a voter that answered but is not
// flagged does not count.
func leaderLeaseBase(self string, servers []raft.Server, answered map[string]time.Time, now time.Time, lease time.Duration) (time.Time, bool) {
	voters, voting := 0, false
	var buf [MaxVoters]time.Time
	others := buf[:0]
	for _, s := range servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(s.ID) == self {
			voting = true
			continue
		}
		if at, ok := answered[string(s.ID)]; ok && now.Sub(at) < lease {
			others = append(others, at)
		}
	}
	if !voting {
		return time.Time{}, false
	}
	return leaseBase(now, others, voters)
}

// leaseBase is the instant a leader's lease counts from: when the last of
// its freshest quorum of voters had answered - the quorum-th most recent
// answer, the leader itself answering at now - or false when fewer than a
// quorum answered (others holds the other voters' answers within the
// lease; voters counts the leader).
//
// The freshest quorum, not every voter that answered within the lease: a
// voter that has just died still counts as answered until the lease has
// passed since its last answer, and taking the oldest answer then made
// the lease end at that instant, one ping round before the dead voter
// stopped counting and the quorum of the living renewed it - a gap in
// which the leader answered nothing (the chaos suite saw ~250 ms of
// checks time out at dead-after/2 after killing a follower).
func leaseBase(now time.Time, others []time.Time, voters int) (time.Time, bool) {
	quorum := max(voters, 1)/2 + 1
	if 1+len(others) < quorum {
		return time.Time{}, false
	}
	if quorum == 1 {
		return now, true
	}
	slices.SortFunc(others, func(a, b time.Time) int { return b.Compare(a) }) // newest first
	return others[quorum-2], true                                             // the leader is the newest of all
}

// leaseLoop takes this member's lease while it follows: every DeadAfter/10
// (at most 250ms) it asks the leader for its ring epoch; when the leader
// grants it (grantsLease) and its own ring has reached that epoch, it may
// answer for what it owns until memberLease after it asked (a late answer
// extends nothing). A member cut off from
// the leader, or asleep (SIGSTOP), therefore stops answering before the
// leader marks it dead (DeadAfter) and the others take its partitions;
// when it wakes, it answers only once its ring has caught up.
//
// A request not granted while this member still holds a lease (no
// leader known, the leader unreachable, or a new leader without its own
// lease yet) is asked again after retryEvery, not a whole period later:
// after a leader's crash the next one grants leases as soon as it holds
// its own, and the members' leases, taken from the crashed one, are
// running out. A member without a lease (woken from a pause, back from
// dead) asks at the usual period: answering sooner would widen a window
// in which a partition it takes back serves its own stale state (bug G in
// test/chaos/README.md: a refused hand-off taken back by its sender while
// another member had served the partition).
func (n *Node) leaseLoop() {
	every := n.pingEvery()
	retry := min(every, retryEvery)
	lease := memberLease(n.cfg.DeadAfter)
	next := time.NewTimer(every)
	defer next.Stop()
	var lapses lapseLog
	for {
		// Ask at once when this member has no lease (it just started or
		// joined): a ring change wakes the loop too.
		var changed <-chan struct{}
		if o := n.owner.Load(); o == nil || !o.Serving() {
			changed = n.cell.Changed()
		}
		select {
		case <-n.ctx.Done():
			return
		case <-next.C:
		case <-changed:
		}
		o := n.owner.Load()
		if o != nil {
			lapses.look(n, o, time.Now())
		}
		granted := n.askLease(every, lease)
		wait := every
		if o != nil {
			if !granted && o.Serving() {
				wait = retry
			}
			lapses.look(n, o, time.Now())
		}
		next.Reset(wait) // Go 1.23+: no stale tick can follow a Reset
	}
}

// lapseLog says when this member's lease ran out while it was serving,
// and when it was back: its checks are answered unavailable in between
// (by each rule's failure mode), which an operator sees as degraded
// decisions with no other line saying why (a new user's walk through
// the README, on a starved machine). At warn level at most every 30s
// (the renewal after a warned lapse at info, the others at debug). A
// member that is stopping, removed, or not expected to answer (marked
// down or dead) is granted no lease and says nothing of it: its stop's
// drain outlasts its lease (a review: warnings 0.5-1.3 s into every
// graceful stop).
type lapseLog struct {
	serving  bool      // a granted lease held at the last look
	since    time.Time // when the lease ran out, once a lapse is seen; zero while serving
	warned   bool      // the lapse since since was logged at warn level
	lastWarn time.Time
}

// look looks at the lease, before the loop asks for it and after (a
// lease may run out while the ask waits for its answer).
//
// A lapse is of a lease granted: a member whose ring lists only itself
// needs none and serves, and the lease it needs once others are in its
// ring is its first, not one that ran out (was: every follower warned
// about a second into a whole-cluster restart, found in a Compose walk
// through the deployment docs).
func (l *lapseLog) look(n *Node, o *Owner, now time.Time) {
	left, needed := o.LeaseRemaining()
	serving := needed && left > 0 // holds a granted lease
	switch {
	case !needed:
		l.since = time.Time{} // answers without one
	case l.serving && !serving:
		if n.stopping.Load() || n.removed.Load() || !n.expectsAnswers(n.cfg.ID) {
			break
		}
		l.since = o.LeaseEnd()
		if l.since.After(now) {
			l.since = now
		}
		why := "no leader is known"
		if lid, _ := n.leader(); n.isLeader() {
			why = "it leads, and has not heard from a quorum of Raft voters within its lease"
		} else if lid != "" {
			why = "the leader (" + lid + ") did not renew it in time"
		}
		msg := "this member's lease ran out: its checks are answered unavailable (each rule's failure mode) until it is renewed"
		l.warned = now.Sub(l.lastWarn) >= 30*time.Second
		if l.warned {
			n.log.Warn(msg, "why", why, "hint", "a member starved of CPU loses its lease; raise --raft-timeout and --dead-after where the load is over the cores")
			l.lastWarn = now
		} else {
			n.log.Debug(msg, "why", why)
		}
	case serving && !l.since.IsZero():
		level := slog.LevelDebug
		if l.warned {
			level = slog.LevelInfo
		}
		n.log.Log(context.Background(), level, "lease renewed: checks answered again", "without_lease_ms", now.Sub(l.since).Milliseconds())
		l.since = time.Time{}
	}
	l.serving = serving
}

// retryEvery is how soon a member asks again for a lease it was not
// granted.
const retryEvery = 25 * time.Millisecond

// askLease asks the leader for this member's lease (leaseLoop), waiting
// at most timeout for its answer, and reports whether it was granted;
// true as well when there is nothing to ask (this member leads, or has
// no ring yet).
func (n *Node) askLease(timeout, lease time.Duration) bool {
	o, snap := n.owner.Load(), n.snap.Load()
	if o == nil || snap == nil || n.isLeader() {
		return true
	}
	lid, _ := n.leader()
	m, ok := snap.st.Member(lid)
	if !ok || m.Peer == "" {
		return false
	}
	asked := time.Now()
	ctx, cancel := context.WithTimeout(n.ctx, timeout)
	var ack transport.PushAck
	err := n.cfg.DataPlane.Push(ctx, m.Peer, transport.LeaseRequest(n.cfg.ID, snap.v.Epoch(), snap.v.RulesVersion), &ack)
	cancel()
	if err == nil && ack.Epoch != transport.NoLease && n.viewCurrent() && n.cell.Load().Epoch() >= ack.Epoch {
		o.SetLeaseUntil(asked.Add(lease))
		return true
	}
	return false
}

// viewCurrent reports whether the published view is the FSM's latest
// membership (the ring has caught up with the log).
func (n *Node) viewCurrent() bool {
	s := n.snap.Load()
	return s != nil && s.v.Epoch() >= n.fsm.State().MembershipIndex
}
