package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// Leave removes a member for good: from the ring, then from Raft. On a
// non-leader it is forwarded to the leader; a leader asked to remove
// itself hands the lead on first (leaveAsLeader).
//
// It answers by ctx's deadline. Up to Raft's taking the removal from the
// ring, every wait honours ctx (the lead handed on, the membership lock,
// Raft's enqueue); after it, the leader finishes the leave whether or
// not the caller still waits (finishLeave). When ctx ends first the
// error wraps api.ErrUnavailable and says how far the leave got.
func (n *Node) Leave(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("%w: id is required", api.ErrBadRequest)
	}
	if !n.isLeader() {
		addr, err := n.forwardTo(ctx)
		if err != nil {
			return err
		}
		return n.forwardLeave(ctx, addr, id)
	}
	if id == n.cfg.ID && len(n.fsm.State().Members) > 1 {
		// Refused here too, or the lead would be handed on for nothing.
		if err := n.leaveKeepsQuorum(n.fsm.State(), id, time.Now()); err != nil {
			return err
		}
		if handed, err := n.leaveAsLeader(ctx); handed {
			return err
		}
	}
	if err := n.lockMembership(ctx); err != nil {
		return err
	}
	f, peer, err := n.startLeave(ctx, id)
	if err != nil {
		n.membership.unlock()
		return err
	}
	return n.finishLeave(ctx, id, peer, f)
}

// startLeave runs under the membership lock: it has Raft take id's
// removal from the ring and returns Raft's future, or nil when id is
// gone from the ring already but still in Raft: a leave cut short (the
// lead moved, or the leader stopped, between the two removals), which
// finishLeave finishes, or a voter that is gone for good would count
// against the quorum. peer is the member's data-plane address when it is
// expected to answer there (pinged), "" otherwise.
func (n *Node) startLeave(ctx context.Context, id string) (f raft.ApplyFuture, peer string, err error) {
	st := n.fsm.State()
	m, ok := st.Member(id)
	if !ok {
		if n.inRaft(id) {
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("%w: no member %q", api.ErrNotFound, id)
	}
	if len(st.Members) == 1 {
		return nil, "", fmt.Errorf("%w: %q is the last member; stop it instead", api.ErrBadRequest, id)
	}
	if err := n.leaveKeepsQuorum(st, id, time.Now()); err != nil {
		return nil, "", err
	}
	cmd, err := fsm.RemoveMember(id)
	if err != nil {
		return nil, "", err
	}
	if pinged(m) {
		peer = m.Peer
	}
	f, err = n.propose(ctx, cmd)
	return f, peer, err
}

// leaveKeepsQuorum refuses (api.ErrConflict), before anything is
// written, the leave of a Raft voter after which the voters this leader
// hears from would be too few for a quorum of those left. Was: with
// three voters, one of them dead, the leave of a second removed it, and
// the two voters left — the leader and the dead one — could never again
// commit: no leader after the next election, no rules or membership
// change, and no leave of the dead member to mend it (seen with real
// processes; recovery needed Raft's peers.json by hand).
//
// A voter is heard from when it is this leader, or a member neither dead
// nor down whose last answer to the failure detector's pings was sent
// within half of DeadAfter (contacts) before now: one that has just
// crashed counts as gone before the detector marks it dead. As for the
// detector and the leases it grants, silence counts from first sight: a
// leader elected a moment ago, which has had no answer from anyone yet
// (the leave of a leader is forwarded to the next at its first
// heartbeat), takes every member for heard until half of DeadAfter has
// passed without an answer. The non-voter that the leader promotes into
// a freed seat (promoteNonvoters) does not count: its promotion is a
// Raft change that needs the quorum first.
func (n *Node) leaveKeepsQuorum(st *fsm.State, id string, now time.Time) error {
	cf := n.raft.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("%w: reading raft's configuration: %w", api.ErrUnavailable, err)
	}
	servers := cf.Configuration().Servers
	if !slices.ContainsFunc(servers, func(s raft.Server) bool { return s.ID == raft.ServerID(id) && s.Suffrage == raft.Voter }) {
		return nil // not a voter: the quorum stays as it is
	}
	var left, heard int
	var silent []string
	for _, s := range servers {
		if s.Suffrage != raft.Voter || s.ID == raft.ServerID(id) {
			continue
		}
		left++
		if n.heardFrom(st, string(s.ID), now) {
			heard++
		} else {
			silent = append(silent, string(s.ID))
		}
	}
	if heard >= left/2+1 {
		return nil
	}
	return fmt.Errorf("%w: removing %q would leave %d Raft voters, of which %d answer (not answering: %s): the cluster would lose its quorum and could make no membership or rules change again; remove the members that are gone first (ringlimit leave --id ID), or start them again",
		api.ErrConflict, id, left, heard, strings.Join(silent, ", "))
}

// heardFrom reports whether voter id counts as answering for
// leaveKeepsQuorum: this leader itself, or a member that is neither dead
// nor down and answered a ping sent within DeadAfter/2 of now (or was
// first seen within it).
func (n *Node) heardFrom(st *fsm.State, id string, now time.Time) bool {
	if id == n.cfg.ID {
		return true
	}
	m, ok := st.Member(id)
	if !ok || !pinged(m) {
		return false
	}
	return now.Sub(n.contacts.seen(id, now)) < n.cfg.DeadAfter/2
}

// finishLeave is the rest of id's leave once Raft has taken its removal
// from the ring (f; nil when that is done already): Raft's answer to it,
// the wait for the member at peer to apply it (awaitRemovalSeen; none
// when peer is ""), then the removal from Raft. It takes over the membership lock from its
// caller, and answers by ctx's deadline, but the work goes on in a
// goroutine detached from ctx (context.WithoutCancel) that holds the lock
// until it ends. Raft goes on with a write it has taken whether anyone
// waits or not, so a caller that goes away could only stop the second
// step: the member, gone from the ring, stops serving and exits, while
// Raft still counts it as a voter, against the quorum, until a leave of
// it is asked again (startLeave's nil future), which nobody may do. The
// goroutine is bounded all the same, by apply's bounds: applyTimeout for
// Raft to take the removal from Raft, commitTimeout for each answer, and
// the node's life. What it ends with after the caller went is logged.
func (n *Node) finishLeave(ctx context.Context, id, peer string, f raft.ApplyFuture) error {
	var fromRing, abandoned atomic.Bool
	done := make(chan error, 1)
	detached := context.WithoutCancel(ctx)
	started := n.goLoop(func() {
		defer n.membership.unlock()
		err := n.leaveTail(detached, id, peer, f, &fromRing)
		done <- err
		if err != nil && abandoned.Load() {
			n.log.Warn("leave whose request had ended", "id", id, "err", err)
		}
	})
	if !started {
		n.membership.unlock()
		return fmt.Errorf("%w: node closing: the outcome of the removal of %s is unknown (it may still commit)", api.ErrUnavailable, id)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	abandoned.Store(true)
	select {
	case err := <-done:
		return err
	default:
	}
	if fromRing.Load() {
		return fmt.Errorf("%w: %s is removed from the cluster, but not yet from raft when the request ended (%w): the leader goes on with it; ask again to learn the outcome", api.ErrUnavailable, id, ctx.Err())
	}
	return fmt.Errorf("%w: raft had not answered the removal of %s from the cluster when the request ended (%w): its outcome is unknown (it may still commit; the leader then removes it from raft too)", api.ErrUnavailable, id, ctx.Err())
}

// leaveTail waits for Raft's answer to f, id's removal from the ring (nil:
// done already), and for the member at peer to apply it, then removes id
// from Raft; fromRing is set once the removal from the ring is done.
func (n *Node) leaveTail(ctx context.Context, id, peer string, f raft.ApplyFuture, fromRing *atomic.Bool) error {
	var epoch uint64 // of the ring this leave's removal made; 0: none
	if f != nil {
		// fsm.ErrUnknownMember: an earlier leave whose outcome was unknown
		// (apply) removed it after all, since we looked: finish with Raft.
		err := n.outcome(ctx, f)
		if err != nil && !errors.Is(err, fsm.ErrUnknownMember) {
			return err
		}
		if err == nil {
			epoch = f.Index()
		}
	}
	fromRing.Store(true)
	if epoch != 0 && peer != "" {
		n.awaitRemovalSeen(ctx, peer, epoch)
	}
	if err := n.removeFromRaft(ctx, id); err != nil {
		return err
	}
	if f == nil {
		n.log.Info("member left (finishing an earlier leave)", "id", id)
	} else {
		n.log.Info("member left", "id", id)
	}
	return nil
}

// awaitRemovalSeen waits until the member at data-plane address peer has
// applied its removal from the ring, which made the ring of epoch epoch,
// at most removalSeenWait (or until ctx ends), before the leader removes
// it from Raft. hashicorp/raft stops replicating to a server it removes
// after one last append, which a member behind on the log can miss: a
// leader that has just handed on the lead and forwards its own leave at
// the new leader's first heartbeat, before the new leader has replicated
// to it, or a member whose Raft link hiccups. Such a member never learns
// that it left: it hands nothing off, and only after ownRemovalWait does
// it take itself for removed (awaitOwnRemoval), its partitions served
// from backup copies meanwhile. Until it leaves Raft, the leader goes on
// replicating to it, so it catches up.
//
// It asks with empty pushes at epoch: a member answers a push once its
// ring has reached the push's epoch, or after epochWait with the epoch
// it has (Owner.HandlePush). Any error ends the wait: a member that no
// longer answers has exited (having applied its removal, or crashed),
// and one that cannot be reached is not helped by waiting.
func (n *Node) awaitRemovalSeen(ctx context.Context, peer string, epoch uint64) {
	ctx, cancel := context.WithTimeout(ctx, n.removalSeenWait())
	defer cancel()
	for ctx.Err() == nil {
		var ack transport.PushAck
		err := n.cfg.DataPlane.Push(ctx, peer, &transport.Push{Kind: transport.PushBackup, Epoch: epoch, From: n.cfg.ID}, &ack)
		if err != nil || ack.Epoch >= epoch {
			return
		}
	}
}

// removalSeenWait bounds awaitRemovalSeen: two Raft timeouts. A member
// that has not applied its removal by then is not hearing from the
// leader, and waiting longer holds the membership lock for nothing.
func (n *Node) removalSeenWait() time.Duration { return 2 * n.cfg.RaftTimeout }

// removeFromRaft removes server id from Raft's configuration, the second
// half of a leave, waiting on Raft as apply does (enqueueTimeout, await);
// an error wraps api.ErrUnavailable.
func (n *Node) removeFromRaft(ctx context.Context, id string) error {
	enqueue, err := enqueueTimeout(ctx, "membership change")
	if err == nil {
		_, err = n.await(ctx, n.raft.raft.RemoveServer(raft.ServerID(id), 0, enqueue), "membership change")
	}
	if err != nil {
		return raftUnavailable("removing "+id+" from raft", err)
	}
	return nil
}

// leaveAsLeader is Leave of this node, which leads: it hands Raft
// leadership to another voter first and has the new leader remove it.
// Removing itself while leading left the cluster without a leader for an
// election timeout and more, during which the members' leases, renewed by
// the leader's answers, ran out: their answers were degraded (seen by a
// new user: 2.5 s without a leader, half the checks of a batch
// degraded). handed is false when this node still leads (no other voter
// took the lead): the caller then removes it as before. Its waits honour
// ctx; when ctx ends before the leave is forwarded, nothing of the leave
// is written.
func (n *Node) leaveAsLeader(ctx context.Context) (handed bool, err error) {
	// The new leader is known at its first heartbeat, which Raft reports
	// to its observers (registered first, so that none is missed). The
	// leave is forwarded then, possibly before the new leader has
	// replicated anything to this node: it still learns of its removal,
	// as the new leader removes it from Raft only once it has applied
	// its removal from the ring (awaitRemovalSeen).
	changed := make(chan raft.Observation, 1)
	obs := raft.NewObserver(changed, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.raft.RegisterObserver(obs)
	defer n.raft.raft.DeregisterObserver(obs)
	if err := n.transferLeadership(ctx); err != nil {
		return true, raftUnavailable("handing the lead on before leaving, nothing written", err)
	}
	if n.isLeader() {
		return false, nil
	}
	wait := time.NewTimer(2 * n.cfg.RaftTimeout)
	defer wait.Stop()
	for {
		if lid, addr := n.leader(); lid != "" && lid != n.cfg.ID && addr != "" {
			return true, n.forwardLeave(ctx, addr, n.cfg.ID)
		}
		select {
		case <-ctx.Done():
			return true, fmt.Errorf("%w: leadership handed on, no new leader seen when the request ended (%w), nothing written; ask again", api.ErrUnavailable, ctx.Err())
		case <-wait.C:
			return true, fmt.Errorf("%w: leadership handed on, no new leader seen yet; ask again", api.ErrUnavailable)
		case <-changed:
		}
	}
}

// forwardLeave has the leader at addr remove member id. When id is this
// member and the leader says it is done, this member watches for its
// removal to reach its log (awaitOwnRemoval).
func (n *Node) forwardLeave(ctx context.Context, addr, id string) error {
	err := n.cfg.Forward.Leave(ctx, addr, id)
	if err == nil && id == n.cfg.ID {
		n.goLoop(n.awaitOwnRemoval)
	}
	return err
}

// awaitOwnRemoval runs once the leader has answered this member's own
// leave: the removal normally reaches its log within a heartbeat, and the
// view change that follows hands its partitions off and calls OnRemoved.
// But hashicorp/raft stops replicating to a server it removes after one
// last send, which a member behind on the log can miss (seen when a
// leader that had just handed on the lead left at once): the leader
// waits for it to catch up first (awaitRemovalSeen), but only so long,
// and a member still cut off after that would wait as a leaderless
// candidate forever. So after ownRemovalWait
// without its removal it takes itself for removed all the same (the
// others serve its partitions from their backup copies, as after a
// crash).
func (n *Node) awaitOwnRemoval() {
	ch, cancel := n.fsm.Watch()
	defer cancel()
	t := time.NewTimer(n.ownRemovalWait())
	defer t.Stop()
	for {
		// Not listed in a state from before its own join does not count
		// (a member that joined with no Raft state replays the log of a
		// member of its id that left: joinedIn).
		st := n.fsm.State()
		if _, member := st.Member(n.cfg.ID); !member && n.joinedIn(st) || n.removed.Load() {
			return // the view change takes it from here
		}
		select {
		case <-n.ctx.Done():
			return
		case <-ch:
		case <-t.C:
			n.noteRemoved("the leader removed this member, but the removal never reached this member's log; leaving all the same", false)
			return
		}
	}
}

// ownRemovalWait is how long a member whose leave the leader answered
// waits for its removal to reach its log: 4 Raft timeouts, at least 5 s.
func (n *Node) ownRemovalWait() time.Duration { return max(5*time.Second, 4*n.cfg.RaftTimeout) }

// inRaft reports whether id is a server of the Raft configuration.
func (n *Node) inRaft(id string) bool {
	cf := n.raft.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	for _, s := range cf.Configuration().Servers {
		if s.ID == raft.ServerID(id) {
			return true
		}
	}
	return false
}

// SetState marks a member "down" (stopped gracefully: still a member,
// owning nothing until it returns) or "active". On a non-leader it is
// forwarded to the leader.
//
// It answers by ctx's deadline: the wait for the membership changes
// before it, Raft's taking the write and Raft's answer all honour ctx
// (apply). When ctx ends first the error wraps api.ErrUnavailable and
// says whether the outcome is unknown.
func (n *Node) SetState(ctx context.Context, id, state string) error {
	s := fsm.MemberState(state)
	if id == "" || (s != fsm.Down && s != fsm.Active) {
		return fmt.Errorf("%w: want a member id and the state down or active", api.ErrBadRequest)
	}
	if !n.isLeader() {
		addr, err := n.forwardTo(ctx)
		if err != nil {
			return err
		}
		return n.cfg.Forward.SetState(ctx, addr, id, state)
	}
	if err := n.lockMembership(ctx); err != nil {
		return err
	}
	defer n.membership.unlock()
	if s == fsm.Down {
		// The check below must see every write before it: a mark-down
		// whose apply gave up (no quorum for a while) may still commit,
		// and two members each taken for one of two active ones left the
		// cluster with none (five stopped together, then restarted: the
		// first to join served every partition afresh).
		if err := n.barrier(ctx, "marking "+id+" down"); err != nil {
			return err
		}
	}
	st := n.fsm.State()
	m, ok := st.Member(id)
	if !ok {
		return fmt.Errorf("%w: no member %q", api.ErrNotFound, id)
	}
	if s == fsm.Down && m.State == fsm.Active && len(st.Active()) == 1 {
		// Down, it would own nothing, and nobody else would: the cluster's
		// budgets would be dropped (a whole cluster stopped together).
		// Stopped while active, it keeps them in its data dir (StopGracefully).
		return fmt.Errorf("%w: %q is the last active member: nobody would take its partitions; stop it instead (it keeps them in its data dir)", api.ErrConflict, id)
	}
	cmd, err := fsm.SetMemberState(id, s)
	if err != nil {
		return err
	}
	return n.apply(ctx, cmd)
}

// lockMembership takes the membership lock for a change asked with ctx:
// the change before it may wait on Raft for as long as apply's bounds
// (a leader whose disk hangs), longer than ctx. When ctx ends first the
// error wraps api.ErrUnavailable and says that nothing was written.
func (n *Node) lockMembership(ctx context.Context) error {
	if err := n.membership.lockCtx(ctx); err != nil {
		return fmt.Errorf("%w: waiting for another membership change to finish, nothing written: %w", api.ErrUnavailable, err)
	}
	return nil
}

// MarkDown is the first step of a graceful stop: this member stops
// re-registering and asks the cluster to mark it down, so its partitions
// go to the other members (it hands them off: WaitHandoffs) instead of
// being answered by failure modes while it is away.
// It gives up when ctx ends (no leader, no quorum, a leader whose disk
// hangs) with an error wrapping api.ErrUnavailable: SetState honours
// ctx in all its waits.
func (n *Node) MarkDown(ctx context.Context) error {
	_, err := n.markDown(ctx)
	return err
}

// markDown is MarkDown; last reports that this member is the last active
// one (the cluster refused to mark it down: SetState), so it keeps its
// partitions, and receives those of the members marked down before it.
func (n *Node) markDown(ctx context.Context) (last bool, err error) {
	n.stopping.Store(true)
	// No registration may be under way: a join sent before the
	// mark-down and answered after it lists this member active again.
	n.stopRegistering()
	if err := n.registering.lockCtx(ctx); err != nil {
		return false, fmt.Errorf("%w: waiting for this member's registration to end: %w", api.ErrUnavailable, err)
	}
	n.registering.unlock()
	st := n.fsm.State()
	if _, ok := st.Member(n.cfg.ID); !ok {
		return false, nil
	}
	if active := st.Active(); len(active) == 1 && active[0].ID == n.cfg.ID {
		return true, nil // the last active member: nobody to take its partitions
	}
	gone := func(v *view.View) bool { return v != nil && len(v.Ring.PartitionsOf(n.cfg.ID)) == 0 }
	for {
		err := n.SetState(ctx, n.cfg.ID, string(fsm.Down))
		if err == nil {
			break
		}
		if errors.Is(err, api.ErrConflict) {
			return true, nil // the others were marked down first
		}
		if !errors.Is(err, api.ErrUnavailable) || ctx.Err() != nil {
			return false, err
		}
		// The leader stops too (a whole cluster stopped together), or
		// the write's outcome is unknown: it may have been taken (this
		// member's ring then shows it), or the next leader takes the
		// request again.
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, took := n.cell.AwaitFunc(wctx, gone)
		cancel()
		if took {
			break
		}
		if ctx.Err() != nil {
			return false, err
		}
	}
	// Wait until this member's own ring shows it owning nothing, so that
	// the hand-offs it implies have started (WaitHandoffs).
	if _, ok := n.cell.AwaitFunc(ctx, gone); !ok {
		return false, fmt.Errorf("%w: marked down, but this member's ring did not show it yet: %w", api.ErrUnavailable, ctx.Err())
	}
	return false, nil
}
