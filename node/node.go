// Package node is a cluster member: it runs Raft for membership and
// rules, keeps the bucket table of the partitions it owns, and decides
// the checks forwarded to it over the data plane.
//
// The replicated state lives in an fsm.FSM. Every change there is turned
// into an immutable view (the ring at its epoch, the compiled rules, the
// hash seed) that is swapped atomically; deciding a check reads the view
// and locks only the bucket table's partition. Writes (rules, membership)
// go through the Raft leader: a node that is not the leader hands them to
// the leader through its Forwarder.
//
// A Node is safe for concurrent use. It holds no package-level state, so
// many nodes can run in one process.
package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// Forwarder carries writes to the leader's HTTP API when this node is not
// the leader. The HTTP client that implements it lives above this package.
//
// Writes to leaderHTTP are marked as forwarded (api.HeaderForwarded): a
// receiver that does not lead refuses them rather than forward them
// again, so two nodes that disagree about the leader cannot bounce one.
// JoinVia is the exception: it is how a member with no leader in sight
// registers through a member it merely knows of (its --join), and is not
// marked, so that member forwards it to its leader (once, marked).
//
// Join and JoinVia return the epoch of the answer (api.JoinResponse):
// 0 when it has none, as from a member of an older version.
type Forwarder interface {
	Join(ctx context.Context, leaderHTTP string, req api.JoinRequest) (epoch uint64, err error)
	JoinVia(ctx context.Context, memberHTTP string, req api.JoinRequest) (epoch uint64, err error)
	Leave(ctx context.Context, leaderHTTP, id string) error
	SetState(ctx context.Context, leaderHTTP, id, state string) error
	// PutRules has the leader write the rules, and returns the set in
	// force and the leader's rules version once it is (0: not said).
	PutRules(ctx context.Context, leaderHTTP string, written []limiter.Rule) ([]limiter.Rule, uint64, error)
	// InCluster asks the member at memberHTTP whether it holds a
	// cluster's Raft state (api.SeedStatus): what a seed with no Raft
	// state asks before it bootstraps (Config.Seed). An error is no
	// answer.
	InCluster(ctx context.Context, memberHTTP string) (bool, error)
}

// DataPlane pushes partitions to other members by data-plane address.
type DataPlane interface {
	Push(ctx context.Context, addr string, push *transport.Push, ack *transport.PushAck) error
}

// Config configures a Node.
type Config struct {
	ID            string // unique member id, also the Raft server id
	HTTPAddr      string // advertised HTTP API address, host:port
	RaftAdvertise string // advertised Raft address, host:port
	PeerAddr      string // advertised data-plane address, host:port
	DataDir       string
	// Join lists HTTP addresses of members, used to join when DataDir
	// holds no cluster state (any of them will do; empty strings are
	// ignored). Empty with an empty DataDir bootstraps a new cluster. A
	// member that joins acts on the cluster's log only from its own join
	// on, which the join's answer names.
	Join []string
	// Seed makes a member with no Raft state and a non-empty Join the
	// one that may bootstrap: it asks every address of Join whether it
	// holds a cluster (Forwarder.InCluster) and joins through one that
	// does; it bootstraps once every one has answered that it holds
	// none, or when SeedGrace has passed and none has said it holds one
	// (seed.go). A --join list that names the member itself first makes
	// it the seed, Join then being the list's other addresses.
	Seed bool
	// SeedGrace bounds how long a seed waits for listed members that do
	// not answer at all (DefaultSeedGrace).
	SeedGrace time.Duration
	// Ring is the partitioning a bootstrapping node writes into the
	// cluster; joining nodes take the cluster's.
	Ring ring.Config
	// RaftTimeout is Raft's heartbeat and election timeout (1s).
	RaftTimeout time.Duration
	Forward     Forwarder
	Logger      *slog.Logger // the node's lines and Raft's (raftlog.go); nil discards them
	Registerer  prometheus.Registerer
	// Now is the clock of the buckets, in Unix nanoseconds. The default
	// is the wall clock at start advanced by the monotonic clock, so it
	// never jumps.
	Now func() int64
	// OnView is called with every new view (from one goroutine).
	OnView func(*view.View)
	// Raft's transport and stores. Nil = TCP on the listener given to
	// Open, one bolt store (raft.db) for log and stable store, and file
	// snapshots, all in DataDir. Tests pass in-memory ones.
	RaftTransport raft.Transport
	LogStore      raft.LogStore
	StableStore   raft.StableStore
	SnapshotStore raft.SnapshotStore
	// DataPlane carries partition hand-offs and backup copies to the
	// other members (transport.Pool implements it). Required.
	DataPlane DataPlane
	// DeadAfter is how long the leader lets a member go without contact
	// before marking it dead (5s). It is at least RaftTimeout: the
	// leader's lease (DeadAfter/4) counts Raft heartbeats, which come up
	// to RaftTimeout/5 apart.
	DeadAfter time.Duration
	// BackupInterval is how often changed partitions are pushed to their
	// backups (20ms).
	BackupInterval time.Duration
	// MaxPushFrame is the largest frame DataPlane carries, length prefix
	// included (its transport.Limits' MaxFrameSize, which the receiving
	// members' servers must accept too; 0: transport.DefaultMaxFrameSize).
	// A hand-off larger than that goes as several pushes (fitPush).
	MaxPushFrame int
	// MaxKeys caps the bucket states this member tracks as an owner (0:
	// no cap); see Owner.SetMaxKeys for the behaviour at the cap.
	MaxKeys int
	// OnConflict is called once when the cluster refuses this process's
	// registration because a live member holds its id (api.ErrConflict):
	// the process should exit without touching that member's state.
	OnConflict func(error)
	// OnRemoved is called once when this member is removed from the
	// cluster (ringlimit leave).
	OnRemoved func()
	// OnLeft is called once, with an error wrapping ErrDataDir, when this
	// member, restarted over its data dir, learns from another member of
	// its cluster that it was removed while it was away, its log never
	// having received the removal (leftWhileAway): the error says what
	// Open's does when the log holds the removal. It is no member: the
	// process should stop without telling the cluster anything, and
	// exit with the error. Nil: OnRemoved is called instead.
	OnLeft func(error)
	// RaftDial opens (and authenticates) Raft connections to other
	// members, and Probe checks a joining member's addresses; nil dials
	// plain TCP (see transport.Auth.Dial). The Raft listener given to
	// Open authenticates the other direction.
	RaftDial func(ctx context.Context, addr string) (net.Conn, error)
	// Prober reaches a joining member before it is added, and tells when
	// it has caught up; nil reaches it with RaftDial and promotes at once.
	Prober Prober
}

func (c *Config) raftDial() func(ctx context.Context, addr string) (net.Conn, error) {
	if c.RaftDial != nil {
		return c.RaftDial
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// Validate checks the fields without changing them.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("node: id is empty")
	case c.HTTPAddr == "" || c.RaftAdvertise == "" || c.PeerAddr == "":
		return errors.New("node: http, raft and peer addresses are required")
	case c.DataDir == "" && c.RaftTransport == nil:
		return errors.New("node: data dir is empty")
	case c.RaftTransport != nil && (c.LogStore == nil || c.StableStore == nil || c.SnapshotStore == nil):
		return errors.New("node: a raft transport needs its log, stable and snapshot stores")
	case c.DataPlane == nil:
		return errors.New("node: data plane is nil")
	case c.Forward == nil:
		return errors.New("node: forwarder is nil")
	case c.SeedGrace < 0:
		return fmt.Errorf("node: seed grace %v is negative", c.SeedGrace)
	case c.MaxPushFrame < 0:
		return fmt.Errorf("node: max push frame %d is negative (0 means transport.DefaultMaxFrameSize)", c.MaxPushFrame)
	case c.MaxKeys < 0:
		return fmt.Errorf("node: max keys %d is negative (0 means no cap)", c.MaxKeys)
	case c.DeadAfter < 0:
		return fmt.Errorf("node: dead-after %v is negative", c.DeadAfter)
	case c.DeadAfter != 0 && c.DeadAfter < c.RaftTimeout:
		return fmt.Errorf("node: dead-after %v is shorter than the raft timeout %v (the leader's lease, dead-after/4, counts raft heartbeats)", c.DeadAfter, c.RaftTimeout)
	}
	return c.Ring.Validate()
}

// snapshot pairs a view with the FSM state it was built from.
type snapshot struct {
	v  *view.View
	st *fsm.State
}

// Node is a running cluster member. Create it with Open; stop it with Close.
type Node struct {
	cfg   Config
	log   *slog.Logger
	fsm   *fsm.FSM
	raft  *raftParts
	owner atomic.Pointer[Owner] // built with the first view (it needs the partition count)
	snap  atomic.Pointer[snapshot]
	now   func() int64
	h     *handoffs
	m     *nodeMetrics
	// announcedTo is the last command applied before announceCommit's
	// latest barrier.
	announcedTo atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines Close waits for (goLoop)
	// copying counts sendCopies under way, which a graceful stop waits for.
	copying underWay
	// silentHook, when set (tests of the Owner without a cluster),
	// answers memberSilent instead of pinging.
	silentHook func() bool
	// memberGone is when a ring this member applied last had a member
	// fewer than the one before it (memberSilent); nil never. A
	// time.Time read from the monotonic clock: a step of the wall clock
	// neither shortens nor lengthens the hold (was Unix ns).
	memberGone atomic.Pointer[time.Time]
	// loopsMu guards loopsClosed, set as Close begins: goLoop then starts
	// nothing more.
	loopsMu     sync.Mutex
	loopsClosed bool

	removed atomic.Bool
	// removedWaited is closed once a member removed from the cluster has
	// waited for its hand-offs (noteRemoved): its graceful stop then does
	// not wait for them again.
	removedWaited chan struct{}
	// startIndex is the index of the last command in Raft's log when the
	// node started (0 when the snapshot covers them all): until
	// the FSM has applied that far it still shows an old state (rules
	// from before a restart, say) and the node is not ready.
	startIndex uint64
	// joinEpoch is, for a member that started with no Raft state and
	// joins a cluster (Config.Join), the epoch from which the cluster
	// lists it as it registered, which the answer to its join gives
	// (api.JoinResponse.Epoch); joinPending until that answer comes, 0
	// for every other member and after an answer without one. Such a
	// member replays the leader's log from its start, where a member
	// that held its id before and left shows listed, then removed; it
	// acts on no state of its log before that epoch (joinedIn), or it
	// would take that leave for its own removal.
	joinEpoch atomic.Uint64
	// incarnation names this process in its joins (api.JoinRequest).
	incarnation string
	// joined is, on a leader, the incarnation it last added or found
	// listed for each member id; guarded by membership.
	joined   map[string]string
	stopping atomic.Bool // marked down for a graceful stop: do not re-register
	// registering is held by registerLoop from its last look at stopping
	// until the registration it then sends has returned (registerOnce);
	// markDown takes it once stopping is set, having cancelled that
	// registration (stopRegistering), so a join of this member sent
	// before its mark-down never reaches the leader after it.
	registering chanLock
	// registerCtx is what registrations are sent with; stopRegistering
	// cancels it (markDown).
	registerCtx     context.Context
	stopRegistering context.CancelFunc
	// seeded is closed once a seed with no Raft state has decided
	// between joining and bootstrapping (seedLoop); registerLoop waits
	// for it. Nil for every other member.
	seeded  chan struct{}
	seeding atomic.Bool // seedLoop is asking the other listed members
	// membership serialises leader-side membership changes. It is a
	// channel, not a sync.Mutex, because its holder waits on Raft: a
	// request queued behind it can give up when its context ends
	// (lockCtx), and a goroutine queued on a channel is durably blocked,
	// so a synctest bubble can still advance its clock (it cannot past a
	// mutex wait).
	membership chanLock
	// recovered: after a restart with state, this member has had itself
	// marked down once, so its backups serve what it lost (see register).
	recovered atomic.Bool
	conflict  atomic.Bool // OnConflict was called
	// savedState: the data dir held a bucket file at the start (the
	// member stopped gracefully, keeping what it held), until loading it
	// fails. A member listed active with it lost nothing: no recovery.
	savedState atomic.Bool

	cell view.Cell // the published view, for callers that wait on it

	// rulesFilePending: a rules file was given and its content is not in
	// force on this node yet (not ready until it is).
	rulesFilePending atomic.Bool
	// rulesFileStart is true until the rules file watcher has dealt with
	// its first content: only that one may be skipped for the data dir's
	// marker (a restart with an unchanged file does not undo a later PUT).
	rulesFileStart atomic.Bool

	promotingMu sync.Mutex
	promoting   map[string]bool // guarded by promotingMu: ids awaiting promotion
	// syncingVoters: a syncVoterFlagsLater run is under way.
	syncingVoters atomic.Bool
	// rulesWrite serialises the leader's rules writes (writeRules).
	rulesWrite chanLock
	// removingOrphans: a removeOrphansLater run is under way.
	removingOrphans atomic.Bool
	// leaderSince is when this node last became Raft leader (leaderLoop);
	// nil before that.
	leaderSince atomic.Pointer[time.Time]
	// noLeaderSince is when a stopping member first saw no Raft leader
	// (leaderless); nil while it sees one.
	noLeaderSince atomic.Pointer[time.Time]
	// gainedLead wakes the failure detector when this node becomes Raft
	// leader (leaderLoop), so its first pings, and so its own lease and
	// the leases it grants, do not wait for its next tick.
	gainedLead chan struct{}
	// contacts is the failure detector's record of when, while this node
	// leads, it last heard from each member (detectLoop, grantsLease).
	contacts contacts
	// behind is, while this node leads, which members ask for their
	// lease with a ring older than this node's, since when and lately
	// (HandlePush): a member that answers pings but whose ring cannot
	// follow the log (its Raft log cannot grow: a full or failing disk)
	// never takes its lease, and its partitions were answered degraded
	// for as long as that lasted. detectLoop counts it silent from the
	// first such request while they keep coming.
	behind behindReports
	// leaderLeaseAt is the lease this node holds as leader, from a quorum
	// at its term (leaderLease), apart from the owner's lease, which a
	// leader just elected still holds from its leader before: grantsLease
	// needs this one.
	leaderLeaseAt atomic.Pointer[termLease]
}

// termLease is a leader's lease: until then (monotonic), at Raft term
// term.
type termLease struct {
	until time.Time
	term  uint64
}

// Open starts a member on the given Raft listener: it recovers its state
// from DataDir, bootstraps a new cluster or joins one, and keeps its
// registration (id, addresses, active) up to date in the cluster.
func Open(cfg Config, raftLn net.Listener) (*Node, error) {
	if cfg.Ring == (ring.Config{}) {
		cfg.Ring = ring.DefaultConfig()
	}
	if cfg.RaftTimeout == 0 {
		cfg.RaftTimeout = time.Second
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DeadAfter == 0 {
		cfg.DeadAfter = 5 * time.Second
	}
	if cfg.BackupInterval == 0 {
		cfg.BackupInterval = 20 * time.Millisecond
	}
	if cfg.SeedGrace == 0 {
		cfg.SeedGrace = DefaultSeedGrace
	}
	cfg.Join = slices.DeleteFunc(slices.Clone(cfg.Join), func(a string) bool { return a == "" })
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), fsm: fsm.New(), now: cfg.Now, membership: make(chanLock, 1), rulesWrite: make(chanLock, 1), registering: make(chanLock, 1), gainedLead: make(chan struct{}, 1), removedWaited: make(chan struct{})}
	n.h = newHandoffs(n)
	n.m = newNodeMetrics()
	n.incarnation = newIncarnation()
	n.joined = make(map[string]string)
	if n.now == nil {
		base := time.Now()
		n.now = func() int64 { return base.UnixNano() + int64(time.Since(base)) }
	}
	if cfg.DataDir != "" {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, bucketFile)); err == nil {
			n.savedState.Store(true)
		}
	}
	rp, err := openRaft(&n.cfg, n.fsm, raftLn)
	if err != nil {
		return nil, err
	}
	n.raft = rp
	n.startIndex = rp.lastCommand
	if !rp.hasState && len(cfg.Join) > 0 {
		n.joinEpoch.Store(joinPending) // a seed too, until it bootstraps (seedLoop)
		if cfg.Seed {
			n.seeded = make(chan struct{})
			n.seeding.Store(true)
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.registerCtx, n.stopRegistering = context.WithCancel(n.ctx)
	if !rp.hasState && len(cfg.Join) == 0 {
		f := rp.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			ID: raft.ServerID(cfg.ID), Address: raft.ServerAddress(cfg.RaftAdvertise), Suffrage: raft.Voter,
		}}})
		if err := f.Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			n.cancel()
			_ = rp.close()
			return nil, fmt.Errorf("node: bootstrap: %w", err)
		}
		n.log.Info("bootstrapped a new cluster")
	}
	if err := n.registerMetrics(); err != nil {
		n.cancel()
		_ = rp.close()
		return nil, err
	}
	if n.seeded != nil {
		n.goLoop(n.seedLoop)
	}
	n.goLoop(n.watchLoop)
	n.goLoop(n.leaderLoop)
	n.goLoop(n.registerLoop)
	n.goLoop(n.sweepLoop)
	n.goLoop(n.backupLoop)
	n.goLoop(n.detectLoop)
	n.goLoop(n.leaseLoop)
	n.goLoop(n.leftWhileAway)
	return n, nil
}

// goLoop runs f in a goroutine that Close waits for, and reports
// whether it did: once Close has begun it starts nothing. A request can
// start one (a leave's finish, the watch for this member's own removal)
// as or after the node closes, and adding to a WaitGroup that Close is
// waiting on is a race.
func (n *Node) goLoop(f func()) bool {
	n.loopsMu.Lock()
	defer n.loopsMu.Unlock()
	if n.loopsClosed {
		return false
	}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); f() }()
	return true
}

// Close stops the member's loops and Raft. It does not leave the cluster.
func (n *Node) Close() error {
	n.cancel()
	n.loopsMu.Lock()
	n.loopsClosed = true
	n.loopsMu.Unlock()
	err := n.raft.close()
	n.wg.Wait()
	return err
}

// ID returns the member id.
func (n *Node) ID() string { return n.cfg.ID }

// View returns the current view; nil until the cluster is initialised.
func (n *Node) View() *view.View {
	if s := n.snap.Load(); s != nil {
		return s.v
	}
	return nil
}

// State returns the FSM state the current view was built from (nil
// before the first view).
func (n *Node) State() *fsm.State {
	if s := n.snap.Load(); s != nil {
		return s.st
	}
	return nil
}

// Owner returns the member's owner side (nil before the first view).
func (n *Node) Owner() *Owner { return n.owner.Load() }

// Raft exposes the Raft instance (tests and status).
func (n *Node) Raft() *raft.Raft { return n.raft.raft }

// watchLoop turns every FSM change into a new view.
//
// Until the node has caught up (caughtUp) no view is published at all:
// while the log this node restarted with is being replayed the FSM
// still holds an old state (rules from before a PUT, say), and
// "unavailable" is the honest answer until it catches up; a member that
// joins with no Raft state waits for its own join (joinEpoch). Raft
// counts an entry as applied only after the FSM's notification, and the
// join's answer may come after the log, so a ticker re-checks until
// then.
func (n *Node) watchLoop() {
	ch, cancel := n.fsm.Watch()
	defer cancel()
	replay := time.NewTicker(20 * time.Millisecond)
	defer replay.Stop()
	n.refresh()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-ch:
			if n.raft != nil && n.isLeader() {
				n.announceCommit()
			}
		case <-replay.C:
			if !n.caughtUp() {
				continue
			}
			replay.Stop()
		}
		n.refresh()
	}
}

// joinPending is joinEpoch until the answer to the join comes.
const joinPending = ^uint64(0)

// caughtUp reports whether the node acts on its FSM's state (caughtUpTo).
func (n *Node) caughtUp() bool { return n.caughtUpTo(n.fsm.State()) }

// caughtUpTo reports whether the node may act on st, its FSM's state
// now or a moment ago: the FSM has applied the log the node started
// with, and st includes this member's own join (joinedIn).
func (n *Node) caughtUpTo(st *fsm.State) bool {
	return n.applied() >= n.startIndex && n.joinedIn(st)
}

// joinedIn reports whether st includes the join of this member that
// joinEpoch names: always for a member that started with Raft state or
// bootstrapped, never before the join's answer. It reads the state, not
// the FSM's applied index: the epoch is a membership change, so a state
// includes it exactly when its MembershipIndex is at least that, even
// when the state came whole in a snapshot (which the applied index does
// not count) or was read just before the FSM applied the next entry.
func (n *Node) joinedIn(st *fsm.State) bool { return st.MembershipIndex >= n.joinEpoch.Load() }

// sawSelf reports whether st shows this member listed since it started:
// st lists it, or st includes the join that listed it (joinEpoch, when
// the join's answer gave one; it may have been removed since). An
// earlier member of the same id, listed before that join, does not
// count.
func (n *Node) sawSelf(st *fsm.State) bool {
	if !n.joinedIn(st) {
		return false
	}
	_, member := st.Member(n.cfg.ID)
	return member || n.joinEpoch.Load() > 0
}

// noteJoin takes the epoch of the answer to this member's join, the
// first answer of a member that joins with no Raft state (joinEpoch).
// 0 is an answer from a member older than the field: this member then
// acts on its log as it applies it, as all did then.
func (n *Node) noteJoin(epoch uint64) {
	if !n.joinEpoch.CompareAndSwap(joinPending, epoch) {
		return
	}
	if epoch == 0 {
		n.log.Warn("joined, but the answer does not say where the join is in the raft log (a leader of an older version): acting on the log as it comes, where a member that had this id and left may show as this one")
		return
	}
	n.log.Info("joined: acting on the raft log from this member's join on", "epoch", epoch)
}

// notCaughtUp says why the node does not act on its log yet (caughtUp),
// as "replaying …", "waiting …" or "joining …"; "" once it does.
func (n *Node) notCaughtUp() string {
	st := n.fsm.State()
	switch e := n.joinEpoch.Load(); {
	case n.applied() < n.startIndex && !n.leaderKnown():
		// Raft applies the log it restarted with only once a leader has
		// confirmed it: with none in sight nothing is being replayed (a
		// member cut off, or one removed while it was away, which finds
		// that out: leftWhileAway). Was: "replaying its raft log (0 of
		// 50)" for as long as that lasted.
		return fmt.Sprintf("waiting for a raft leader to confirm the log it restarted with (none has reached it; %d of %d applied)", n.applied(), n.startIndex)
	case n.applied() < n.startIndex:
		return fmt.Sprintf("replaying its raft log (%d of %d)", n.applied(), n.startIndex)
	case e == joinPending && n.seeding.Load():
		return "seeding: asking the other members of its --join list whether a cluster exists before it bootstraps one"
	case e == joinPending:
		return "joining: waiting for the answer to its join"
	case st.MembershipIndex < e:
		return fmt.Sprintf("replaying the raft log up to its own join (epoch %d of %d)", st.MembershipIndex, e)
	}
	return ""
}

// refresh builds the view of the current FSM state, carries out the
// partition moves it implies, and publishes it. Only watchLoop calls it.
func (n *Node) refresh() {
	st := n.fsm.State()
	if !st.Initialized || !n.caughtUpTo(st) {
		return
	}
	old := n.snap.Load()
	var prev *view.View
	if old != nil {
		prev = old.v
	}
	next, err := NextView(prev, st)
	if err != nil {
		n.log.Error("cannot build the ring; keeping the previous one", "epoch", st.MembershipIndex, "err", err)
		return
	}
	o := n.owner.Load()
	bucketsLost := false // this start found a bucket file it could not load
	if o == nil {
		if o, err = NewOwner(n.cfg.ID, st.Config.Partitions, n.now, n.log); err != nil {
			n.log.Error("cannot build the bucket table", "err", err)
			return
		}
		o.SetMaxKeys(n.cfg.MaxKeys)
		if k, err := o.loadBuckets(n.cfg.DataDir); err != nil {
			n.savedState.Store(false) // its partitions' backups hold what they can (needsRecovery)
			bucketsLost = true
			n.log.Error("bucket state of the last stop not loaded; those keys start fresh", "err", err)
		} else if k > 0 {
			n.log.Info("bucket state of the last stop loaded", "partitions", k)
		}
		n.owner.Store(o)
	}
	if prev == nil || prev.Ring != next.Ring {
		var prevRing *ring.Ring
		if prev != nil {
			prevRing = prev.Ring
			for _, m := range prevRing.Members() {
				if _, in := next.Ring.Member(m.ID); !in {
					now := time.Now()
					n.memberGone.Store(&now)
					break
				}
			}
		}
		alive := func(id string) bool { m, ok := st.Member(id); return !ok || m.State != fsm.Dead }
		restarted := n.raft.hasState && prev == nil && len(st.Active()) > 1
		// flapped: a member's membership changed since prev (marked down
		// or dead and back, or readdressed), which this process may have
		// seen only the two ends of.
		flapped := func(id string) bool { m, ok := st.Member(id); return ok && prev != nil && m.Since > prev.Epoch() }
		moves := PlanMoves(prevRing, next.Ring, n.cfg.ID, alive, restarted, flapped(n.cfg.ID))
		if restarted && n.savedState.Load() {
			moves.resume(o.loaded)
		}
		o.AwaitCopies(&moves, next.Ring)
		forwards := o.ForwardBackups(next, PlanBackupForwards(prevRing, next.Ring, n.cfg.ID, flapped))
		copyPlan, kept := keepCopies(o, prevRing, next, &moves)
		o.EnableLease(len(next.Ring.Members()) > 1)
		sent := n.h.announce(next.Epoch(), handoffTargets(next.Ring, moves.Lost))
		out := append(o.Apply(next, moves), forwards...)
		if bucketsLost && len(next.Ring.Members()) == 1 {
			// Alone in its ring, nobody holds a copy of what the file
			// held: every partition it serves starts from nothing, and
			// says so where an alert looks (RinglimitBudgetsReset; it
			// counted none here). In a ring of several, hand-offs and
			// backups decide, and count what they cannot serve.
			o.servedBare.Add(uint64(len(next.Ring.PartitionsOf(n.cfg.ID))))
		}
		out = append(out, o.handOffLoaded(next)...)
		if away := o.takeLoadedAway(); len(away) > 0 {
			n.h.dropLoadedLater(away)
		}
		n.h.send(next.Epoch(), out)
		sent()
		n.sendCopies(next.Epoch(), copyPlan, kept)
		if awaiting := moves.awaiting(); len(awaiting) > 0 {
			n.h.expireLater(next.Epoch(), awaiting)
		}
		if copies := moves.awaitingCopies(); len(copies) > 0 {
			n.h.expireCopiesLater(next.Epoch(), copies)
		}
		if prev != nil {
			n.log.Info("ring changed", "epoch", next.Epoch(), "members", len(next.Ring.Members()),
				"gained", len(moves.Gained), "lost", len(moves.Lost), "owned", len(next.Ring.PartitionsOf(n.cfg.ID)))
		}
	} else {
		o.Publish(next)
	}
	n.snap.Store(&snapshot{v: next, st: st})
	// The router first: a write waits on n.cell (read your writes), so
	// once it sees the view every front door of this node uses it.
	if n.cfg.OnView != nil {
		n.cfg.OnView(next)
	}
	n.cell.Store(next)
	// Removed: listed in the last view, or (a member that joined with no
	// Raft state, before its first) at its join, and not now.
	before := st
	if old != nil {
		before = old.st
	}
	if _, member := st.Member(n.cfg.ID); !member && n.sawSelf(before) {
		n.noteRemoved("this member was removed from the cluster", true)
	} else if old == nil {
		n.leftBeforeRestart()
	}
}

// keepCopies plans the backup copies member o may have to pass on as
// the ring goes from prev to next (PlanCopyForwards, and the copies it
// kept from earlier rings: Reserves), and keeps them through Apply of m
// (KeepCopies), which it returns.
func keepCopies(o *Owner, prev *ring.Ring, next *view.View, m *Moves) (plan map[uint32]ring.Member, kept []uint32) {
	plan = PlanCopyForwards(prev, next.Ring, o.self)
	for p, was := range o.Reserves(next.Ring) {
		if _, ok := plan[p]; !ok {
			if plan == nil {
				plan = map[uint32]ring.Member{}
			}
			plan[p] = was
		}
	}
	return plan, o.KeepCopies(next.Epoch(), m, plan, next.Ring)
}

// noteRemoved is this member's exit from the cluster: once, it logs why,
// hands off what it held (bounded) and calls OnRemoved.
//
// inRaft says this member may still be a Raft voter (its log shows its
// removal from the ring, which a leave makes before the Raft removal): it
// then stays until it is out of Raft's configuration (awaitOutOfRaft).
func (n *Node) noteRemoved(why string, inRaft bool) {
	if !n.removed.CompareAndSwap(false, true) {
		return
	}
	n.log.Info(why)
	go func() {
		// Hand off what we held before going: long enough for a ring
		// that marks a dead target dead, and names the next owner.
		ctx, cancel := context.WithTimeout(n.ctx, max(10*time.Second, n.cfg.DeadAfter+5*time.Second))
		_ = n.waitHandoffsRemoved(ctx)
		cancel()
		close(n.removedWaited)
		if n.cfg.OnRemoved == nil {
			return
		}
		if inRaft {
			n.awaitOutOfRaft()
		}
		n.cfg.OnRemoved()
	}()
}

// removedRaftWait bounds awaitOutOfRaft: past the next leader's removal
// of an orphan voter (orphanVoterGrace).
func (n *Node) removedRaftWait() time.Duration {
	return max(15*time.Second, orphanVoterGrace(n.cfg.DeadAfter)+5*time.Second)
}

// awaitOutOfRaft waits, at most removedRaftWait, until this member, removed
// from the cluster, is no voter of Raft's configuration as its log has it:
// the second half of its leave (leaveTail), or, when the leader that ran
// it went away in between, the next leader's removal of the orphan
// (removeOrphansLater). A voter that exits first still counts toward
// Raft's quorum and never answers: the next leader needs its vote to
// commit that very removal when another voter is down.
//
// The leader sends a server it removes one last append; when that is
// lost (a replication stream that stopped at the removal, seen in 1 of
// ~240 leaves in the harness), this member hears from no leader again
// and campaigns in vain until the bound. So once no leader has reached
// it for leftWhileAwayAfter, every Raft timeout it asks the others
// (viewsOfOthers), and stops once the leader itself answers that its
// Raft configuration no longer lists it (outOfLeadersRaft).
func (n *Node) awaitOutOfRaft() {
	t := time.NewTicker(n.cfg.RaftTimeout)
	defer t.Stop()
	wait := n.removedRaftWait()
	end := time.NewTimer(wait)
	defer end.Stop()
	reader, _ := n.cfg.Forward.(ClusterReader)
	var leaderless time.Time // since when no leader has reached this member; zero while one does
	for n.raftVoter() {
		switch {
		case n.leaderKnown():
			leaderless = time.Time{}
		case leaderless.IsZero():
			leaderless = time.Now()
		case reader != nil && time.Since(leaderless) >= n.leftWhileAwayAfter() && n.outOfLeadersRaft(reader):
			n.log.Info("removed from the cluster: the Raft leader's configuration no longer lists this member, though the last append of its removal never reached it; stopping")
			return
		}
		select {
		case <-t.C:
		case <-end.C:
			n.log.Warn("removed from the cluster but still a raft voter; stopping all the same", "waited", wait.String())
			return
		case <-n.ctx.Done():
			return
		}
	}
}

// raftVoter reports whether this member votes in Raft's configuration as
// its log has it.
func (n *Node) raftVoter() bool {
	cf := n.raft.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == n.cfg.ID {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// HandleBatch is the owner's: it decides the checks of partitions this
// member owns (the data plane's handler and the router's local path).
func (n *Node) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	o := n.owner.Load()
	if o == nil && n.cell.Await(ctx, req.Epoch, 0, epochWait) != nil {
		o = n.owner.Load()
	}
	if o == nil {
		for i := range resp.Results {
			resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
		}
		return
	}
	o.HandleBatch(ctx, req, resp)
}

var _ transport.PromptHandler = (*Node)(nil)

// Prompt is the owner's (transport.PromptHandler): whether HandleBatch
// would decide req without waiting.
func (n *Node) Prompt(req *transport.BatchRequest) bool {
	o := n.owner.Load()
	return o != nil && o.Prompt(req)
}

// HandlePush is the owner's: hand-offs and backup copies from other
// members. A ping is answered with this member's ring epoch when it
// grants the sender a lease (grantsLease), and with transport.NoLease
// otherwise.
func (n *Node) HandlePush(ctx context.Context, push *transport.Push, ack *transport.PushAck) {
	o := n.owner.Load()
	if o == nil && n.cell.Await(ctx, push.Epoch, 0, epochWait) != nil {
		o = n.owner.Load()
	}
	if o != nil {
		o.HandlePush(ctx, push, ack)
	}
	if push.Kind == transport.PushPing && n.isLeader() {
		rules, says := push.SaidRulesVersion()
		n.noteLeaseRequest(push.From, push.Epoch, says, rules, time.Now())
	}
	if push.Kind == transport.PushPing && !n.grantsLease(push.From, time.Now()) {
		// The sender may be asking for its lease: a probe's answer is
		// only heard, never read (detectLoop).
		ack.Epoch = transport.NoLease
	}
}

// noteLeaseRequest records, on this leader, a lease request from member id
// whose ring was at epoch and, when it says them, whose rules were at
// rulesVersion: behind when its ring is older than this node's (a member
// behind takes no lease from the answer: askLease), or its rules older
// than the newest version this node has had for rulesGrace (it decides
// checks of newer rules degraded: its Raft log cannot grow), else
// current, which clears it. Only members the detector pings count.
func (n *Node) noteLeaseRequest(id string, epoch uint64, saysRules bool, rulesVersion uint64, now time.Time) {
	snap := n.snap.Load()
	if snap == nil {
		return
	}
	settled := n.behind.settledRules(snap.v.RulesVersion, now, rulesGrace(n.cfg.DeadAfter))
	if m, ok := snap.st.Member(id); ok && pinged(m) {
		n.behind.note(id, epoch < snap.v.Epoch() || saysRules && rulesVersion < settled, now)
	}
}

// rulesGrace is how long after this leader applied a rules version a
// member's lease request may still say an older one without counting as
// behind: DeadAfter/4. A member applies a write within milliseconds, but
// rules written more often than this would otherwise keep a member on a
// slow link behind at every request.
func rulesGrace(deadAfter time.Duration) time.Duration { return deadAfter / 4 }

// sweepLoop drops dead bucket states, a slice of partitions per tick, so
// memory tracks active keys.
func (n *Node) sweepLoop() {
	next := uint32(0)
	n.everyTick(100*time.Millisecond, func(o *Owner) {
		o.RefreshFull()
		parts := uint32(o.Partitions())
		step := max(parts/50, 1) // a full pass every ~5s
		for range step {
			o.Sweep(next % parts)
			next = (next + 1) % parts
		}
	})
}

// everyTick calls f with the owner every d until the node stops; ticks
// before the owner exists are skipped.
func (n *Node) everyTick(d time.Duration, f func(o *Owner)) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
		}
		if o := n.owner.Load(); o != nil {
			f(o)
		}
	}
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	return binary.LittleEndian.Uint64(b[:])
}

// chanLock is a mutex made of a one-slot channel.
type chanLock chan struct{}

func (l chanLock) lock()   { l <- struct{}{} }
func (l chanLock) unlock() { <-l }

// lockCtx takes the lock, or returns ctx's error when ctx ends first
// (or has ended: it then does not take the lock even if it is free).
func (l chanLock) lockCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
