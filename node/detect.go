package node

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/transport"
)

// detectLoop is the failure detector. While this member leads it pings
// every other active member over the data plane every DeadAfter/10 (at
// most 250ms); a member that has not answered a ping sent in the last
// DeadAfter is marked dead through the log, so every node moves its
// partitions at one epoch. The leader takes its own lease from the pings
// a quorum of Raft's voters answered (from their sending time) and from
// the Raft calls a quorum of them answered at its term (leaderLease), and
// has the members' voter flags corrected where they differ from Raft's
// configuration (syncVoterFlagsLater) and, when a voter has left, a
// non-voter promoted in its place (promoteNonvoters). Raft's own
// heartbeat failures are reported only after its transport's I/O timeout
// (10s), far too late for DeadAfter, hence the pings.
func (n *Node) detectLoop() {
	every := n.pingEvery()
	timeout := max(n.cfg.DeadAfter/4, 20*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastSeen := &n.contacts            // member → last answered ping, or when we first saw it, while we lead
	answered := map[string]time.Time{} // member → last answered ping only
	var servers []raft.Server          // Raft's configuration at the last tick, while we lead
	acked := map[string]time.Time{}    // scratch for leaderLease
	orphans := orphanWatch{}           // Raft servers that are no members, while we lead
	lease := leaderLease(n.cfg.DeadAfter)
	leading := false
	prevLeader := ""    // the leader this node last followed
	var heard time.Time // when this node last heard from prevLeader (Raft's LastContact)
	type pong struct {
		id string
		at time.Time
	}
	pongs := make(chan pong, 64)
	inflight := map[string]bool{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case p := <-pongs:
			delete(inflight, p.id)
			if !p.at.IsZero() {
				lastSeen.set(p.id, p.at)
				answered[p.id] = p.at
				if leading && servers != nil {
					// At once, not at the next tick: a new leader's lease,
					// and so the leases it grants, wait for its first pongs.
					n.leaderLease(servers, answered, acked, time.Now(), lease)
				}
			}
			continue
		case <-tick.C:
		case <-n.gainedLead:
		}
		if !n.isLeader() {
			if leading {
				lastSeen.reset()
				n.behind.reset()
				servers = nil
				clear(orphans)
			}
			leading = false
			if _, id := n.raft.raft.LeaderWithID(); id != "" && string(id) != n.cfg.ID {
				prevLeader, heard = string(id), n.raft.raft.LastContact()
			}
			continue
		}
		now := time.Now()
		if !leading {
			lastSeen.reset() // contact is measured afresh from our leadership
			n.behind.reset()
			clear(answered)
			leading = true
			if prevLeader != "" {
				lastSeen.set(prevLeader, n.deposedSilentSince(now, heard))
			}
		}
		snap := n.snap.Load()
		if snap == nil {
			continue
		}
		epoch := snap.v.Epoch()
		if cf := n.raft.raft.GetConfiguration(); cf.Error() == nil {
			servers = cf.Configuration().Servers
			n.leaderLease(servers, answered, acked, now, lease)
			if len(voterFlagFixes(snap.st, servers)) > 0 {
				n.syncVoterFlagsLater() // a flag whose write was lost after the Raft change
			}
			if v := raftVoters(servers); v < MaxVoters && v < len(servers) {
				// A seat is free and a non-voter waits (a voter left: a
				// leave, an orphan removed): it takes the seat, or the
				// cluster would stay with fewer voters, and tolerate fewer
				// failures, until the next change of leader. At every tick
				// (a promotion under way is not started twice): was only
				// when the count fell since the last tick, which missed a
				// leave that followed the fifth promotion within one tick
				// (a -race flake of TestNonVoterTakesTheSeatOfAVoterThatLeft).
				n.promoteNonvoters()
			}
			n.removeOrphansLater(orphans.update(snap.st, servers, n.cfg.ID, n.removed.Load(), now, orphanVoterGrace(n.cfg.DeadAfter)))
		}
		lastSeen.retain(func(id string) bool {
			if _, ok := snap.st.Member(id); !ok {
				// Left the cluster: if it joins again, under the same id,
				// its silence counts from then, not from before it left.
				delete(answered, id)
				n.behind.remove(id)
				return false
			}
			return true
		})
		for _, m := range snap.st.Members {
			if m.ID == n.cfg.ID || !pinged(m) {
				// Not expected to answer: its silence counts afresh from
				// when it is active again, not from before it stopped.
				lastSeen.remove(m.ID)
				n.behind.remove(m.ID)
				continue
			}
			seen := lastSeen.seen(m.ID, now)
			behind := false // it answers, but its ring or rules do not follow the log
			if from, ok := n.behind.since(m.ID, now, lease); ok && from.Before(seen) {
				seen, behind = from, true
			}
			if since := now.Sub(seen); since >= n.cfg.DeadAfter {
				if err := n.markDead(m.ID); err != nil {
					if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
						// Deposed meanwhile (a leader woken from a pause
						// finds everyone silent, and its lead gone): the
						// new leader decides.
						n.log.Debug("marking a member dead: no longer the leader", "id", m.ID, "err", err)
						continue
					}
					n.log.Warn("marking a member dead", "id", m.ID, "err", err)
					continue
				}
				n.m.markedDead.Inc()
				if behind {
					n.log.Warn("member marked dead: it answers, but its ring or rules have not followed the log (its Raft log cannot grow: a full or failing disk?), so it could not answer for its partitions",
						"id", m.ID, "behind_for", since.Round(time.Millisecond).String())
				} else {
					n.log.Warn("member marked dead", "id", m.ID, "silent_for", since.Round(time.Millisecond).String())
				}
				lastSeen.remove(m.ID)
				n.behind.remove(m.ID)
				continue
			}
			if inflight[m.ID] {
				continue
			}
			inflight[m.ID] = true
			id, addr := m.ID, m.Peer
			go func() {
				ctx, cancel := context.WithTimeout(n.ctx, timeout)
				defer cancel()
				var ack transport.PushAck
				sent := time.Now() // contact counts from the ping's sending: a late pong never extends it
				err := n.cfg.DataPlane.Push(ctx, addr, &transport.Push{Kind: transport.PushPing, Epoch: epoch, From: n.cfg.ID}, &ack)
				p := pong{id: id}
				if err == nil {
					p.at = sent
				}
				select {
				case pongs <- p:
				case <-n.ctx.Done():
				}
			}()
		}
	}
}

// deposedSilentSince is when the silence of the leader this node followed
// before it won the lead counts from, for a first leading tick at now,
// given when this node last heard from it (heard, Raft's LastContact as a
// follower; zero if unknown): from heard, as for any member, but never
// later than DeadAfter − leaderLease − leaseMargin before this node's
// election. So a crashed or hung leader leaves the ring after DeadAfter
// of silence or leaderLease (DeadAfter/4, + the margin) after the
// election, whichever is later, rather than DeadAfter after the election
// (chaos bug E).
//
// That is safe because of how a leader takes its own lease
// (leaderLeaseFrom): from Raft calls that a quorum of voters answered at
// its term, sent at or after the lease's base. This node's election needed
// a quorum too, and the two share a voter, which answered the old
// leader's call at the old term before it voted in the newer one: the
// base was before this node's election, so the old leader's lease, at most
// leaderLease long, ended before leaderLease after it. A lease it takes
// as a member once it has stepped down comes from this node's answers to
// its pings, as any member's does, and other members keep their whole
// DeadAfter: this argument bounds only the old leader's own lease.
func (n *Node) deposedSilentSince(now, heard time.Time) time.Time {
	won := now
	if t := n.leaderSince.Load(); t != nil && !t.After(now) {
		won = *t
	}
	d := n.cfg.DeadAfter
	bound := won.Add(-(d - leaderLease(d) - leaseMargin(d)))
	if heard.After(bound) && !heard.After(now) {
		return heard
	}
	return bound
}

func (n *Node) markDead(id string) error {
	n.membership.lock()
	defer n.membership.unlock()
	cmd, err := fsm.SetMemberState(id, fsm.Dead)
	if err != nil {
		return err
	}
	err = n.apply(n.ctx, cmd)
	if errors.Is(err, fsm.ErrUnknownMember) {
		return nil
	}
	return err
}
