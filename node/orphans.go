package node

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
)

// orphanVoterGrace is how long a voter may stay in Raft's configuration
// without a record in the cluster state: a leave cut short by its
// leader's death leaves one, whose member is still handing its partitions
// off, the dead leader's included. It must see the ring that marks the
// leader dead (DeadAfter) to send those to their next owners, and it sees
// rings only while it is in Raft; then it leaves Raft, or the next leader
// removes it. Its vote counts meanwhile (it runs until it is out of Raft:
// awaitOutOfRaft).
func orphanVoterGrace(deadAfter time.Duration) time.Duration { return deadAfter + 2*time.Second }

// orphanGrace is how long a non-voter may stay in Raft's configuration
// without a record in the cluster state before the leader removes it from
// Raft (removeOrphansLater). A join adds the server to Raft (a non-voter,
// when members are promoted once caught up), then the member to the
// state, both under the membership lock on one leader, so a live join is
// an orphan only for the instant between the two; a join cut short by a
// lead change is asked again by the joining member within seconds
// (registerLoop), and one removed meanwhile is added back then. A voter
// orphan is removed at once: it is a leave cut short, or a join made a
// voter at once and cut short (no Prober), whose member asks again.
const orphanGrace = 10 * time.Second

// orphanWatch tracks, for the leader's liveness loop (detectLoop), since
// when each orphan of Raft's configuration has been one: a server that is
// no member of the cluster state. Orphans are what a leave leaves when
// the lead moves between its two halves (the member removed from the
// ring, then from Raft: leaveTail), or a join whose member died between
// its Raft half and its ring half. A voter orphan counts toward Raft's
// quorum and, once its process has gone, never answers: a cluster of 4
// whose leader crashed in the middle of a leave had 2 live voters of 4
// and stopped (no leader, no lease, every check degraded).
type orphanWatch map[raft.ServerID]time.Time

// update records the orphans of servers given the state st as of now, and
// returns those due for removal: voters once they have been orphans for
// voterGrace (orphanVoterGrace), non-voters for orphanGrace. This node counts only when removed
// (it left, and leads until it is out of Raft too); a node that has not
// registered yet (just bootstrapped) is no orphan.
func (w orphanWatch) update(st *fsm.State, servers []raft.Server, self string, removed bool, now time.Time, voterGrace time.Duration) (due []raft.ServerID) {
	seen := map[raft.ServerID]bool{}
	for _, s := range raftOrphans(st, servers, self, removed) {
		seen[s.ID] = true
		since, ok := w[s.ID]
		if !ok {
			w[s.ID], since = now, now
		}
		grace := orphanGrace
		if s.Suffrage == raft.Voter {
			grace = voterGrace
		}
		if now.Sub(since) >= grace {
			due = append(due, s.ID)
		}
	}
	for id := range w {
		if !seen[id] {
			delete(w, id)
		}
	}
	return due
}

// raftOrphans lists the servers of Raft's configuration that st does not
// list as members; this node only when removed.
func raftOrphans(st *fsm.State, servers []raft.Server, self string, removed bool) []raft.Server {
	var out []raft.Server
	for _, s := range servers {
		if string(s.ID) == self && !removed {
			continue
		}
		if _, ok := st.Member(string(s.ID)); !ok {
			out = append(out, s)
		}
	}
	return out
}

// removeOrphansLater removes the orphans ids from Raft in the background
// while this node leads, unless a run is under way (leaderChoreLater: it
// holds the membership lock, so no join or leave runs meanwhile). A
// failed run is retried at a later tick of detectLoop.
func (n *Node) removeOrphansLater(ids []raft.ServerID) {
	if len(ids) == 0 {
		return
	}
	n.leaderChoreLater(&n.removingOrphans, "removing servers that are no members from raft", func() error { return n.removeOrphans(ids) })
}

// removeOrphans removes those of ids that are still orphans from Raft,
// looking again once the log is applied (a leader early in its term may
// not have applied the join of a member it would otherwise take for an
// orphan). The caller holds n.membership and leads.
func (n *Node) removeOrphans(ids []raft.ServerID) error {
	if _, err := n.await(n.ctx, n.raft.raft.Barrier(applyTimeout), "barrier"); err != nil {
		return raftUnavailable("waiting for the log", err)
	}
	cf := n.raft.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	still := map[raft.ServerID]bool{}
	for _, s := range raftOrphans(n.fsm.State(), cf.Configuration().Servers, n.cfg.ID, n.removed.Load()) {
		still[s.ID] = true
	}
	for _, id := range ids {
		if !still[id] {
			continue
		}
		if err := n.removeFromRaft(n.ctx, string(id)); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		n.log.Warn("removed a server that is no member from raft (a leave or join cut short)", "id", string(id))
	}
	return nil
}
