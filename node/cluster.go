package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/view"
)

// MaxVoters is the most Raft voters; later members join as non-voters
// (they are still ring members and own partitions).
const MaxVoters = 5

// applyTimeout bounds how long a Raft write may wait for Raft's main
// loop to take it (raft's enqueue timeout), and Raft membership changes.
const applyTimeout = 5 * time.Second

// enqueueMargin is how long before a write's deadline apply stops
// waiting for Raft to take it.
const enqueueMargin = 10 * time.Millisecond

// commitTimeout bounds await: the wait for Raft's answer to a write or a
// membership change it has taken (taking it, Raft's enqueue, is bounded
// by applyTimeout before that): applyTimeout, then two Raft timeouts.
// Once a leader has taken an entry, Raft answers it after a local disk
// write, one round trip to a quorum and the FSM's apply (milliseconds),
// or with ErrLeadershipLost when the leader steps down, which it does
// when it has not heard from a quorum for LeaderLeaseTimeout
// (RaftTimeout/2, checked at about that period). Two Raft timeouts cover
// that with room for a slow fsync; past them Raft is not going to
// answer: its main loop hangs on the disk, or it dropped the future
// (hashicorp/raft#498).
func (n *Node) commitTimeout() time.Duration { return applyTimeout + 2*n.cfg.RaftTimeout }

// apply writes a command through Raft on the leader and returns the FSM's
// answer.
//
// Raft takes the command within applyTimeout, and no later than ctx's
// deadline, or apply answers (unavailable) that it was not written. It
// then waits for Raft's answer at most commitTimeout, no longer than ctx
// and no longer than the node runs: hashicorp/raft may never answer a
// write (hashicorp/raft#498, #145: an entry committed as Raft shuts
// down, a leader whose disk hangs), and a loop blocked here would hang
// Close, an admin request its client. On any of these it returns an
// error wrapping api.ErrUnavailable that says the outcome is unknown, as
// for ErrLeadershipLost and ErrRaftShutdown: the command may still
// commit. It cannot take effect after a command proposed later has
// committed (Raft applies its log in order, and a later leader either
// holds the entry before its own or has overwritten it; apply returns
// only once Raft has taken the command or refused it), so a caller that
// retries must send a command whose second application changes nothing
// (AddMember, SetMemberState and PutRules with the same arguments are
// such commands; Init answers fsm.ErrInitialized, and RemoveMember
// fsm.ErrUnknownMember, which Leave and markDead take as done).
//
// The goroutine that waits on Raft's answer outlives apply when it
// returns early; it ends when Raft answers, which it does on every path
// but the two above. Close lets Raft answer it before shutting Raft down
// (raftParts.close), so only a leader whose disk hangs past that leaves
// it waiting; a hung disk holds Raft's own goroutines as well.
//
// A non-leader gets an error wrapping api.ErrUnavailable too.
func (n *Node) apply(ctx context.Context, cmd []byte) error {
	f, err := n.propose(ctx, cmd)
	if err != nil {
		return err
	}
	if err := n.outcome(ctx, f); err != nil {
		return err
	}
	n.announceCommit()
	return nil
}

// announceCommit has the followers apply what this leader has applied
// now rather than at Raft's next idle replication (CommitTimeout, 250–500
// ms later): a follower learns the commit index only from the leader's
// next AppendEntries, and a barrier is one, sent at once. Until a key's
// owner applies a rules write the key refills under the old rule, and
// that refill is carried over into the new one (an audit saw a 1000/s
// token bucket tightened to 1 per hour admit 31–45 after the write's 200
// where 5–19 were left). apply calls it once Raft has answered; watchLoop
// calls it when the leader's state changes, for what no apply announced
// (a write whose caller gave up waiting, entries of an earlier term that
// this leader's first entry committed). A barrier is sent only for
// commands applied since the last one (announcedTo): the two callers of
// one write send one. It is not waited for; Raft takes it within
// announceEnqueue or not at all.
func (n *Node) announceCommit() {
	a := n.fsm.Applied()
	for {
		done := n.announcedTo.Load()
		if a <= done {
			return
		}
		if n.announcedTo.CompareAndSwap(done, a) {
			break
		}
	}
	_ = n.raft.raft.Barrier(announceEnqueue)
}

// announceEnqueue bounds how long announceCommit waits for Raft's main
// loop to take its barrier.
const announceEnqueue = 10 * time.Millisecond

// propose hands cmd to Raft, waiting for Raft to take it as apply says
// (enqueueTimeout), and returns Raft's future; its error wraps
// api.ErrUnavailable when ctx ended before (nothing was proposed).
func (n *Node) propose(ctx context.Context, cmd []byte) (raft.ApplyFuture, error) {
	enqueue, err := enqueueTimeout(ctx, "write")
	if err != nil {
		return nil, err
	}
	return n.raft.raft.Apply(cmd, enqueue), nil
}

// barrier waits, by ctx, until this leader has applied every write
// before it (what is the change that needs them: "marking n2 down"). Its
// error wraps api.ErrUnavailable and says that nothing was written.
func (n *Node) barrier(ctx context.Context, what string) error {
	enqueue, err := enqueueTimeout(ctx, "barrier")
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	answered, err := n.await(ctx, n.raft.raft.Barrier(enqueue), "barrier")
	if err == nil {
		return nil
	}
	why := "raft did not answer in time"
	if answered {
		why = err.Error() // raft's own: leadership lost, enqueue timed out
	}
	return fmt.Errorf("%w: %s: the log before it was not confirmed (%s); nothing written", api.ErrUnavailable, what, why)
}

// enqueueTimeout is how long a Raft call may block its caller until
// Raft's main loop takes it: applyTimeout, and no later than a little
// before ctx's deadline. Raft watches no context there, only this
// timeout (0: none); giving up a little before the deadline keeps its
// answer (nothing written) from being taken for a write Raft took and
// did not answer by the deadline. When ctx has ended, or its deadline is
// too near, the error wraps api.ErrUnavailable and says that the raft
// what (a "write", a "membership change") was not proposed.
func enqueueTimeout(ctx context.Context, what string) (time.Duration, error) {
	enqueue := applyTimeout
	if dl, ok := ctx.Deadline(); ok {
		enqueue = min(enqueue, time.Until(dl)-enqueueMargin)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%w: the raft %s was not proposed: %w", api.ErrUnavailable, what, err)
	}
	if enqueue <= 0 {
		return 0, fmt.Errorf("%w: the raft %s was not proposed: %w", api.ErrUnavailable, what, context.DeadlineExceeded)
	}
	return enqueue, nil
}

// outcome waits for Raft's answer to the write f (await) and returns the
// FSM's answer, or an error as apply says.
func (n *Node) outcome(ctx context.Context, f raft.ApplyFuture) error {
	answered, err := n.await(ctx, f, "write")
	if !answered {
		return err
	}
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrEnqueueTimeout) ||
			errors.Is(err, raft.ErrRaftShutdown) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return fmt.Errorf("%w: %w", api.ErrUnavailable, err)
		}
		// Raft could not store it: the leader's log on disk (a full or
		// failing disk; the leader steps down). Nothing the caller sent
		// is wrong: unavailable, not an internal error (was a 500).
		return fmt.Errorf("%w: raft could not write it (the leader's Raft log on disk?): %w", api.ErrUnavailable, err)
	}
	if err, _ := f.Response().(error); err != nil {
		return err
	}
	return nil
}

// await waits for Raft's answer to f, at most commitTimeout from now, no
// longer than ctx and no longer than the node runs (see apply for why:
// hashicorp/raft may never answer a future). answered is false when it
// gave up; err then wraps api.ErrUnavailable (and ctx's error, when ctx
// ended) and says that the outcome of what (a "write", a "membership
// change", …) is unknown. Otherwise err is Raft's answer. Giving up
// leaves one goroutine waiting on f until Raft answers it, which Close
// waits for (answers).
func (n *Node) await(ctx context.Context, f raft.Future, what string) (answered bool, err error) {
	bound := time.NewTimer(n.commitTimeout())
	defer bound.Stop()
	done := n.raft.answers.of(f)
	select {
	case err = <-done:
		return true, err
	case <-n.ctx.Done():
	case <-ctx.Done():
		if n.ctx.Err() == nil {
			return false, fmt.Errorf("%w: raft had not answered the %s when the request ended (%w): its outcome is unknown (it may still commit)", api.ErrUnavailable, what, ctx.Err())
		}
	case <-bound.C:
		return false, fmt.Errorf("%w: raft did not answer a %s within %v: its outcome is unknown (it may still commit)", api.ErrUnavailable, what, n.commitTimeout())
	}
	return false, fmt.Errorf("%w: node closing: the outcome of the raft %s is unknown (it may still commit)", api.ErrUnavailable, what)
}

// raftUnavailable is the error of a Raft membership change or barrier
// that failed with err, after doing ("adding n4 to raft"); it wraps
// api.ErrUnavailable once. err is Raft's own answer (leadership lost,
// say), which does not wrap it, or await's when it gave up, which does:
// wrapping that again read "unavailable: … unavailable: …".
func raftUnavailable(doing string, err error) error {
	if errors.Is(err, api.ErrUnavailable) {
		return fmt.Errorf("%s: %w", doing, err)
	}
	return fmt.Errorf("%s: %w: %w", doing, api.ErrUnavailable, err)
}

// leader returns the leader's id and HTTP address ("" when unknown).
func (n *Node) leader() (id, http string) {
	_, lid := n.raft.raft.LeaderWithID()
	id = string(lid)
	if id == "" {
		return "", ""
	}
	if m, ok := n.fsm.State().Member(id); ok {
		return id, m.HTTP
	}
	return id, ""
}

func (n *Node) isLeader() bool { return n.raft.raft.State() == raft.Leader }

// leaderHTTP returns where to forward a write, or an error wrapping
// api.ErrUnavailable when there is no reachable leader.
func (n *Node) leaderHTTP() (string, error) {
	id, addr := n.leader()
	if id == "" || addr == "" {
		return "", fmt.Errorf("%w: no leader", api.ErrUnavailable)
	}
	return addr, nil
}

// forwardTo returns the leader to forward a write to, refusing when the
// write was itself forwarded here by a node that took us for the leader.
func (n *Node) forwardTo(ctx context.Context) (string, error) {
	if api.Forwarded(ctx) {
		// The sender's view of the leader is stale (an election under
		// way, or just over): say that a retry is what to do. Was "forwarded
		// here, but this node is not the leader either", which a caller
		// could not read as safe to retry (a helper saw 19 in 1.6 s).
		return "", fmt.Errorf("%w: the leadership is changing (forwarded to a member that no longer leads): not written; retry", api.ErrUnavailable)
	}
	return n.leaderHTTP()
}

// leaderLoop initialises the cluster the first time this node leads it,
// and each time it gains the lead takes over the promotions of members
// that joined as non-voters (promoteNonvoters).
func (n *Node) leaderLoop() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case isLeader := <-n.raft.raft.LeaderCh():
			if !isLeader {
				continue
			}
			now := time.Now()
			n.leaderSince.Store(&now)
			select {
			case n.gainedLead <- struct{}{}:
			default:
			}
			if n.fsm.State().Initialized {
				n.promoteNonvoters()
				continue
			}
			cfg := fsm.Config{Partitions: n.cfg.Ring.Partitions, ReplicationFactor: n.cfg.Ring.ReplicationFactor, Load: n.cfg.Ring.Load, Seed: randomSeed()}
			cmd, err := fsm.Init(cfg)
			if err == nil {
				err = n.apply(n.ctx, cmd)
			}
			if err != nil {
				if !errors.Is(err, fsm.ErrInitialized) { // ErrInitialized: its log said so after all
					n.log.Error("initialising the cluster", "err", err)
				}
				continue
			}
			n.log.Info("cluster initialised", "partitions", cfg.Partitions)
		}
	}
}

// Cluster describes the cluster as this node sees it: every member with
// its state, the partitions it owns in this node's ring, and whether it
// votes in this node's latest Raft configuration (the source of truth for
// a promotion; a member missing from it does not vote).
//
// A node with no view of the cluster yet (it has not joined one, or is
// replaying its log, or the cluster is being initialised and lists no
// member) answers an error wrapping api.ErrUnavailable saying so: an
// empty membership would read as a cluster of nobody.
func (n *Node) Cluster(context.Context) (view.Cluster, error) {
	snap := n.snap.Load()
	if snap == nil || len(snap.st.Members) == 0 {
		why := "it has not joined a cluster, or the cluster is still being set up"
		if snap == nil {
			switch r := n.notCaughtUp(); {
			case n.seeding.Load():
				why = "it is " + r
			case n.joinEpoch.Load() == joinPending:
				why = "it has not joined a cluster yet: its join is not answered"
			case r != "":
				why = "it is " + r
			}
		}
		return view.Cluster{}, fmt.Errorf("%w: this node has no view of the cluster yet: %s", api.ErrUnavailable, why)
	}
	leaderID, _ := n.leader()
	var voters map[string]bool
	var raftOnly []string
	if cf := n.raft.raft.GetConfiguration(); cf.Error() == nil {
		voters = make(map[string]bool)
		for _, s := range cf.Configuration().Servers {
			voters[string(s.ID)] = s.Suffrage == raft.Voter
			if _, member := snap.st.Member(string(s.ID)); !member {
				raftOnly = append(raftOnly, string(s.ID))
			}
		}
		slices.Sort(raftOnly)
	}
	counts := snap.v.Ring.Counts()
	out := view.Cluster{Leader: leaderID, Epoch: snap.v.Epoch(), Partitions: snap.st.Config.Partitions, RulesVersion: snap.v.RulesVersion, RaftOnly: raftOnly}
	for _, m := range snap.st.Members {
		vm := view.Member{ID: m.ID, State: string(m.State),
			HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer, Partitions: counts[m.ID]}
		if voters != nil {
			v := voters[m.ID]
			vm.Voter = &v
		}
		out.Members = append(out.Members, vm)
	}
	n.addSilence(&out, snap.st, time.Now())
	return out, nil
}

// RouterView returns what a router that is not a member needs: the view
// (ring of the active members with their addresses, rules and their
// version, the hash seed). The HTTP layer turns it into the wire form.
func (n *Node) RouterView(context.Context) (*view.View, error) {
	snap := n.snap.Load()
	if snap == nil {
		return nil, fmt.Errorf("%w: cluster not initialised", api.ErrUnavailable)
	}
	return snap.v, nil
}

// WaitView waits until this node's view is newer than afterEpoch (ring)
// or afterRules (rules version), ctx ends, or wait passes: the long poll
// of GET /v1/cluster/view?after=…, so routers follow a change at once.
func (n *Node) WaitView(ctx context.Context, afterEpoch, afterRules uint64, wait time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	n.cell.AwaitFunc(ctx, func(v *view.View) bool {
		return v != nil && (v.Epoch() > afterEpoch || v.RulesVersion > afterRules)
	})
}

// Ready returns nil when this member has a leader, a ring that has
// caught up with its log (viewCurrent), and is active in it; otherwise an
// error wrapping api.ErrUnavailable saying why.
//
// The ring must be current, not just the log: whether the member is
// registered is read from the log, what it owns and awaits from the
// ring, and a member whose ring still lags its own registration (the
// bootstrapper at the empty ring of the cluster's Init, a moment before
// its ring shows it) would be taken for ready while it owns nothing yet.
// A cluster that waits for a member to be ready before adding the next
// one (a deployment's readiness gate, clustertest's New) then made its
// ring jump several members at once, and the member took its own
// partitions for ones to await.
func (n *Node) Ready() error {
	behind := n.notCaughtUp()
	switch {
	case n.removed.Load():
		return fmt.Errorf("%w: removed from the cluster", api.ErrUnavailable)
	case n.stopping.Load():
		// From the stop's first step, as README says: was ready until
		// the mark-down was applied, and the HTTP listener closed a
		// moment later, so a probe saw 200 and then nothing.
		return fmt.Errorf("%w: stopping (marked down, handing its partitions off)", api.ErrUnavailable)
	case n.raft.raft.Leader() == "":
		return fmt.Errorf("%w: no raft leader", api.ErrUnavailable)
	case !n.leaderInConfig():
		return fmt.Errorf("%w: the raft leader is not a member of this node's configuration", api.ErrUnavailable)
	case behind != "":
		return fmt.Errorf("%w: %s", api.ErrUnavailable, behind)
	case n.snap.Load() == nil:
		return fmt.Errorf("%w: cluster not initialised", api.ErrUnavailable)
	case !n.viewCurrent():
		return fmt.Errorf("%w: its ring (epoch %d) has not caught up with its log (membership epoch %d)", api.ErrUnavailable, n.View().Epoch(), n.fsm.State().MembershipIndex)
	case n.needsRecovery():
		return fmt.Errorf("%w: restarted: recovering this member's partitions from their backups", api.ErrUnavailable)
	case n.Owner().Awaiting() > 0:
		return fmt.Errorf("%w: waiting for %d partitions to be handed over", api.ErrUnavailable, n.Owner().Awaiting())
	case !n.registered():
		return fmt.Errorf("%w: not an active member yet", api.ErrUnavailable)
	case !n.Owner().Serving():
		return fmt.Errorf("%w: no lease yet (waiting to hear from the leader)", api.ErrUnavailable)
	case n.rulesFilePending.Load():
		return fmt.Errorf("%w: the rules file is not in force yet", api.ErrUnavailable)
	}
	return nil
}
