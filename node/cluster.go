package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
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
		return "", fmt.Errorf("%w: forwarded here, but this node is not the leader either", api.ErrUnavailable)
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

// self is this member's registration.
func (n *Node) self() api.JoinRequest {
	req := api.JoinRequest{ID: n.cfg.ID, HTTP: n.cfg.HTTPAddr, Raft: n.cfg.RaftAdvertise, Peer: n.cfg.PeerAddr, Incarnation: n.incarnation}
	if n.raft != nil && n.raft.hasState {
		req.Listed, req.ListedTerm = n.raft.local.since, n.raft.local.sinceTerm
	}
	return req
}

// othersHTTP returns the HTTP addresses of the other members this node
// knows of, once each and without skip: its --join list's, then those
// its state lists, then those its local log named at its start.
func (n *Node) othersHTTP(skip string) []string {
	var addrs []string
	add := func(addr string) {
		if addr != "" && addr != skip && !slices.Contains(addrs, addr) {
			addrs = append(addrs, addr)
		}
	}
	for _, a := range n.cfg.Join {
		add(a)
	}
	for _, m := range n.fsm.State().Members {
		if m.ID != n.cfg.ID {
			add(m.HTTP)
		}
	}
	for id, addr := range n.raft.local.known {
		if id != n.cfg.ID {
			add(addr)
		}
	}
	return addrs
}

// newIncarnation is a random name for this process (api.JoinRequest).
func newIncarnation() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand: never fails on a supported platform
	return hex.EncodeToString(b[:])
}

// registered reports whether the cluster lists this member as active
// with its current addresses.
func (n *Node) registered() bool { return listedActive(n.fsm.State(), n.self()) }

// listedActive reports whether st lists req's member as active with
// req's addresses.
func listedActive(st *fsm.State, req api.JoinRequest) bool {
	m, ok := st.Member(req.ID)
	return ok && m.State == fsm.Active && m.HTTP == req.HTTP && m.Raft == req.Raft && m.Peer == req.Peer
}

// registerLoop makes sure the cluster lists this member, active, with its
// current addresses: after a bootstrap, a join, or a restart.
//
// A member that joins with no Raft state registers until its join is
// answered with where it is in the log (joinEpoch), even while its log
// replay shows it listed: that listing may be of an earlier member of
// its id, and a join whose answer was lost is answered again.
func (n *Node) registerLoop() {
	if n.seeded != nil {
		select { // a seed with no Raft state decides first: join or bootstrap
		case <-n.seeded:
		case <-n.ctx.Done():
			return
		}
	}
	backoff := 50 * time.Millisecond
	ch, cancel := n.fsm.Watch()
	defer cancel()
	seen := false                                 // the cluster has listed us since we started (sawSelf)
	lastWarn := time.Now().Add(-27 * time.Second) // the first warning after 3s of trying
	var replaying time.Time                       // when this restart began to wait for its log; zero when not waiting
	for {
		st := n.fsm.State()
		_, member := st.Member(n.cfg.ID)
		seen = seen || n.sawSelf(st)
		if n.removed.Load() || n.stopping.Load() || seen && !member {
			return // removed (ringlimit leave): never re-register
		}
		if n.leftBeforeRestart() {
			return // it never re-registers either
		}
		// A member restarted over its data dir acts (marks itself down,
		// re-registers) only once a leader has committed the log it
		// restarted with; what the cluster did meanwhile (marked it dead
		// or down) comes with the same calls. Say so, or the wait is
		// silent at the default log level.
		switch caught := n.caughtUp(); {
		case !caught && replaying.IsZero() && n.raft.hasState && !n.moved():
			replaying = time.Now()
			n.log.Info("re-registering: waiting for the Raft leader to confirm the log this member restarted with",
				"applied", n.applied(), "of", n.startIndex)
		case caught && !replaying.IsZero():
			n.log.Info("re-registering: log confirmed by the leader", "waited", time.Since(replaying).Round(time.Millisecond).String())
			replaying = time.Time{}
		}
		joining := n.joinEpoch.Load() == joinPending
		if joining || n.caughtUp() && (n.needsRecovery() || !n.registered()) || !n.caughtUp() && n.moved() {
			if n.leftBeforeRestart() { // caught up since st was read
				return
			}
			ctx, cancelReq := context.WithTimeout(n.ctx, 5*time.Second)
			err := n.register(ctx)
			cancelReq()
			if errors.Is(err, api.ErrLeft) {
				n.noteLeft(fmt.Errorf("%w: %w", ErrDataDir, err))
				return
			}
			if errors.Is(err, api.ErrConflict) {
				n.log.Error("another live process holds this member id; not registering", "id", n.cfg.ID, "err", err)
				if n.conflict.CompareAndSwap(false, true) && n.cfg.OnConflict != nil {
					go n.cfg.OnConflict(err)
				}
				return
			}
			if err != nil {
				// Say why at warn level once, then every 30s: a refused
				// join (wrong secret, unreachable addresses) must not be
				// silent at the default log level.
				if time.Since(lastWarn) >= 30*time.Second {
					n.log.Warn("not registered in the cluster yet; retrying", "err", err)
					lastWarn = time.Now()
				} else {
					n.log.Debug("registering", "err", err)
				}
			} else {
				backoff = 50 * time.Millisecond
			}
		}
		wait := time.Second
		if n.joinEpoch.Load() == joinPending || n.needsRecovery() || !n.registered() {
			wait = backoff
			backoff = min(2*backoff, 2*time.Second)
		}
		t := time.NewTimer(wait)
		select {
		case <-n.ctx.Done():
			t.Stop()
			return
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// needsRecovery reports whether this member restarted over its data dir
// while the cluster still lists it active: it crashed (or stopped without
// marking itself down) and its bucket state is gone from memory. Its
// partitions' backups hold that state, so before it serves again it has
// itself marked down (the ring moves its partitions to the backups, which
// promote their copies) and then active (they hand the partitions back).
//
// A member that stopped gracefully while listed active (the last active
// one, or with no leader to mark it down) kept its state in its bucket
// file (savedState): it lost nothing, and nobody served its partitions
// meanwhile, so the file is their latest state: no recovery.
func (n *Node) needsRecovery() bool {
	if !n.raft.hasState || n.recovered.Load() || !n.caughtUp() {
		return false
	}
	st := n.fsm.State()
	m, ok := st.Member(n.cfg.ID)
	if !ok || m.State != fsm.Active || len(st.Active()) < 2 || n.savedState.Load() {
		n.log.Debug("no recovery needed", "member", ok, "state", m.State, "active", len(st.Active()), "bucket_file", n.savedState.Load())
		n.recovered.Store(true)
		return false
	}
	return true
}

// moved reports whether the local Raft configuration lists this member at
// another Raft address than it now advertises (restarted with other
// ports): the leader cannot reach it until it re-registers, so it must
// do so before its log is replayed.
func (n *Node) moved() bool {
	if n.leaderKnown() {
		return false
	}
	cf := n.raft.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	for _, s := range cf.Configuration().Servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			return s.Address != raft.ServerAddress(n.cfg.RaftAdvertise)
		}
	}
	return false
}

func (n *Node) leaderKnown() bool { id, _ := n.leader(); return id != "" }

// register has the cluster list this member (after a restart, marks it
// down first: needsRecovery). The answer to a join goes to noteJoin.
func (n *Node) register(ctx context.Context) error {
	if n.needsRecovery() {
		if err := n.SetState(ctx, n.cfg.ID, string(fsm.Down)); err != nil {
			if errors.Is(err, api.ErrConflict) {
				// The last active member's mark-down is refused (SetState):
				// another member listed active, restarted with this one,
				// was marked down first. Not a second process holding the
				// id: retried, this member needs no recovery any more.
				return fmt.Errorf("node: marking down to recover: %v", err)
			}
			return err
		}
		n.log.Info("restarted after a crash (its own log lists it active; the leader may have marked it dead since): marked down first, so the backups serve what was lost")
		n.recovered.Store(true)
		return nil
	}
	req := n.self()
	if n.isLeader() {
		if !n.fsm.State().Initialized {
			return errors.New("cluster not initialised yet")
		}
		epoch, err := n.join(ctx, req)
		if err == nil {
			n.noteJoin(epoch)
		}
		return err
	}
	// No leader in sight, or the leader's HTTP address does not answer
	// from here: we are new, or back at other addresses the leader does
	// not know yet, or only our path to the leader's HTTP port fails
	// (while Raft's works: a member whose join's answer was lost then
	// knew the leader, asked it alone, and stayed unready). Ask the
	// member we were told about, then every member we know of; any of
	// them forwards to the leader (which is why the request is not
	// marked forwarded: a new member whose --join names a follower would
	// otherwise be refused until that follower happened to lead).
	leader, lerr := n.leaderHTTP()
	tried := n.othersHTTP(leader)
	err := fmt.Errorf("%w: no leader", api.ErrUnavailable)
	if lerr == nil {
		// The leader first, with half of what is left when there are
		// others to ask: a path that drops packets hangs to the deadline.
		lctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && len(tried) > 0 {
			lctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		}
		var epoch uint64
		epoch, err = n.cfg.Forward.Join(lctx, leader, req)
		cancel()
		if err == nil {
			n.noteJoin(epoch)
			return nil
		}
		if !errors.Is(err, api.ErrUnavailable) || ctx.Err() != nil {
			return err // the leader answered (a refusal), or no time is left
		}
	}
	for _, addr := range tried {
		var epoch uint64
		if epoch, err = n.cfg.Forward.JoinVia(ctx, addr, req); err == nil {
			n.noteJoin(epoch)
			return nil
		}
	}
	return err
}

// Join adds (or re-activates, or re-addresses) a member. On a non-leader
// it is forwarded to the leader.
//
// It returns the epoch from which the cluster lists the member as req
// asks (api.JoinResponse.Epoch): the Raft index of the last change to
// the member's record, its join or a later one. A forwarded join
// returns the leader's answer, 0 when the leader is of a version that
// does not give one.
//
// It answers by ctx's deadline: the probes of the member's addresses,
// the wait for the membership change before it, and Raft's taking and
// answering each of its two changes (the Raft configuration, then the
// ring) all honour ctx. When ctx ends first the error wraps
// api.ErrUnavailable and says what was not done or is of unknown
// outcome; the joining member asks again until it is answered, and a
// join asked again finishes one cut short (a member already in Raft at
// its address is not added again, one listed as it asks is answered at
// once).
func (n *Node) Join(ctx context.Context, req api.JoinRequest) (epoch uint64, err error) {
	if req.ID == "" || req.HTTP == "" || req.Raft == "" || req.Peer == "" {
		return 0, fmt.Errorf("%w: id, http, raft and peer are required", api.ErrBadRequest)
	}
	if !n.isLeader() {
		addr, err := n.forwardTo(ctx)
		if err != nil {
			return 0, err
		}
		return n.cfg.Forward.Join(ctx, addr, req)
	}
	return n.join(ctx, req)
}

// join runs on the leader: Raft configuration first (so the new member
// receives the log), then the ring membership. It returns the epoch of
// the member's record once listed (see Join).
func (n *Node) join(ctx context.Context, req api.JoinRequest) (epoch uint64, err error) {
	if err := n.checkJoin(ctx, req); err != nil {
		return 0, err
	}
	if err := n.lockMembership(ctx); err != nil {
		return 0, err
	}
	defer n.membership.unlock()
	// What follows decides on the FSM's state, which must hold every
	// write before it: a leader just elected applies the log it leads
	// with after its first commit, and its FSM can be behind a follower's
	// (a whole cluster restarted together: the followers' joins reached
	// a leader still replaying, which took itself, active and the last
	// one, for a member listed active with another, from a process not
	// seen before, and marked itself down; every budget started afresh).
	if err := n.barrier(ctx, "adding "+req.ID); err != nil {
		return 0, err
	}
	if req.ID != n.cfg.ID && len(n.fsm.State().Members) == 0 {
		// The member that bootstrapped the cluster is listed first, so it
		// is in the first ring. Started together, the joining members
		// ask it as soon as it leads, and its own registration raced
		// theirs: a first ring of a joiner alone gave that joiner every
		// partition for one epoch, and the bootstrapper then awaited, for
		// the hand-off timeout, hand-offs nobody would send.
		if _, err := n.joinLocked(ctx, n.self()); err != nil {
			return 0, fmt.Errorf("registering the leader itself first: %w", err)
		}
	}
	return n.joinLocked(ctx, req)
}

// joinLocked is join under the membership lock.
func (n *Node) joinLocked(ctx context.Context, req api.JoinRequest) (epoch uint64, err error) {
	if err := n.leftBefore(req); err != nil {
		return 0, err
	}
	cf := n.raft.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return 0, fmt.Errorf("%w: %w", api.ErrUnavailable, err)
	}
	voters := 0
	var existing *raft.Server
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
		if s.ID == raft.ServerID(req.ID) {
			existing = &s
		}
	}
	suffrage := raft.Nonvoter
	switch {
	case existing != nil && existing.Address == raft.ServerAddress(req.Raft):
		suffrage = existing.Suffrage
	default:
		// New, or back with another address (AddVoter/AddNonvoter update
		// the address of a server already present).
		enqueue, err := enqueueTimeout(ctx, "membership change")
		if err != nil {
			return 0, raftUnavailable("adding "+req.ID+" to raft", err)
		}
		var f raft.IndexFuture
		// A new member starts as a non-voter and is promoted once it has
		// caught up (promoteLater), so a member that dies while joining
		// never costs the cluster its quorum.
		if existing != nil && existing.Suffrage == raft.Voter || existing == nil && voters < MaxVoters && !n.promotesLater() {
			suffrage = raft.Voter
			f = n.raft.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.Raft), 0, enqueue)
		} else {
			f = n.raft.raft.AddNonvoter(raft.ServerID(req.ID), raft.ServerAddress(req.Raft), 0, enqueue)
		}
		if _, err := n.await(ctx, f, "membership change"); err != nil {
			return 0, raftUnavailable("adding "+req.ID+" to raft", err)
		}
	}
	if suffrage == raft.Nonvoter && voters < MaxVoters && n.promotesLater() {
		n.promoteLater(req)
	}
	if st := n.fsm.State(); listedActive(st, req) {
		m, _ := st.Member(req.ID)
		if req.Incarnation == "" || n.joined[req.ID] == req.Incarnation || len(st.Active()) < 2 {
			n.joined[req.ID] = req.Incarnation
			return m.Since, nil // listed since its last change: a join answered before, say
		}
		// Another process than the one last seen: the member lost its data
		// dir (crashed, came back empty) while listed active. Marked down
		// first, as a member back over its data dir after a crash marks
		// itself (needsRecovery): its partitions go to their backups,
		// which promote their copies, and come back by hand-off once it
		// is active again. Was: nothing changed, and it served its
		// partitions from nothing (a new user: 11 of 30 spent keys fresh).
		// A leader that has not seen the process before (it took the lead
		// since) counts a join answered before as one of these: a round
		// of hand-offs, nothing lost beyond replication lag.
		down, err := fsm.SetMemberState(req.ID, fsm.Down)
		if err != nil {
			return 0, err
		}
		if err := n.apply(ctx, down); err != nil {
			return 0, err
		}
		n.log.Info("a member listed active joined from a new process (its data dir lost): marked down first, so that its backups serve what it held", "id", req.ID, "active", len(st.Active()), "epoch", st.MembershipIndex)
	}
	cmd, err := fsm.AddMember(fsm.Member{ID: req.ID, HTTP: req.HTTP, Raft: req.Raft, Peer: req.Peer, State: fsm.Active, Voter: suffrage == raft.Voter})
	if err != nil {
		return 0, err
	}
	if err := n.apply(ctx, cmd); err != nil {
		return 0, err
	}
	// Every membership change is made under n.membership, which this
	// holds: the member is as the command left it, unless the lead
	// moved and another leader changed it meanwhile.
	m, ok := n.fsm.State().Member(req.ID)
	if !ok {
		return 0, fmt.Errorf("%w: %q was removed as it joined; ask again", api.ErrUnavailable, req.ID)
	}
	n.joined[req.ID] = req.Incarnation
	n.log.Info("member joined", "id", req.ID, "http", req.HTTP, "voter", suffrage == raft.Voter, "epoch", m.Since)
	return m.Since, nil
}

// leftBefore refuses, with an error wrapping api.ErrLeft, the join of a
// member that left: a process restarted over a data dir whose log listed
// the member as of epoch req.Listed, which the cluster has reached and
// no longer lists the member, so a leave removed it after that log ends.
// Its re-registration, sent as it caught up, can reach the leader after
// the leave (a restart policy starts it again at once): taken for a new
// member's, it undid the leave. A listing whose entry the leader's log
// holds at another term was never committed (a join cut short by a
// crash, overwritten by the next leader): no removal then.
func (n *Node) leftBefore(req api.JoinRequest) error {
	st := n.fsm.State()
	if _, listed := st.Member(req.ID); listed || req.Listed == 0 || st.MembershipIndex < req.Listed {
		return nil
	}
	var l raft.Log
	if req.ListedTerm != 0 && n.raft.logs.GetLog(req.Listed, &l) == nil && l.Term != req.ListedTerm {
		return nil
	}
	return fmt.Errorf("%w: member %q left the cluster (ringlimit leave): the log of the process asking lists it as of epoch %d, and the cluster, at epoch %d, lists it no more; start it over an empty --data-dir to join again as a new member",
		api.ErrLeft, req.ID, req.Listed, st.MembershipIndex)
}

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

// Rules returns the rules in force, default first.
func (n *Node) Rules() []limiter.Rule {
	if v := n.View(); v != nil {
		return v.List
	}
	return rules.Effective(nil)
}

// PutRules replaces the written rules through Raft and returns the set
// then in force. Invalid rules fail with an error wrapping rules.ErrInvalid.
//
// It answers by ctx's deadline: both of its waits honour ctx, the Raft
// write (apply: up to applyTimeout for Raft to take it, then
// commitTimeout) or the leader's answer to the forwarded write, and then
// the wait for the rules to be in force here (awaitRules, up to
// rulesWait). Without a deadline the worst case is their sum, more than
// an HTTP server's write timeout (the HTTP handler sets one). When ctx
// ends first the error wraps api.ErrUnavailable and says whether the
// write's outcome is unknown or it is written but not in force here yet.
func (n *Node) PutRules(ctx context.Context, written []limiter.Rule) ([]limiter.Rule, error) {
	if err := rules.Validate(written); err != nil {
		return nil, err
	}
	written = canonicalRules(written)
	if !n.isLeader() {
		addr, err := n.forwardTo(ctx)
		if err != nil {
			return nil, err
		}
		set, version, err := n.cfg.Forward.PutRules(ctx, addr, written)
		if err != nil {
			return nil, err
		}
		// Read your writes: answer once this node decides under the
		// leader's version once the write was in force there (the write,
		// or one after it). Was: once its rules equalled the set, which
		// a write that landed after this one in the same update never
		// showed: 5 s, then 503 (an audit: 8 of 1,350 racing PUTs). A
		// leader of an earlier release says no version: the set, then.
		ok := func(v *view.View) bool { return sameRules(v.List, set) }
		if version > 0 {
			ok = func(v *view.View) bool { return v.RulesVersion >= version }
		}
		if err := n.awaitRules(ctx, ok); err != nil {
			return nil, err
		}
		return set, nil
	}
	st, err := n.writeRules(ctx, written)
	if err != nil {
		return nil, err
	}
	if err := n.awaitRules(ctx, func(v *view.View) bool { return v.RulesVersion >= st.RulesIndex }); err != nil {
		return nil, err
	}
	return rules.Effective(st.Rules), nil
}

// RulesVersion is the rules version of this member's view: the Raft
// index of the rules write in force here (0 before the first).
func (n *Node) RulesVersion() uint64 {
	if s := n.snap.Load(); s != nil {
		return s.v.RulesVersion
	}
	return 0
}

// writeRules writes the canonical rules written through Raft, on the
// leader, and returns the state after it; rules equal to those in force
// are not written again (every member of a cluster given one rules file
// applies it, mostly at the same instant: three writes, three versions,
// for one change). Writes are serialised so that the comparison holds.
func (n *Node) writeRules(ctx context.Context, written []limiter.Rule) (*fsm.State, error) {
	if err := n.rulesWrite.lockCtx(ctx); err != nil {
		return nil, fmt.Errorf("%w: waiting for another rules write to finish, nothing written: %w", api.ErrUnavailable, err)
	}
	defer n.rulesWrite.unlock()
	// Never written (RulesIndex 0): written, even if empty, so that the
	// rules are on record. Was: an empty list was never a repeat.
	if st := n.fsm.State(); st.RulesIndex > 0 && sameInForce(st.Rules, written) {
		return st, nil
	}
	cmd, err := fsm.PutRules(written)
	if err != nil {
		return nil, err
	}
	if err := n.apply(ctx, cmd); err != nil {
		return nil, err
	}
	return n.fsm.State(), nil
}

// canonicalRules returns a copy of written in the form the cluster state
// stores: burst spelled out (it is the capacity), so that a rule reads
// the same whichever way it was written or forwarded.
func canonicalRules(written []limiter.Rule) []limiter.Rule {
	out := append([]limiter.Rule(nil), written...)
	for i := range out {
		out[i].Burst = out[i].Capacity()
	}
	return out
}

// sameInForce reports whether the written rule lists a and b put the
// same rules in force, in the same order. A list that spells out the
// built-in default is the list without it (GET /v1/rules lists default:
// PUT of its answer is no change). Was: compared as written, so a PUT of
// GET's answer was a new write and a new rules version.
func sameInForce(a, b []limiter.Rule) bool {
	return inForceFingerprint(a) == inForceFingerprint(b)
}

// inForceFingerprint fingerprints the rules in force given the written
// rules rs.
func inForceFingerprint(rs []limiter.Rule) string {
	return rules.Fingerprint(canonicalRules(rules.Effective(rs)))
}

// rulesWait bounds how long a rules write waits to be in force locally.
const rulesWait = 5 * time.Second

// awaitRules waits until this node's published view satisfies ok (the
// write is in force here), ctx ends or rulesWait passes.
func (n *Node) awaitRules(ctx context.Context, ok func(*view.View) bool) error {
	ctx, cancel := context.WithTimeout(ctx, rulesWait)
	defer cancel()
	if _, in := n.cell.AwaitFunc(ctx, func(v *view.View) bool { return v != nil && ok(v) }); !in {
		return fmt.Errorf("%w: the rules were written but are not in force on this node yet", api.ErrUnavailable)
	}
	return nil
}

// sameRules reports whether two rule sets are equal, in order.
func sameRules(a, b []limiter.Rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
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

// nodeMetrics are the member's counters, created even when unregistered.
type nodeMetrics struct {
	handoffParts prometheus.Counter
	backupErrors prometheus.Counter
	backupLag    prometheus.Gauge
	markedDead   prometheus.Counter
	// The rules file's (WatchRulesFile; registered only with one).
	rulesFileLoads *prometheus.CounterVec // result: ok, error
	rulesFileOK    prometheus.Gauge
}

func newNodeMetrics() *nodeMetrics {
	return &nodeMetrics{
		handoffParts: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_handoff_partitions_total", Help: "Partitions this member handed to their new owners."}),
		backupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_backup_errors_total", Help: "Backup pushes that failed (retried at the next round)."}),
		backupLag:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_backup_lag_seconds", Help: "Replication lag of the last backup round: the interval plus the time to push."}),
		markedDead:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_members_marked_dead_total", Help: "Members this node marked dead while leading."}),
		rulesFileLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_rules_file_loads_total",
			Help: "Loads of the rules file (--rules): the first at start, then each change; by result (ok; error: unreadable or invalid, the rules in force stay)."}, []string{"result"}),
		rulesFileOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_rules_file_last_load_ok",
			Help: "1 when the last load of the rules file (--rules) succeeded, 0 when it was refused."}),
	}
}

// ofOwner is a metric's value read from the member's owner: f of it, 0
// before it has one.
func (n *Node) ofOwner(f func(*Owner) float64) func() float64 {
	return func() float64 {
		if o := n.owner.Load(); o != nil {
			return f(o)
		}
		return 0
	}
}

func (n *Node) registerMetrics() error {
	reg := n.cfg.Registerer
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_active_keys", Help: "Bucket states held by this node (idle keys are dropped)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Table().Len()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_raft_state", Help: "Raft state: 0 follower, 1 candidate, 2 leader, 3 shutdown."},
			func() float64 { return float64(n.raft.raft.State()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_ring_epoch", Help: "Epoch (raft index) of the ring in use."},
			func() float64 {
				if v := n.View(); v != nil {
					return float64(v.Ring.Epoch())
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_owned_partitions", Help: "Partitions this node owns."},
			func() float64 {
				if v := n.View(); v != nil {
					return float64(len(v.Ring.PartitionsOf(n.cfg.ID)))
				}
				return 0
			}),
	}
	cs = append(cs, n.stateCollectors()...)
	cs = append(cs, n.m.handoffParts, n.m.backupErrors, n.m.backupLag, n.m.markedDead,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_handoff_pending_partitions", Help: "Partitions this member still has to hand to their new owners."},
			func() float64 { return float64(n.h.Pending()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_awaiting_partitions", Help: "Partitions this member owns whose state has not arrived yet."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Awaiting()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_handoff_received_partitions_total", Help: "Partitions this member took over by hand-off from their previous owner (counted where they arrive: the sender of a stop counts its own as it exits)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.HandoffsReceived()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_partitions_served_from_nothing_total", Help: "Partitions this member began to serve, their hand-off wait over, with no backup copy to serve them from: their keys' budgets started full (an owner and its backup lost together, a hand-off lost with no copy, or a lone member's bucket file that could not be loaded)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.ServedFromNothing()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_owner_checks_total", Help: "Checks this member decided as their key's owner, whatever front door they came through (its own HTTP API or RLS, another member or router, a Go client on the data plane)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Decided()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_key_cap_refused_total", Help: "Checks of new keys refused because this member tracks --max-keys states (answered by the rule's failure mode)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.OverCapacity()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_backup_keys", Help: "Bucket states this member holds as a backup of other owners."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.BackupTable().Len()) })))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("node: metrics: %w", err)
		}
	}
	return nil
}
