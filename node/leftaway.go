package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
)

// ClusterReader reads another member's view of the cluster over its
// HTTP API: what a member restarted over its data dir asks the members
// its log knows, when no Raft leader reaches it (leftWhileAway). A
// Forwarder may implement it; without it the member does not ask.
type ClusterReader interface {
	ClusterOf(ctx context.Context, memberHTTP string) (RemoteCluster, error)
}

// RemoteCluster is a member's view of its cluster, as ClusterOf reads it.
type RemoteCluster struct {
	ID      string   // the member that answered ("" when unknown)
	Leader  string   // the id of its Raft leader; "" when it knows none
	Epoch   uint64   // its membership index (ring epoch)
	Seed    uint64   // its cluster's hash seed: the cluster's identity
	Members []string // the ids of every member it lists, in any state
	// RaftOnly are the servers of its latest Raft configuration that it
	// lists as no member (api.Cluster.RaftOnly).
	RaftOnly []string
}

// removedIn reports whether r, another member's view, shows that member
// self, whose local snapshot and log say h, was removed from the cluster
// after that log ends: r knows a Raft leader (a member amid an election,
// or cut off, has only its last word), r is of the same cluster (the
// seed is drawn at random when a cluster is initialised: another cluster
// at the same addresses, or one rebuilt over wiped data dirs, has
// another), r's membership index is at least that of the last change to
// self's own record in h, and r does not list self.
//
// The index matters: a member that lags behind self's join does not list
// self yet. One at or past the change has applied it, the very entry
// when it was committed (Raft's logs agree on every committed entry), so
// that it lists self no more means a later removal; when the entry was
// never committed (self's join or return cut short as it crashed, and
// overwritten by the next leader), the cluster does not hold self as a
// member either, and removes a Raft server that is no member by itself
// (removeOrphansLater).
func removedIn(h localHistory, self string, r RemoteCluster) bool {
	return r.Leader != "" && r.Leader != self && h.seed != 0 && r.Seed == h.seed &&
		h.since > 0 && r.Epoch >= h.since && !slices.Contains(r.Members, self)
}

// removedBeforeRestart reports whether st, this member's state once it
// has caught up after a restart over its data dir, shows it removed
// after the last change to its record that its log held (h.since): the
// leader's last append to a server it removes, or the log between a
// leave's two halves, reached a member restarted just then, and it
// caught up past its removal in one go, never seeing itself listed. It
// re-registered then, as a new member over the data dir of one that
// left. A record whose entry the caught-up log holds at another term
// was never committed (a join or return cut short by a crash, which the
// next leader's log overwrote): no removal, it registers again.
func (n *Node) removedBeforeRestart(st *fsm.State) bool {
	h := n.raft.local
	if !n.raft.hasState || n.joinEpoch.Load() != 0 || h.since == 0 || st.MembershipIndex < h.since {
		return false
	}
	if _, ok := st.Member(n.cfg.ID); ok {
		return false
	}
	var l raft.Log
	if h.sinceTerm != 0 && n.raft.logs.GetLog(h.since, &l) == nil && l.Term != h.sinceTerm {
		return false
	}
	return true
}

// leftBeforeRestart stops this member (noteLeft) and reports true when
// it has caught up with the log and removedBeforeRestart.
func (n *Node) leftBeforeRestart() bool {
	st := n.fsm.State()
	if !n.caughtUpTo(st) || !n.removedBeforeRestart(st) {
		return false
	}
	n.noteLeft(n.leftInLog(st))
	return true
}

// leftInLog is the error of a member that found its removal in its log
// as it caught up after a restart (removedBeforeRestart).
func (n *Node) leftInLog(st *fsm.State) error {
	return fmt.Errorf("%w: member %q left the cluster (ringlimit leave) while it was away: its log, caught up after the restart, holds the removal (epoch %d; the log it restarted with lists it as of epoch %d); start it over an empty --data-dir to join again as a new member",
		ErrDataDir, n.cfg.ID, st.MembershipIndex, n.raft.local.since)
}

// removedWhileRunningAfter is how long a running member that knew a
// leader waits with none before it asks whether it was removed
// (leftWhileAway): past an election and the next leader's first
// replication to it, DeadAfter and two Raft timeouts.
func (n *Node) removedWhileRunningAfter() time.Duration {
	return n.cfg.DeadAfter + 2*n.cfg.RaftTimeout
}

// leftWhileAwayAfter is how long a member restarted over its data dir
// waits for a Raft leader to reach it before it asks the others whether
// it is still a member (leftWhileAway): two Raft timeouts, in which a
// leader that has the member in its configuration sends it a heartbeat.
func (n *Node) leftWhileAwayAfter() time.Duration { return 2 * n.cfg.RaftTimeout }

// leftWhileAway watches a member for a removal that its log never
// received. At a restart over its data dir: a member crashed (marked
// dead, say) and removed by `ringlimit leave` while it was away. The
// leader sends a server it removes one last append, which a member that
// is down misses; started again, it waits for a leader that sends it
// nothing more, campaigns, and the others refuse its votes (Raft and the
// Raft guard turn away a server they no longer list), forever. Its log
// cannot tell it; the others can. While it runs: a member removed while
// its Raft log could not grow (a full disk) or its Raft links were cut
// stayed in that state for good, its process running (an audit: after a
// `leave` that answered "left").
//
// So whenever no Raft leader has reached it for leftWhileAwayAfter since
// its start, or removedWhileRunningAfter since it last knew one, every
// Raft timeout it asks the
// members it knows for their view of the cluster (ClusterReader), all at
// once, each for at most a Raft timeout, and stops with the error its
// start over a log holding its removal gets (Config.OnLeft) once one of
// them shows it removed (removedIn) after the last change to its own
// record that it knows: its log's at the restart (raft.local), or its
// state's, when newer. A member that is merely cut off hears no answer,
// or answers that list it; another cluster answers with another seed; a
// cluster amid an election answers with no leader: none of these stop
// it. While a leader reaches it, Raft takes it from there.
//
// Why not the Raft guard's refusal: it reaches the member only as the
// text of a failed vote, inside Raft, which logs it and retries; it
// comes from any server that does not list the member in its latest
// (perhaps uncommitted) configuration, including a member of another
// cluster sharing the secret, or one asked at an address it moved from;
// and Raft's in-memory transport (tests) has no guard at all.
func (n *Node) leftWhileAway() {
	reader, ok := n.cfg.Forward.(ClusterReader)
	if !ok {
		return // nothing to ask with
	}
	tick := time.NewTicker(n.cfg.RaftTimeout)
	defer tick.Stop()
	leaderless := time.Now() // since when no leader has reached it; zero while one does
	first := time.NewTimer(n.leftWhileAwayAfter())
	defer first.Stop()
	said, other := false, false
	knewLeader := false // a leader has reached it since it started
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-first.C:
		case <-tick.C:
		}
		if n.removed.Load() || n.stopping.Load() {
			return
		}
		if n.leaderKnown() {
			leaderless, said, knewLeader = time.Time{}, false, true
			continue
		}
		if leaderless.IsZero() {
			leaderless = time.Now()
		}
		wait := n.leftWhileAwayAfter()
		if knewLeader {
			// Running: an election (its leader crashed as it was being
			// removed, say) is no reason; the next leader brings the
			// removal, and the member hands its partitions off as it
			// leaves. Asked during one, it stopped with nothing handed
			// off, and the keys it held came back full.
			wait = n.removedWhileRunningAfter()
		}
		h, ok := n.ownHistory()
		if !ok || time.Since(leaderless) < wait {
			continue // a new member, or a log that never listed it; or not long enough
		}
		if !said {
			n.log.Info("no raft leader has reached this member for a while: asking the members it knows whether it is still one of them",
				"waited", time.Since(leaderless).Round(time.Millisecond).String())
			said = true
		}
		if err := n.askWhetherRemoved(reader, h, &other); err != nil {
			n.noteLeft(err)
			return
		}
	}
}

// ownHistory is what this member knows of its own record to ask with
// (leftWhileAway): its log's at the restart, or its state's when that
// lists it since later; false when neither lists it (a new member, or
// one never listed) or knows the cluster's seed.
func (n *Node) ownHistory() (localHistory, bool) {
	h := n.raft.local
	if !n.raft.hasState {
		h = localHistory{}
	}
	if st := n.fsm.State(); st != nil {
		if m, ok := st.Member(n.cfg.ID); ok && m.Since > h.since && st.Config.Seed != 0 {
			h.since, h.sinceTerm, h.seed = m.Since, 0, st.Config.Seed
		}
	}
	return h, h.seed != 0 && h.since != 0
}

// askWhetherRemoved asks every member this member's log knows (and its
// --join) for its view (viewsOfOthers), and returns the error to stop with
// when one shows this member removed (removedIn); nil otherwise. An
// answer of another cluster is logged once (warned).
func (n *Node) askWhetherRemoved(reader ClusterReader, h localHistory, warned *bool) error {
	for _, a := range n.viewsOfOthers(reader) {
		switch {
		case removedIn(h, n.cfg.ID, a.r):
			return n.leftError(a.addr, a.r, h.since)
		case a.r.Seed != h.seed && !*warned:
			*warned = true
			n.log.Warn("a member this member's log knows answers for another cluster (another hash seed): not taken into account", "member", a.addr)
		default:
			n.log.Debug("asked whether this member was removed", "member", a.addr, "leader", a.r.Leader, "epoch", a.r.Epoch, "listed", slices.Contains(a.r.Members, n.cfg.ID))
		}
	}
	return nil
}

// remoteAnswer is one member's answer to viewsOfOthers.
type remoteAnswer struct {
	addr string
	r    RemoteCluster
}

// viewsOfOthers asks every member this member knows of (othersHTTP) for its
// view, all at once, each for at most a Raft timeout, and returns the
// answers, sorted by address; a member that fails is logged at debug.
func (n *Node) viewsOfOthers(reader ClusterReader) []remoteAnswer {
	addrs := n.othersHTTP(n.cfg.HTTPAddr)
	slices.Sort(addrs)
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RaftTimeout)
	defer cancel()
	answers := make([]remoteAnswer, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			answers[i].addr = addr
			answers[i].r, errs[i] = reader.ClusterOf(ctx, addr)
		})
	}
	wg.Wait()
	out := answers[:0]
	for i, a := range answers {
		if errs[i] != nil {
			n.log.Debug("asking a member for its view", "member", a.addr, "err", errs[i])
			continue
		}
		out = append(out, a)
	}
	return out
}

// outOfLeadersRaft reports whether the Raft leader, asked directly
// (viewsOfOthers: an answer of the leader itself, of this cluster), lists
// this member neither as a member nor in its Raft configuration
// (RemoteCluster.RaftOnly): the removal of this member from Raft, which
// its own log never received, is the leader's latest configuration.
func (n *Node) outOfLeadersRaft(reader ClusterReader) bool {
	v := n.cell.Load()
	if v == nil {
		return false
	}
	for _, a := range n.viewsOfOthers(reader) {
		if r := a.r; r.ID != "" && r.ID == r.Leader && r.Seed == v.Seed &&
			!slices.Contains(r.Members, n.cfg.ID) && !slices.Contains(r.RaftOnly, n.cfg.ID) {
			return true
		}
	}
	return false
}

// leftError is the error of a member that learns from the member at addr,
// whose view is r, that it left the cluster while it was away: it says
// what openRaft's refusal of a log that holds the removal says.
func (n *Node) leftError(addr string, r RemoteCluster, since uint64) error {
	who := addr
	if r.ID != "" {
		who = fmt.Sprintf("%s (%s)", r.ID, addr)
	}
	return fmt.Errorf("%w: member %q left the cluster (ringlimit leave) while it was away: member %s, whose raft leader is %s, no longer lists it (epoch %d; this data dir's log, which lists it as of epoch %d, never received the removal); start it over an empty --data-dir to join again as a new member",
		ErrDataDir, n.cfg.ID, who, r.Leader, r.Epoch, since)
}

// noteLeft stops this member, which learnt that it left the cluster while
// it was away (leftWhileAway, removedBeforeRestart): once, it calls
// OnLeft with err, whose caller logs it (or, without one, logs err and
// calls OnRemoved). It is in no ring: it owns nothing.
func (n *Node) noteLeft(err error) {
	if !n.removed.CompareAndSwap(false, true) {
		return
	}
	if n.cfg.OnLeft != nil {
		n.log.Warn("this member was removed from the cluster while it was away (its log never received the removal): stopping")
		go n.cfg.OnLeft(err)
		return
	}
	n.log.Error(err.Error())
	if n.cfg.OnRemoved != nil {
		go n.cfg.OnRemoved()
	}
}
