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
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
)

// Forwarder carries writes to the leader's HTTP API when this node is not
// the leader. The HTTP client that implements it lives above this package.
type Forwarder interface {
	Join(ctx context.Context, leaderHTTP string, req api.JoinRequest) error
	Leave(ctx context.Context, leaderHTTP, id string) error
	SetState(ctx context.Context, leaderHTTP, id, state string) error
	PutRules(ctx context.Context, leaderHTTP string, written []limiter.Rule) ([]limiter.Rule, error)
}

// Config configures a Node.
type Config struct {
	ID            string // unique member id, also the Raft server id
	HTTPAddr      string // advertised HTTP API address, host:port
	RaftAdvertise string // advertised Raft address, host:port
	PeerAddr      string // advertised data-plane address, host:port
	DataDir       string
	// Join is the HTTP address of any member, used to join when DataDir
	// holds no cluster state. Empty with an empty DataDir bootstraps a
	// new cluster.
	Join string
	// Ring is the partitioning a bootstrapping node writes into the
	// cluster; joining nodes take the cluster's.
	Ring ring.Config
	// RaftTimeout is Raft's heartbeat and election timeout (1s).
	RaftTimeout time.Duration
	Forward     Forwarder
	Logger      *slog.Logger
	LogOutput   io.Writer // raft's own log lines; nil discards them
	Registerer  prometheus.Registerer
	// Now is the clock of the buckets, in Unix nanoseconds. The default
	// is the wall clock at start advanced by the monotonic clock, so it
	// never jumps.
	Now func() int64
	// OnView is called with every new view (from one goroutine).
	OnView func(*View)
	// OnRemoved is called once when this member is removed from the
	// cluster (ringlimit leave).
	OnRemoved func()
}

// Validate checks the fields without changing them.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("node: id is empty")
	case c.HTTPAddr == "" || c.RaftAdvertise == "" || c.PeerAddr == "":
		return errors.New("node: http, raft and peer addresses are required")
	case c.DataDir == "":
		return errors.New("node: data dir is empty")
	case c.Forward == nil:
		return errors.New("node: forwarder is nil")
	}
	return c.Ring.Validate()
}

// View is an immutable snapshot of the cluster as this node sees it.
type View struct {
	State *fsm.State
	Ring  *ring.Ring
	Self  string
	Seed  uint64
	Rules map[string]*limiter.Rule // the rules in force, by name
	List  []limiter.Rule           // the same, default first

	salts map[string]uint64
}

// Node is a running cluster member. Create it with Open; stop it with Close.
type Node struct {
	cfg   Config
	log   *slog.Logger
	fsm   *fsm.FSM
	raft  *raftParts
	table atomic.Pointer[limiter.Table]
	view  atomic.Pointer[View]
	now   func() int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	removed atomic.Bool
	// startIndex is Raft's last log index when the node started: until
	// the FSM has applied that far it still shows an old state (rules
	// from before a restart, say) and the node is not ready.
	startIndex uint64
	stopping   atomic.Bool // marked down for a graceful stop: do not re-register
	joinedMu   sync.Mutex  // serialises leader-side membership changes

	viewMu  sync.Mutex    // guards viewNew
	viewNew chan struct{} // closed when a new view is published
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
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), fsm: fsm.New(), now: cfg.Now, viewNew: make(chan struct{})}
	if n.now == nil {
		base := time.Now()
		n.now = func() int64 { return base.UnixNano() + int64(time.Since(base)) }
	}
	rp, err := openRaft(&n.cfg, n.fsm, raftLn)
	if err != nil {
		return nil, err
	}
	n.raft = rp
	n.startIndex = rp.raft.LastIndex()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if !rp.hasState && cfg.Join == "" {
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
	n.goLoop(n.watchLoop)
	n.goLoop(n.leaderLoop)
	n.goLoop(n.registerLoop)
	n.goLoop(n.sweepLoop)
	return n, nil
}

func (n *Node) goLoop(f func()) {
	n.wg.Add(1)
	go func() { defer n.wg.Done(); f() }()
}

// Close stops the member's loops and Raft. It does not leave the cluster.
func (n *Node) Close() error {
	n.cancel()
	err := n.raft.close()
	n.wg.Wait()
	return err
}

// ID returns the member id.
func (n *Node) ID() string { return n.cfg.ID }

// View returns the current view; nil until the cluster is initialised.
func (n *Node) View() *View { return n.view.Load() }

// Raft exposes the Raft instance (tests and status).
func (n *Node) Raft() *raft.Raft { return n.raft.raft }

// watchLoop turns every FSM change into a new view.
//
// While the log this node restarted with is being replayed no view is
// published at all: the FSM still holds an old state (rules from before
// a PUT, say), and "unavailable" is the honest answer until it catches
// up. Raft counts an entry as applied only after the FSM's notification,
// so a ticker re-checks until then.
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
		case <-replay.C:
			if !n.caughtUp() {
				continue
			}
			replay.Stop()
		}
		n.refresh()
	}
}

// caughtUp reports whether the FSM has applied the log the node started with.
func (n *Node) caughtUp() bool { return n.raft.raft.AppliedIndex() >= n.startIndex }

// refresh builds the view of the current FSM state and publishes it.
func (n *Node) refresh() {
	st := n.fsm.State()
	if !st.Initialized || !n.caughtUp() {
		return
	}
	old := n.view.Load()
	v := &View{State: st, Self: n.cfg.ID, Seed: st.Config.Seed}
	if old != nil && old.State.MembershipIndex == st.MembershipIndex && old.State.Config == st.Config {
		v.Ring = old.Ring
	} else {
		var members []ring.Member
		for _, m := range st.Active() {
			members = append(members, ring.Member{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer})
		}
		rc := ring.Config{Partitions: st.Config.Partitions, ReplicationFactor: st.Config.ReplicationFactor, Load: st.Config.Load}
		r, err := ring.New(rc, st.MembershipIndex, members)
		if err != nil {
			n.log.Error("cannot build the ring; keeping the previous one", "epoch", st.MembershipIndex, "err", err)
			return
		}
		v.Ring = r
		if old != nil {
			n.log.Info("ring changed", "epoch", r.Epoch(), "members", len(members), "moved", len(ring.Diff(old.Ring, r)), "owned", len(r.PartitionsOf(n.cfg.ID)))
		}
	}
	v.List = rules.Effective(st.Rules)
	v.Rules = make(map[string]*limiter.Rule, len(v.List))
	v.salts = make(map[string]uint64, len(v.List))
	for i := range v.List {
		r := &v.List[i]
		v.Rules[r.Name] = r
		v.salts[r.Name] = limiter.RuleSalt(v.Seed, r.Name, r.Algorithm)
	}
	if n.table.Load() == nil {
		t, err := limiter.NewTable(st.Config.Partitions)
		if err != nil {
			n.log.Error("cannot build the bucket table", "err", err)
			return
		}
		n.table.Store(t)
	}
	if old != nil {
		// Partitions this node no longer owns are forgotten: their keys
		// start fresh on the new owner (hand-off comes with failover).
		for _, mv := range ring.Diff(old.Ring, v.Ring) {
			if mv.From == n.cfg.ID {
				n.table.Load().Drop(mv.Partition)
			}
		}
	}
	n.view.Store(v)
	n.viewMu.Lock()
	close(n.viewNew)
	n.viewNew = make(chan struct{})
	n.viewMu.Unlock()
	if n.cfg.OnView != nil {
		n.cfg.OnView(v)
	}
	_, member := st.Member(n.cfg.ID)
	if old != nil && !member {
		if _, was := old.State.Member(n.cfg.ID); was && n.removed.CompareAndSwap(false, true) {
			n.log.Info("this member was removed from the cluster")
			if n.cfg.OnRemoved != nil {
				go n.cfg.OnRemoved()
			}
		}
	}
}

// HandleBatch decides the checks of partitions this node owns; it is the
// data plane's handler and the router's local path.
//
// A sender whose ring is newer than ours is usually right: the change is
// on its way through Raft to us. We wait for it (bounded by ctx and
// epochWait) rather than answer from a stale ring.
func (n *Node) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	v := n.view.Load()
	if v == nil || req.Epoch > v.Ring.Epoch() {
		// A new member is sent checks as soon as the ring names it,
		// possibly before the log has reached it.
		v = n.awaitEpoch(ctx, req.Epoch)
	}
	t := n.table.Load()
	if v == nil || t == nil {
		for i := range resp.Results {
			resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
		}
		return
	}
	resp.Epoch = v.Ring.Epoch()
	now := n.now()
	for i := range req.Checks {
		c := &req.Checks[i]
		resp.Results[i] = n.decide(v, t, c, now)
	}
}

func (n *Node) decide(v *View, t *limiter.Table, c *transport.Check, now int64) transport.Result {
	owner, ok := v.Ring.Owner(c.Partition)
	if !ok || owner.ID != n.cfg.ID {
		return transport.Result{Status: transport.StatusNotOwner}
	}
	if v.Ring.Partition(c.KeyHash) != c.Partition {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	rule := v.Rules[c.Rule]
	if rule == nil {
		return transport.Result{Status: transport.StatusUnknownRule}
	}
	if c.Cost > uint64(rule.Capacity()) {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	d, err := t.Check(c.Partition, limiter.BucketHash(c.KeyHash, v.salts[c.Rule]), rule, now, int64(c.Cost))
	if err != nil {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	return transport.Result{Status: transport.StatusOK, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter, Delay: d.Delay}
}

// epochWait bounds how long a check waits for this node's ring to reach
// the sender's epoch.
const epochWait = 200 * time.Millisecond

// awaitEpoch waits until the view's epoch is at least epoch, ctx is done
// or epochWait passes, and returns the view then current.
func (n *Node) awaitEpoch(ctx context.Context, epoch uint64) *View {
	t := time.NewTimer(epochWait)
	defer t.Stop()
	for {
		n.viewMu.Lock()
		ch := n.viewNew
		n.viewMu.Unlock()
		v := n.view.Load()
		if v != nil && v.Ring.Epoch() >= epoch {
			return v
		}
		select {
		case <-ch:
		case <-t.C:
			return v
		case <-ctx.Done():
			return v
		}
	}
}

// sweepLoop drops dead bucket states, a slice of partitions per tick, so
// memory tracks active keys.
func (n *Node) sweepLoop() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	next := uint32(0)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
		}
		t := n.table.Load()
		if t == nil {
			continue
		}
		parts := uint32(t.Partitions())
		step := max(parts/50, 1) // a full pass every ~5s
		now := n.now()
		for range step {
			t.Sweep(next%parts, now)
			next = (next + 1) % parts
		}
	}
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	return binary.LittleEndian.Uint64(b[:])
}
