package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
)

// TransferLeadership hands Raft leadership to another voter when this
// member leads (a graceful stop), so the cluster does not wait out an
// election timeout. It is a no-op otherwise.
func (n *Node) TransferLeadership() {
	if err := n.transferLeadership(n.ctx); err != nil {
		n.log.Debug("leadership transfer", "err", err)
	}
}

// transferLeadership is TransferLeadership waiting for Raft's answer no
// longer than ctx (and await's bounds). It returns await's error when it
// gave up waiting (wrapping api.ErrUnavailable); Raft's own refusal (no
// other voter to take the lead, say) is logged at debug level and
// returns nil: whether this node still leads tells the caller.
func (n *Node) transferLeadership(ctx context.Context) error {
	if !n.isLeader() {
		return nil
	}
	answered, err := n.await(ctx, n.raft.raft.LeadershipTransfer(), "leadership transfer")
	if !answered {
		return err
	}
	if err != nil && !errors.Is(err, raft.ErrNotLeader) {
		n.log.Debug("leadership transfer", "err", err)
	}
	return nil
}

// StopGracefully is the first half of a graceful stop (SIGTERM): the
// member is marked down, so the ring gives its partitions to the others;
// it hands them off (bounded by ctx) and, if it leads, transfers
// leadership. The caller then closes the node. Errors are logged causes
// of an incomplete drain; the stop goes on regardless.
func (n *Node) StopGracefully(ctx context.Context) error {
	if n.removed.Load() {
		n.stopRemoved(ctx)
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, markDownTimeout)
	last, err := n.markDown(mctx)
	cancel()
	switch {
	case err != nil:
		err = fmt.Errorf("node: marking down: %w", err)
		// Still listed active: hand-offs to it may be on their way (the
		// members stopping with it, when the cluster has lost its
		// leader). Take those before saving; an awaited partition whose
		// sender is gone is served from its backup copy after
		// handoffWait.
		if werr := n.awaitAlone(ctx, false); werr != nil {
			err = errors.Join(err, fmt.Errorf("node: taking the hand-offs on their way: %w", werr))
		}
	case last:
		// The members stopping with it hand their partitions to it: keep
		// them too (a whole cluster stopped together).
		if werr := n.awaitAlone(ctx, true); werr != nil {
			err = fmt.Errorf("node: the last active member taking the others' partitions: %w", werr)
		}
	default:
		if werr := n.waitCopies(ctx); werr != nil {
			err = fmt.Errorf("node: passing backup copies on: %w", werr)
		}
		switch werr := n.waitHandoffsStopping(ctx); {
		case errors.Is(werr, errInsured):
			n.log.Info("hand-offs not answered by their target (crashed, not yet marked dead?); their partitions' backups hold them, and so does the bucket file for the next start",
				"partitions", n.h.Pending())
		case errors.Is(werr, errStranded):
			n.log.Info("hand-offs not answered, and the ring will not move them (its last active member, or no Raft leader: stopped with the others?); those holding state are kept in the bucket file for the next start",
				"partitions", n.h.Pending())
		case werr != nil:
			err = fmt.Errorf("node: handing off: %w (%d partitions not handed off)", werr, n.h.Pending())
		}
	}
	// What is still ours had nobody to go to (the last active member),
	// and the hand-offs that did not land: keep them in the data dir for
	// the next start, which hands them to their owners.
	left := n.h.abandon()
	if o := n.Owner(); o != nil {
		if k, serr := o.saveBuckets(n.cfg.DataDir, left); serr != nil {
			n.log.Error("bucket state NOT saved: the budgets of the partitions this member held start afresh at its next start (unless the cluster serves them from backups meanwhile)", "err", serr)
			err = errors.Join(err, fmt.Errorf("%w: %w", ErrBucketsNotSaved, serr))
		} else if k > 0 {
			n.log.Info("bucket state saved for the next start", "partitions", k, "file", filepath.Join(n.cfg.DataDir, bucketFile))
		}
	}
	n.TransferLeadership()
	return err
}

// stopRemoved is StopGracefully for a member removed from the cluster:
// it owns nothing, and its data dir is refused at any next start (the id
// comes back only over an empty one), so nothing is saved there. It
// waits, bounded by ctx, for the wait for its hand-offs that its removal
// began (noteRemoved; not again once that has ended), and logs the
// hand-offs that did not land: their new owners serve those partitions
// from their backup copies, as after a crash.
func (n *Node) stopRemoved(ctx context.Context) {
	n.stopping.Store(true)
	select {
	case <-n.removedWaited:
	case <-ctx.Done():
	}
	held := 0
	for _, og := range n.h.abandon() {
		if !og.Part.Lost && len(og.Part.Data) > 0 {
			held++
		}
	}
	if held > 0 {
		n.log.Warn("removed from the cluster with hand-offs not confirmed: their new owners serve those partitions from backup copies (nothing is saved: this data dir cannot be used again)", "partitions", held)
	}
}

// ErrBucketsNotSaved is wrapped by StopGracefully's error when the bucket
// state it should have kept in the data dir could not be written (a full
// disk, say): those budgets are lost to the next start.
var ErrBucketsNotSaved = errors.New("node: bucket state not saved")

// waitHandoffsRemoved is a removed member's wait for its hand-offs
// (noteRemoved): until they all land, ctx ends, or those left are held
// by their backups as well (insuredAll). A removed member leaves Raft and
// does not see a crashed target marked dead, so no ring readdresses
// those hand-offs; waiting on gains nothing. Was: it waited the whole
// max(10 s, --dead-after + 5 s), and the backups held nothing, so those
// partitions were served from nothing once the target was marked dead
// (a leave during another member's crash: 7-18 keys of 80 reset, in a
// helper's runs with real processes).
func (n *Node) waitHandoffsRemoved(ctx context.Context) error {
	err := n.waitHandoffs(ctx, false)
	if errors.Is(err, errInsured) {
		n.log.Info("hand-offs not answered by their target (crashed, not yet marked dead?); their partitions' backups hold them", "partitions", n.h.Pending())
	}
	return err
}

// errStranded: the hand-offs left cannot land (handoffs.stranded).
var errStranded = errors.New("node: hand-offs stranded")

// errInsured: the hand-offs left do not land, and their backups hold them
// (handoffs.insuredAll).
var errInsured = errors.New("node: hand-offs insured with the backups")

// waitHandoffsStopping is WaitHandoffs for a member that stops: it also
// ends, with errStranded, once the hand-offs left are stranded, and with
// errInsured once their backups hold them.
func (n *Node) waitHandoffsStopping(ctx context.Context) error {
	return n.waitHandoffs(ctx, true)
}

// waitHandoffs waits until every hand-off landed (nil), ctx ends (its
// error), those left are insured with their backups (errInsured) or,
// when stranded applies, cannot land (errStranded).
func (n *Node) waitHandoffs(ctx context.Context, stranded bool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.h.idleCh():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if stranded && n.h.stranded(n.cell.Load()) {
				return errStranded
			}
			if n.h.insuredAll() {
				return errInsured
			}
		}
	}
}

// awaitAlone waits, until ctx ends, for every partition this member
// gained to have its state and, when alone is set, for its ring to list
// no other member.
func (n *Node) awaitAlone(ctx context.Context, alone bool) error {
	for {
		o := n.owner.Load()
		if o == nil {
			return nil
		}
		servable, changed := o.servable(), n.cell.Changed()
		v := n.cell.Load()
		if o.Awaiting() == 0 && (!alone || v != nil && len(v.Ring.Members()) == 1 || n.leaderless()) {
			// Alone, or nothing more can come: the ring lists members
			// that could not be marked down before the cluster lost its
			// leader (several stopped together), and will not change.
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond) // for the leader's loss, which the view does not show
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (%d partitions still awaited)", ctx.Err(), o.Awaiting())
		case <-servable:
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// leaderless reports whether this member has known no Raft leader for
// leaderlessAfter: the ring cannot change until one is elected.
func (n *Node) leaderless() bool {
	if n.raft.raft.Leader() != "" {
		n.noLeaderSince.Store(nil)
		return false
	}
	now := time.Now()
	since := n.noLeaderSince.Load()
	if since == nil {
		n.noLeaderSince.CompareAndSwap(nil, &now)
		return false
	}
	return now.Sub(*since) >= leaderlessAfter
}

// leaderlessAfter is how long a stopping member waits for a new Raft
// leader before it takes the ring for final (leaderless).
const leaderlessAfter = time.Second

// markDownTimeout bounds the attempt to mark a stopping member down.
const markDownTimeout = 2 * time.Second
