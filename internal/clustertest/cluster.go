// Package clustertest runs whole ringlimit clusters in one process, for
// deterministic tests of what the cluster does: members on Raft's
// in-memory transport and stores, an in-memory data plane, and an
// in-memory leader client, all inside a testing/synctest bubble, so
// elections, failure detection and hand-offs run in virtual time.
//
// A test calls New inside synctest.Test, then drives the cluster with
// Crash, Restart, Stop, Join, Leave, Partition, Heal and SetLink, and
// waits for conditions with WaitFor (woken by view changes and Raft
// leadership changes, never by wall-clock polling).
//
// Model of faults: Crash is a process that vanishes (its Raft and its
// memory are gone, its stores survive for Restart); Stop is SIGTERM
// (drain, hand off, stop); Partition cuts links both ways on Raft and
// the data plane (calls over a cut link hang until their deadline, as
// dropped packets do); SetLink adds a per-direction delay on the data
// plane or cuts one direction; CutRaft cuts Raft alone; StallDisk hangs
// a member's Raft log writes (OnStore sees them first, to stall the one
// that matters).
package clustertest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

// Options tune a cluster; zero fields take the defaults below.
type Options struct {
	Partitions  int           // 64
	RaftTimeout time.Duration // 200ms
	DeadAfter   time.Duration // 2s
	// BackupInterval is every member's node.Config.BackupInterval (the
	// node's default, 20ms).
	BackupInterval time.Duration
	// RouterTimeout is how long a member's router waits for an owner (250ms).
	RouterTimeout time.Duration
	// Prober, when set, is every member's node.Prober: joining members
	// then start as non-voters and are promoted once it says they caught
	// up, as over real TCP. Without one they join as voters at once.
	Prober node.Prober
	// DataDirs gives every member a data dir of its own (a test's
	// temporary dir, kept over restarts) for what a node keeps in one
	// besides Raft: the rules file's marker, the bucket file of a stop.
	// Without it members have none.
	DataDirs bool
	// ProbeLinks gives every member a Prober that reaches addresses
	// through the links, as the default one dials them over TCP: a member
	// the leader cannot reach is not let back in after it is marked dead
	// (joining members start as non-voters, promoted at once). Prober
	// wins when both are set.
	ProbeLinks bool
	// Logs, when set, takes every member's log lines (JSON, debug level
	// and up, each naming its member as "node"), for a test to read back
	// with logbuf.Parse. CLUSTERTEST_LOG still writes them to stderr too.
	Logs *logbuf.Buffer
	// OnForward, when set, is called as member from forwards a write
	// (op: "leave", "join" and so on) to the leader, before it is
	// delivered; it may block to hold the write back.
	OnForward func(from, op string)
	// OnView, when set, sees every view a member publishes, as it does
	// (from the member's goroutine: keep it short).
	OnView func(member string, v *router.View)
	// OnStore, when set, sees the entries member's Raft is about to write
	// to its log, before a stalled disk holds the write (so it may call
	// StallDisk for these very entries). It runs on Raft's goroutine:
	// keep it short.
	OnStore func(member string, logs []*raft.Log)
	// StepAppends makes every member's Raft take a leader's
	// AppendEntries call of several entries one entry at a time, with
	// everything the member does between two entries done before the
	// next (see stepTransport): a member catching up on the log passes
	// through every state of it, as though the leader's batches ended
	// between any two entries.
	StepAppends bool
	// GuardRaft has every member refuse Raft calls from senders outside
	// its Raft configuration, as the TCP transport's guard does
	// (node.AllowRPC); without it a stranger's AppendEntries of a higher
	// term overwrite a member's log, which over TCP they do not.
	GuardRaft bool
	// JoinList, when set, is the --join list of the members it names
	// (ids; deploy/compose gives all of them n1:8080,n2:8080,n3:8080):
	// each is given the list's other members' HTTP addresses, and the
	// first is the seed (node.Config.Seed). Members not in it join
	// through the first member created, as without it.
	JoinList []string
	// JoinAnswer, when set, is what member from gets for a join it
	// asked of another member (its own registration, or one it forwards
	// to the leader), given what that member answered: a test can lose
	// the answer (an error) or drop its epoch (0, as a member older than
	// the epoch answers).
	JoinAnswer func(from string, epoch uint64, err error) (uint64, error)
	// MaxFrame is the largest data-plane frame (transport.Limits'
	// MaxFrameSize; transport.DefaultMaxFrameSize): a push whose frame is
	// larger fails with a *transport.FrameTooLargeError, as the real
	// client's does, before anything is sent. Every member is told
	// (node.Config.MaxPushFrame). A small one lets a test push more than
	// fits in a frame without 16 MiB of state; SetMaxFrame changes it.
	MaxFrame int
}

// Cluster is N members in one process. Create it with New.
type Cluster struct {
	t    testing.TB
	opts Options
	net  *network

	mu      sync.Mutex
	changed chan struct{}      // closed at every view or leader change; guarded by mu
	order   []string           // member ids in creation order; guarded by mu
	httpCut map[[2]string]bool // (from, to) → HTTP calls dropped (CutHTTP); guarded by mu
}

// Member is one cluster member and its stores.
type Member struct {
	ID string
	c  *Cluster

	logs, stable *raft.InmemStore
	snaps        *raft.InmemSnapshotStore

	mu     sync.Mutex
	n      *node.Node     // guarded by mu
	rt     *router.Router // guarded by mu
	trans  *raft.InmemTransport
	cancel context.CancelFunc
	up     atomic.Bool
	disk   atomic.Pointer[chan struct{}] // closed when a stalled disk resumes; nil: not stalled
	joined bool                          // started with a join (not the bootstrapper)
	dir    string                        // its data dir (Options.DataDirs), kept over restarts
	gen    int                           // address generation: RestartAt moves the member
	// stopped is closed once the process started last has wholly
	// stopped (kill has returned: its running flag drops first); guarded
	// by mu, nil before the first start.
	stopped chan struct{}
	// left is the error the process started last stopped with because
	// it learnt that it had left the cluster while it was away
	// (node.Config.OnLeft); guarded by mu, nil until then.
	left error
}

// Left returns the error the member's last process stopped with because
// it learnt that it had left the cluster while it was away (as serve
// exits 1 with it), or nil.
func (m *Member) Left() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.left
}

// awaitStopped waits until the member's last process has wholly
// stopped. A process that stops itself (OnRemoved) is not running as
// soon as its kill begins; a process started again before that kill
// returned had its Raft links cut by the kill's relink, which reads who
// runs before it cuts.
func (m *Member) awaitStopped() {
	m.mu.Lock()
	stopped := m.stopped
	m.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}

func (m *Member) running() bool { return m.up.Load() }

// Node is the member's current node (a new one after each Restart).
func (m *Member) Node() *node.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

func (m *Member) node() *node.Node { return m.Node() }

// Router is the member's current router.
func (m *Member) Router() *router.Router {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rt
}

// Running reports whether the member's process is up.
func (m *Member) Running() bool { return m.running() }

// New starts n members n1…nN, the first bootstrapping, the others joining
// through it, and waits until every member is ready in one ring. It must
// be called inside a synctest bubble; everything is stopped at cleanup.
func New(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := newCluster(t, opts)
	for i := range n {
		c.add(fmt.Sprintf("n%d", i+1), i > 0)
		if i == 0 {
			c.WaitFor("n1 leads", 10*time.Second, func() bool { return c.Member("n1").Node().Ready() == nil })
		}
	}
	c.WaitSettled(n)
	return c
}

// NewTogether starts n members n1…nN at once, as README's cluster on one
// machine is started (`&`): the first bootstraps, the others ask it to
// join while it is still electing itself and registering (their joins
// are retried until it answers). It waits until every member is ready in
// one ring. It must be called inside a synctest bubble.
func NewTogether(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := newCluster(t, opts)
	for i := range n {
		c.add(fmt.Sprintf("n%d", i+1), i > 0)
	}
	c.WaitSettled(n)
	return c
}

// newCluster is a cluster of no members yet, stopped at cleanup.
func newCluster(t testing.TB, opts Options) *Cluster {
	if opts.Partitions == 0 {
		opts.Partitions = 64
	}
	if opts.RaftTimeout == 0 {
		opts.RaftTimeout = 200 * time.Millisecond
	}
	if opts.DeadAfter == 0 {
		opts.DeadAfter = 2 * time.Second
	}
	if opts.RouterTimeout == 0 {
		opts.RouterTimeout = 250 * time.Millisecond
	}
	if opts.MaxFrame == 0 {
		opts.MaxFrame = transport.DefaultMaxFrameSize
	}
	c := &Cluster{t: t, opts: opts, net: newNetwork(), changed: make(chan struct{}), httpCut: map[[2]string]bool{}}
	c.net.log = c.logger()
	c.net.maxFrame = opts.MaxFrame
	t.Cleanup(c.close)
	return c
}

// SetMaxFrame makes n the data plane's largest frame (Options.MaxFrame)
// from now on, for the pushes of members started after it and of those
// running, which were told another.
func (c *Cluster) SetMaxFrame(n int) {
	c.net.mu.Lock()
	c.net.maxFrame = n
	c.net.mu.Unlock()
}

// Join starts a new member that joins the cluster, and waits until every
// running member sees it active.
func (c *Cluster) Join(id string) *Member {
	n := c.ringSize() + 1
	m := c.add(id, true)
	c.WaitSettled(n)
	return m
}

// StartJoin starts a new member that joins the cluster, and returns at
// once: the cluster may not settle (a member crashes while the joiner
// awaits its hand-offs).
func (c *Cluster) StartJoin(id string) *Member { return c.add(id, true) }

func (c *Cluster) add(id string, join bool) *Member {
	m := &Member{ID: id, c: c, logs: raft.NewInmemStore(), stable: raft.NewInmemStore(), snaps: raft.NewInmemSnapshotStore(), joined: join}
	if c.opts.DataDirs {
		m.dir = c.t.TempDir()
	}
	c.net.mu.Lock()
	c.net.members[id] = m
	c.net.byPeer[m.peerAddr()] = id
	c.net.byHTTP[m.httpAddr()] = id
	c.net.mu.Unlock()
	c.mu.Lock()
	c.order = append(c.order, id)
	c.mu.Unlock()
	c.start(m)
	return m
}

// Addresses of a member: its id and its generation (RestartAt moves it).
func (m *Member) peerAddr() string { return fmt.Sprintf("peer-%s.%d:1", m.ID, m.gen) }
func (m *Member) httpAddr() string { return fmt.Sprintf("http-%s.%d:1", m.ID, m.gen) }
func (m *Member) raftAddr() string { return fmt.Sprintf("raft-%s.%d:1", m.ID, m.gen) }

// start runs m's process: a node over its stores and a router.
func (c *Cluster) start(m *Member) {
	c.t.Helper()
	_, trans := raft.NewInmemTransport(raft.ServerAddress(m.raftAddr()))
	var join []string
	seed := false
	if ids := c.opts.JoinList; slices.Contains(ids, m.ID) {
		seed = ids[0] == m.ID
		for _, id := range ids {
			if id != m.ID {
				join = append(join, c.listedHTTP(id))
			}
		}
	} else if m.joined {
		join = []string{c.Member(c.ids()[0]).httpAddr()}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var raftTrans raft.Transport = trans
	if c.opts.StepAppends {
		raftTrans = stepAppends(ctx, trans)
	}
	if c.opts.GuardRaft {
		var started atomic.Pointer[raft.Raft]
		defer func() {
			if n := m.Node(); n != nil {
				started.Store(n.Raft())
			}
		}()
		raftTrans = guardRaft(ctx, raftTrans, func() (raft.Configuration, bool) {
			if r := started.Load(); r != nil {
				return r.GetConfiguration().Configuration(), true
			}
			return raft.Configuration{}, false
		})
	}
	local := localHandler{id: m.ID, log: c.net.log}
	rt, err := router.New(router.Config{Self: m.ID, Timeout: c.opts.RouterTimeout, Linger: 50 * time.Microsecond}, &local, endpoint{c.net, m.ID})
	if err != nil {
		c.t.Fatal(err)
	}
	n, err := node.Open(node.Config{
		ID: m.ID, HTTPAddr: m.httpAddr(), RaftAdvertise: m.raftAddr(), PeerAddr: m.peerAddr(),
		Join: join, Seed: seed, Ring: ring.Config{Partitions: c.opts.Partitions, ReplicationFactor: 32, Load: 1.25},
		RaftTimeout:   c.opts.RaftTimeout,
		RaftTransport: raftTrans, LogStore: stallingLog{m.logs, m}, StableStore: m.stable, SnapshotStore: m.snaps,
		DataPlane: endpoint{c.net, m.ID}, DeadAfter: c.opts.DeadAfter, DataDir: m.dir,
		BackupInterval: c.opts.BackupInterval,
		MaxPushFrame:   c.net.frameLimit(),
		Forward:        forwarder{c, m.ID},
		Prober:         c.prober(m.ID),
		Logger:         c.logger(),
		OnView: func(v *router.View) {
			rt.SetView(v)
			if c.opts.OnView != nil {
				c.opts.OnView(m.ID, v)
			}
			c.notify()
		},
		// As serve does on Removed: a graceful stop bounded by the
		// default --drain-timeout, then the process ends.
		OnRemoved: func() {
			go c.stopRemoved(m)
		},
		OnLeft: func(err error) {
			m.mu.Lock()
			m.left = err
			m.mu.Unlock()
			go c.kill(m, false)
		},
	}, nil)
	if err != nil {
		cancel()
		c.t.Fatalf("open %s: %v", m.ID, err)
	}
	local.n = n
	m.mu.Lock()
	m.n, m.rt, m.trans, m.cancel, m.stopped, m.left = n, rt, trans, cancel, make(chan struct{}), nil
	m.mu.Unlock()
	m.up.Store(true)
	c.relink()
	// Leadership changes wake WaitFor too.
	obsCh := make(chan raft.Observation, 16)
	obs := raft.NewObserver(obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.Raft().RegisterObserver(obs)
	go func() {
		defer n.Raft().DeregisterObserver(obs)
		for {
			select {
			case <-ctx.Done():
				return
			case <-obsCh:
				c.notify()
			}
		}
	}()
}

// localHandler lets the router be built before the node it calls.
type localHandler struct {
	n   *node.Node
	id  string
	log *slog.Logger // see logDecided
}

func (l *localHandler) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	l.n.HandleBatch(ctx, req, resp)
	logDecided(l.log, l.id, req, resp)
}

func (l *localHandler) Prompt(req *transport.BatchRequest) bool { return l.n.Prompt(req) }

// logger writes the members' logs to Options.Logs when set, and to
// stderr when CLUSTERTEST_LOG is; nil (discarded) when neither.
func (c *Cluster) logger() *slog.Logger {
	debug := &slog.HandlerOptions{Level: slog.LevelDebug}
	var hs []slog.Handler
	if c.opts.Logs != nil {
		hs = append(hs, slog.NewJSONHandler(c.opts.Logs, debug))
	}
	if os.Getenv("CLUSTERTEST_LOG") != "" {
		hs = append(hs, slog.NewTextHandler(os.Stderr, debug))
	}
	if len(hs) == 0 {
		return nil
	}
	return slog.New(slog.NewMultiHandler(hs...))
}

func (c *Cluster) notify() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// WaitFor waits until cond holds, re-evaluating it whenever a member's
// view or Raft leadership changes (and at least every 100ms of virtual
// time, for conditions those do not signal); it fails the test when
// timeout of virtual time passes first.
func (c *Cluster) WaitFor(what string, timeout time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if cond() {
			return
		}
		tick := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			c.t.Fatalf("clustertest: %s: not within %v", what, timeout)
		}
		tick.Stop()
	}
}

// WaitSettled waits until every running member is ready and sees the
// same ring of n active members at one epoch. When it fails it logs what
// each member sees and why it is not ready.
func (c *Cluster) WaitSettled(n int) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			for _, m := range c.Members() {
				if !m.running() {
					continue
				}
				if v := m.Node().View(); v != nil {
					c.t.Logf("clustertest: %s: epoch %d, ring of %d, ready: %v", m.ID, v.Epoch(), len(v.Ring.Members()), m.Node().Ready())
				} else {
					c.t.Logf("clustertest: %s: no view yet", m.ID)
				}
			}
		}
	}()
	c.WaitFor(fmt.Sprintf("%d members settled", n), 30*time.Second, func() bool {
		var epoch uint64
		first := true
		for _, m := range c.Members() {
			if !m.running() {
				continue
			}
			nd := m.Node()
			v := nd.View()
			if v == nil || nd.Ready() != nil || len(v.Ring.Members()) != n {
				return false
			}
			if !first && v.Epoch() != epoch {
				return false
			}
			epoch, first = v.Epoch(), false
		}
		return !first
	})
}

// Members lists the members in creation order.
func (c *Cluster) Members() []*Member {
	var out []*Member
	for _, id := range c.ids() {
		out = append(out, c.Member(id))
	}
	return out
}

func (c *Cluster) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.order)
}

// ringSize is the number of active members in a running member's view.
func (c *Cluster) ringSize() int {
	for _, m := range c.Members() {
		if m.running() {
			if v := m.Node().View(); v != nil {
				return len(v.Ring.Members())
			}
		}
	}
	return 0
}

// Member returns the member with id, or nil.
func (c *Cluster) Member(id string) *Member {
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	return c.net.members[id]
}

// Leader returns the member that leads, or nil.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members() {
		if m.running() && m.Node().Raft().State() == raft.Leader {
			return m
		}
	}
	return nil
}

// Crash stops member id at once, as SIGKILL would: nothing is handed off,
// nobody is told. Its stores survive for Restart.
func (c *Cluster) Crash(id string) { c.kill(c.Member(id), false) }

// Stop stops member id gracefully, as SIGTERM does: it is marked down,
// hands its partitions off (bounded by drain), then stops.
func (c *Cluster) Stop(id string, drain time.Duration) {
	c.t.Helper()
	m := c.Member(id)
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := m.Node().StopGracefully(ctx); err != nil {
		c.t.Logf("clustertest: stopping %s: %v", id, err)
	}
	c.kill(m, false)
}

// removedDrain is serve's default --drain-timeout, which bounds the
// graceful stop of a member removed from the cluster (stopRemoved).
const removedDrain = 10 * time.Second

// stopRemoved stops m, removed from the cluster, as serve does once
// Removed is closed: StopGracefully bounded by removedDrain, then the
// process ends.
func (c *Cluster) stopRemoved(m *Member) {
	n := m.node()
	if n == nil || !m.running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), removedDrain)
	if err := n.StopGracefully(ctx); err != nil {
		if l := c.logger(); l != nil { // not t.Logf: the test may have ended meanwhile
			l.Info("clustertest: stopping a removed member", "member", m.ID, "err", err)
		}
	}
	cancel()
	c.kill(m, false)
}

func (c *Cluster) kill(m *Member, _ bool) {
	if !m.up.CompareAndSwap(true, false) {
		return
	}
	m.mu.Lock()
	n, rt, trans, cancel, stopped := m.n, m.rt, m.trans, m.cancel, m.stopped
	m.mu.Unlock()
	defer close(stopped)
	c.relink()
	cancel()
	rt.Close()
	_ = n.Close()
	_ = trans.Close()
	c.notify()
}

// stoppedMember returns member id once it has stopped; it fails the test
// when id is running (what: the step that needs it stopped).
func (c *Cluster) stoppedMember(id, what string) *Member {
	c.t.Helper()
	m := c.Member(id)
	if m.running() {
		c.t.Fatalf("clustertest: %s of %s, which is running", what, id)
	}
	m.awaitStopped()
	return m
}

// Restart starts member id again over the stores it had.
func (c *Cluster) Restart(id string) {
	c.t.Helper()
	m := c.stoppedMember(id, "restart")
	c.start(m)
}

// RestartAt starts member id again over its stores but at new addresses
// (HTTP, Raft and data plane), as a process restarted with other ports.
// Its old addresses stop answering.
func (c *Cluster) RestartAt(id string) {
	c.t.Helper()
	m := c.stoppedMember(id, "restart")
	c.net.mu.Lock()
	delete(c.net.byPeer, m.peerAddr())
	delete(c.net.byHTTP, m.httpAddr())
	m.gen++
	c.net.byPeer[m.peerAddr()] = id
	c.net.byHTTP[m.httpAddr()] = id
	c.net.mu.Unlock()
	c.start(m)
}

// Rejoin starts member id, which left (Leave), again as a new process
// under the same id over empty stores (a wiped data dir), joining the
// cluster; it does not wait for the join.
func (c *Cluster) Rejoin(id string) *Member {
	c.t.Helper()
	m := c.stoppedMember(id, "rejoin")
	m.logs, m.stable, m.snaps, m.joined = raft.NewInmemStore(), raft.NewInmemStore(), raft.NewInmemSnapshotStore(), true
	c.start(m)
	return m
}

// RestartWiped starts member id again, as the same id at the same
// addresses, over empty stores and an empty data dir: its volume was
// lost. It does not wait for anything.
func (c *Cluster) RestartWiped(id string) {
	c.t.Helper()
	m := c.stoppedMember(id, "restart")
	m.logs, m.stable, m.snaps = raft.NewInmemStore(), raft.NewInmemStore(), raft.NewInmemSnapshotStore()
	if c.opts.DataDirs {
		m.dir = c.t.TempDir()
	}
	c.start(m)
}

// listedHTTP is the HTTP address of member id as a --join list names
// it: where it is now, or where it will be once created.
func (c *Cluster) listedHTTP(id string) string {
	if m := c.Member(id); m != nil {
		return m.httpAddr()
	}
	return (&Member{ID: id}).httpAddr()
}

// Leave removes member id for good through the leader (ringlimit leave)
// and waits until its process has stopped.
func (c *Cluster) Leave(id string) {
	c.t.Helper()
	var via *Member
	for _, m := range c.Members() {
		if m.running() && m.ID != id {
			via = m
			break
		}
	}
	if err := via.Node().Leave(context.Background(), id); err != nil {
		c.t.Fatalf("clustertest: leave %s: %v", id, err)
	}
	c.WaitFor(id+" stopped after leaving", 30*time.Second, func() bool { return !c.Member(id).running() })
	c.Member(id).awaitStopped()
}

// Partition cuts every link between the given members and the others,
// both ways, on Raft and on the data plane.
func (c *Cluster) Partition(ids ...string) { c.cutBetween(ids, func(l *link) { l.cut = true }) }

// Heal restores every link (cuts and delays, CutHTTP's too).
func (c *Cluster) Heal() {
	c.net.mu.Lock()
	clear(c.net.links)
	c.net.mu.Unlock()
	c.mu.Lock()
	clear(c.httpCut)
	c.mu.Unlock()
	c.relink()
}

// CutHTTP drops the calls member from makes to member to's HTTP API
// (joins, leaves, state changes and rules writes, forwarded or not): they
// hang until their deadline, as over a path that drops packets. Raft and
// the data plane pass both ways. Heal restores it.
func (c *Cluster) CutHTTP(from, to string) {
	c.mu.Lock()
	c.httpCut[[2]string{from, to}] = true
	c.mu.Unlock()
}

// SetLink sets the data-plane link from → to: cut drops its calls (they
// hang until their deadline), delay holds each call that long. A cut
// also cuts Raft in that direction.
func (c *Cluster) SetLink(from, to string, cut bool, delay time.Duration) {
	c.setLink(from, to, func(l *link) { l.cut, l.delay = cut, delay })
	c.relink()
}

// SetHandoffDelay holds each hand-off push from → to that carries parts
// for d before it is delivered, as a large hand-off (exported, encoded,
// sent and taken on a starved machine) takes that long; checks, pings,
// leases, backups and a sender's word that a hand-off is on its way pass
// at once. Heal clears it.
func (c *Cluster) SetHandoffDelay(from, to string, d time.Duration) {
	c.setLink(from, to, func(l *link) { l.handoffDelay = d })
}

// SetBackupDelay holds each backup push from → to that carries parts
// (an owner's round, or copies passed on) for d before it is delivered:
// longer than the push's timeout, the backup gets none of them, as when
// a large whole push cannot finish on a starved machine. Every other
// call passes at once. Heal clears it.
func (c *Cluster) SetBackupDelay(from, to string, d time.Duration) {
	c.setLink(from, to, func(l *link) { l.backupDelay = d })
}

// setLink changes the link from → to by set.
func (c *Cluster) setLink(from, to string, set func(*link)) {
	c.net.mu.Lock()
	l := c.net.links[[2]string{from, to}]
	set(&l)
	c.net.links[[2]string{from, to}] = l
	c.net.mu.Unlock()
}

func (c *Cluster) prober(id string) node.Prober {
	if c.opts.Prober == nil && c.opts.ProbeLinks {
		return linkProber{c, id}
	}
	return c.opts.Prober
}

// linkProber is member from's Prober under Options.ProbeLinks.
type linkProber struct {
	c    *Cluster
	from string
}

// Reach reaches a member's Raft or data-plane address through the link
// from this member to it.
func (p linkProber) Reach(ctx context.Context, addr string) error {
	for _, m := range p.c.Members() {
		switch addr {
		case m.peerAddr():
			_, err := p.c.net.route(ctx, p.from, addr)
			return err
		case m.raftAddr():
			if l := p.c.net.link(p.from, m.ID); l.cut || l.raftCut {
				<-ctx.Done()
				return ctx.Err()
			}
			if !m.running() {
				return fmt.Errorf("%w: %s is not running", ErrRefused, m.ID)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: no member at %s", ErrRefused, addr)
}

// Ready takes every member for caught up.
func (linkProber) Ready(context.Context, string) error { return nil }

// CutCalls drops the data-plane calls from makes to to, and nothing else:
// to's calls to from, and their answers, pass, and so does Raft both ways
// (a firewall that drops one side's connections to the other's data-plane
// port). Heal restores it.
func (c *Cluster) CutCalls(from, to string) {
	c.setLink(from, to, func(l *link) { l.callsCut = true })
}

// CutRaft cuts Raft's links between the given members and the others,
// both ways, and leaves the data plane as it is: the members' pings,
// lease requests, hand-offs and checks still pass.
func (c *Cluster) CutRaft(ids ...string) { c.cutBetween(ids, func(l *link) { l.raftCut = true }) }

// cutBetween applies cut to every link between the members ids and the
// others, both ways.
func (c *Cluster) cutBetween(ids []string, cut func(*link)) {
	c.net.mu.Lock()
	for _, a := range c.order {
		for _, b := range c.order {
			if slices.Contains(ids, a) != slices.Contains(ids, b) {
				l := c.net.links[[2]string{a, b}]
				cut(&l)
				c.net.links[[2]string{a, b}] = l
			}
		}
	}
	c.net.mu.Unlock()
	c.relink()
}

// StallDisk makes member id's Raft log writes hang until resume is
// called, as on a disk that stops answering. hashicorp/raft writes a
// leader's log from its main loop, so a leader whose disk hangs keeps
// calling itself leader, the way a paused process does, while the rest of
// its process runs on. resume must be called before the cluster closes
// (Raft's shutdown waits for its main loop); it may be called twice.
func (c *Cluster) StallDisk(id string) (resume func()) {
	m := c.Member(id)
	ch := make(chan struct{})
	m.disk.Store(&ch)
	return func() {
		if m.disk.CompareAndSwap(&ch, nil) {
			close(ch)
		}
	}
}

// stallingLog is a member's Raft log store, whose writes wait while its
// disk is stalled (StallDisk).
type stallingLog struct {
	*raft.InmemStore
	m *Member
}

func (s stallingLog) wait() {
	if ch := s.m.disk.Load(); ch != nil {
		<-*ch
	}
}

func (s stallingLog) StoreLog(l *raft.Log) error {
	return s.StoreLogs([]*raft.Log{l})
}

func (s stallingLog) StoreLogs(ls []*raft.Log) error {
	if f := s.m.c.opts.OnStore; f != nil {
		f(s.m.ID, ls)
	}
	s.wait()
	return s.InmemStore.StoreLogs(ls)
}

// relink connects every running member's Raft transport to every other
// running member it has an uncut link to.
func (c *Cluster) relink() {
	ms := c.Members()
	for _, a := range ms {
		if !a.running() {
			continue
		}
		a.mu.Lock()
		ta := a.trans
		a.mu.Unlock()
		for _, b := range ms {
			if a == b {
				continue
			}
			b.mu.Lock()
			tb := b.trans
			b.mu.Unlock()
			if l := c.net.link(a.ID, b.ID); b.running() && !l.cut && !l.raftCut {
				ta.Connect(raft.ServerAddress(b.raftAddr()), tb)
			} else {
				ta.Disconnect(raft.ServerAddress(b.raftAddr()))
			}
		}
	}
}

// KeyOwnedBy returns a key of rule whose partition member id owns in the
// view of the first running member (different keys for different n).
func (c *Cluster) KeyOwnedBy(id string, n int) string {
	c.t.Helper()
	var v *router.View
	for _, m := range c.Members() {
		if m.running() {
			v = m.Node().View()
			break
		}
	}
	for i := 0; i < 1<<20; i++ {
		k := fmt.Sprintf("key-%d", i)
		if _, o, ok := v.Ring.OwnerOfKey(limiter.KeyHash(v.Seed, k)); ok && o.ID == id {
			if n == 0 {
				return k
			}
			n--
		}
	}
	c.t.Fatalf("clustertest: no key owned by %s", id)
	return ""
}

// PutRules writes rules through member via and waits until every running
// member has them.
func (c *Cluster) PutRules(via string, rs ...limiter.Rule) {
	c.t.Helper()
	if _, err := c.Member(via).Node().PutRules(context.Background(), rs); err != nil {
		c.t.Fatal(err)
	}
	c.WaitFor("rules everywhere", 10*time.Second, func() bool {
		for _, m := range c.Members() {
			if !m.running() {
				continue
			}
			v := m.Router().View()
			for _, r := range rs {
				if v == nil || v.Rules[r.Name] == nil || v.Rules[r.Name].Limit != r.Limit {
					return false
				}
			}
		}
		return true
	})
}

// Check sends one check through member via's router.
func (c *Cluster) Check(via, rule, key string, cost int64) router.Result {
	c.t.Helper()
	out := make([]router.Result, 1)
	if err := c.Member(via).Router().Check(context.Background(), []router.Request{{Rule: rule, Key: key, Cost: cost}}, out); err != nil {
		c.t.Fatalf("clustertest: check via %s: %v", via, err)
	}
	return out[0]
}

func (c *Cluster) close() {
	for _, m := range c.Members() {
		c.kill(m, false)
	}
	// hashicorp/raft's Shutdown does not wait for a leadership transfer
	// it started (a graceful stop's last step): its TimeoutNow to a member
	// already gone waits on the in-memory transport, up to twice 10 × its
	// 500ms timeout. The bubble's clock stops once the test's goroutine
	// returns, and a goroutine still waiting then is a deadlock panic:
	// let those waits run out here (virtual time).
	time.Sleep(10*time.Second + time.Millisecond)
}

// forwarder is the in-memory leader client: it calls the member at an
// HTTP address directly, over the link table.
type forwarder struct {
	c    *Cluster
	from string
}

// target is the node at HTTP address addr, and ctx marked forwarded.
func (f forwarder) target(ctx context.Context, addr string) (*node.Node, context.Context, error) {
	n, err := f.reach(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	return n, api.WithForwarded(ctx), nil
}

// reach is the node at HTTP address addr, through the network's links.
func (f forwarder) reach(ctx context.Context, addr string) (*node.Node, error) {
	f.c.net.mu.Lock()
	id, ok := f.c.net.byHTTP[addr]
	f.c.net.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: no member at %s", api.ErrUnavailable, addr)
	}
	f.c.mu.Lock()
	cut := f.c.httpCut[[2]string{f.from, id}]
	f.c.mu.Unlock()
	if cut {
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %w", api.ErrUnavailable, ctx.Err())
	}
	m, err := f.c.net.route(ctx, f.from, f.c.Member(id).peerAddr())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", api.ErrUnavailable, err)
	}
	return m.Node(), nil
}

func (f forwarder) Join(ctx context.Context, leader string, req api.JoinRequest) (uint64, error) {
	if f.c.opts.OnForward != nil {
		f.c.opts.OnForward(f.from, "join")
	}
	n, ctx, err := f.target(ctx, leader)
	if err != nil {
		return 0, err
	}
	return f.answer(n.Join(ctx, req))
}

// JoinVia is not marked forwarded, as over HTTP.
func (f forwarder) JoinVia(ctx context.Context, member string, req api.JoinRequest) (uint64, error) {
	if f.c.opts.OnForward != nil {
		f.c.opts.OnForward(f.from, "join")
	}
	n, err := f.reach(ctx, member)
	if err != nil {
		return 0, err
	}
	return f.answer(n.Join(ctx, req))
}

// ClusterOf reads the view of the member at addr, as GET /v1/cluster and
// GET /v1/cluster/view (for the seed) do (node.ClusterReader).
func (f forwarder) ClusterOf(ctx context.Context, addr string) (node.RemoteCluster, error) {
	n, err := f.reach(ctx, addr)
	if err != nil {
		return node.RemoteCluster{}, err
	}
	cl, err := n.Cluster(ctx)
	if err != nil {
		return node.RemoteCluster{}, err
	}
	v, err := n.RouterView(ctx)
	if err != nil {
		return node.RemoteCluster{}, err
	}
	r := node.RemoteCluster{ID: n.ID(), Leader: cl.Leader, Epoch: cl.Epoch, Seed: v.Seed, RaftOnly: cl.RaftOnly}
	for _, m := range cl.Members {
		r.Members = append(r.Members, m.ID)
	}
	return r, nil
}

// answer is the answer to a join as the member gets it (Options.JoinAnswer).
func (f forwarder) answer(epoch uint64, err error) (uint64, error) {
	if f.c.opts.JoinAnswer != nil {
		return f.c.opts.JoinAnswer(f.from, epoch, err)
	}
	return epoch, err
}

// InCluster is answered by the member asked, over the links.
func (f forwarder) InCluster(ctx context.Context, member string) (bool, error) {
	n, err := f.reach(ctx, member)
	if err != nil {
		return false, err
	}
	st, err := n.Seed(ctx)
	return st.InCluster, err
}

func (f forwarder) Leave(ctx context.Context, leader, id string) error {
	if f.c.opts.OnForward != nil {
		f.c.opts.OnForward(f.from, "leave")
	}
	n, ctx, err := f.target(ctx, leader)
	if err != nil {
		return err
	}
	return n.Leave(ctx, id)
}

func (f forwarder) SetState(ctx context.Context, leader, id, state string) error {
	n, ctx, err := f.target(ctx, leader)
	if err != nil {
		return err
	}
	return n.SetState(ctx, id, state)
}

func (f forwarder) PutRules(ctx context.Context, leader string, written []limiter.Rule) ([]limiter.Rule, uint64, error) {
	n, ctx, err := f.target(ctx, leader)
	if err != nil {
		return nil, 0, err
	}
	set, err := n.PutRules(ctx, written)
	if err != nil {
		return nil, 0, err
	}
	return set, n.RulesVersion(), nil // as the HTTP answer says it
}
