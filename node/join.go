package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
)

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
			stopped, err := n.registerOnce()
			if stopped {
				return
			}
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
					args := []any{"err", err}
					if !n.cfg.Seed && !n.holdsCluster() {
						// Members whose --join lists name no seed (the
						// seed's address written otherwise than it
						// advertises it) wait here for good.
						args = append(args, "hint", "this member was never in a cluster and is not the seed: it joins once a member of --join is in one; a new cluster starts at the seed, the member whose --join list names its own advertised HTTP address first")
					}
					n.log.Warn("not registered in the cluster yet; retrying", args...)
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
		case <-n.registerCtx.Done():
			t.Stop()
			return
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// registerOnce registers this member (register) unless it has begun a
// graceful stop, which it reports. It holds n.registering from its look
// at stopping until the registration has returned, and markDown takes
// it once stopping is set: a stop that begins after that look cancels
// the registration and waits for it, so its mark-down is written after
// any join the registration sent. Was: registerLoop looked at stopping,
// then found the member not listed active, as its own mark-down had
// just made it, and joined: the leader listed it active again as it
// stopped, and in a whole cluster stopped together the last member's
// ring kept listing the gone one, so its stop waited for the loss of
// the leader (over 3s; about 1 run in 100).
func (n *Node) registerOnce() (stopped bool, err error) {
	if n.registering.lockCtx(n.registerCtx) != nil {
		return true, nil
	}
	defer n.registering.unlock()
	if n.stopping.Load() || n.removed.Load() {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(n.registerCtx, 5*time.Second)
	defer cancel()
	return false, n.register(ctx)
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
