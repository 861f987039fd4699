package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/ringlimit/ringlimit/fsm"
)

// streamLayer is raft's network layer over a listener we opened, so the
// caller chooses (and can test with) any port, and advertises addr.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	dial      func(ctx context.Context, addr string) (net.Conn, error) // authenticates; see Config.RaftDial
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.dial(ctx, string(addr))
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

// raftParts are what openRaft built, to be closed in reverse order.
type raftParts struct {
	raft     *raft.Raft
	closers  []func() error // transport, stores: closed after raft
	hasState bool
	// lastCommand is the index of the last FSM command in the log at
	// start (configuration entries never reach the FSM); 0 when none
	// follows the latest snapshot, which NewRaft restores before returning.
	lastCommand uint64
	// logs is Raft's log store, read (never written) by the rules file's
	// start (rulesWrittenAfter).
	logs raft.LogStore
	// local is what the local snapshot and log say of the cluster and
	// of this member (replayLocal): whom to ask when no leader can be
	// reached, before the log is replayed (a restart at new addresses, or
	// a member removed while it was away: leftWhileAway).
	local localHistory
	// terms watches the answers to this node's AppendEntries (the
	// leader's lease needs them: leaderLease).
	terms *termWatch
	// stopRetries ends the retries of failed replication calls
	// (retryReplication) before Raft shuts down.
	stopRetries func()
	// fsm is the node's FSM as Raft drives it, which knows the index of
	// the snapshot it restored last (Node.applied).
	fsm *restoreWatch
	// answers are the goroutines waiting for Raft's answers to the
	// futures the node awaits, which close lets Raft answer, for at most
	// answerWait, before it shuts Raft down.
	answers    answers
	answerWait time.Duration
	log        *slog.Logger
}

// snapshotThreshold and snapshotInterval are Raft's: see openRaft.
const (
	snapshotThreshold = 1024
	snapshotInterval  = 30 * time.Second
)

// openRaft wires hashicorp/raft. With cfg.RaftTransport nil it is the
// shortest correct wiring: one bolt store for the log and the stable
// store, file snapshots, TCP transport on ln. Otherwise it uses the
// transport and stores given (tests: in-memory). It does not bootstrap.
func openRaft(cfg *Config, fsm raft.FSM, ln net.Listener) (*raftParts, error) {
	// Raft, its transport and its snapshot store log through the node's
	// logger (hashicorp's own would write hclog's JSON or text to stderr).
	hlog := newHclogger(cfg.Logger.With("node", cfg.ID), time.Now, "node")
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog.Named("raft")
	rc.HeartbeatTimeout = cfg.RaftTimeout
	rc.ElectionTimeout = cfg.RaftTimeout
	rc.LeaderLeaseTimeout = cfg.RaftTimeout / 2
	// Raft's idle replication (a follower learns the commit index from
	// it when no new entry comes) every CommitTimeout to 2×: writes are
	// announced at once (announceCommit), so this is only a backstop.
	// It was 20 ms: 25–50 AppendEntries a second to each follower, each
	// a log read and a round trip, most of an idle cluster's CPU.
	rc.CommitTimeout = 250 * time.Millisecond
	// A snapshot every snapshotThreshold entries, looked for every
	// snapshotInterval to 2× that: a restart replays the entries after
	// the last snapshot, each rules write two of them with its whole set.
	// hashicorp/raft's defaults (8,192; 120 s) left a member that had
	// taken 10,000 entries of 100-rule writes 10–13 s from its start to
	// ready, against under 2 s with a snapshot (an audit); they also
	// bound raft.db at TrailingLogs plus the threshold.
	rc.SnapshotThreshold = snapshotThreshold
	rc.SnapshotInterval = snapshotInterval
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("node: raft config: %w", err)
	}
	parts := &raftParts{answerWait: 2 * cfg.RaftTimeout, log: cfg.Logger.With("node", cfg.ID)}
	var started atomic.Pointer[raft.Raft] // for the Raft guard, once running
	logs, stable, snaps, trans := cfg.LogStore, cfg.StableStore, cfg.SnapshotStore, cfg.RaftTransport
	if trans == nil {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("node: data dir: %w", err)
		}
		if _, _, err := net.SplitHostPort(cfg.RaftAdvertise); err != nil {
			return nil, fmt.Errorf("node: raft advertise address %q: %w", cfg.RaftAdvertise, err)
		}
		if err := checkRaftDB(cfg.DataDir); err != nil {
			return nil, err
		}
		dbPath := filepath.Join(cfg.DataDir, "raft.db")
		_, statErr := os.Lstat(dbPath)
		store, err := raftboltdb.NewBoltStore(dbPath)
		if err != nil {
			if errors.Is(statErr, fs.ErrNotExist) {
				// Created by this failed start (a full disk leaves it
				// empty or short): left in place, every later start
				// refused it as damaged, the disk freed or not.
				_ = os.Remove(dbPath)
			}
			return nil, fmt.Errorf("node: raft store: %w", err)
		}
		fsnaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog.Named("snapshot"))
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("node: snapshot store: %w", err)
		}
		if err := checkLogFollowsSnapshot(store, fsnaps, cfg.DataDir); err != nil {
			store.Close()
			return nil, err
		}
		nt := newRaftGuard(raft.NewNetworkTransportWithLogger(&streamLayer{Listener: ln, advertise: advertiseAddr(cfg.RaftAdvertise), dial: cfg.raftDial()}, 3, 10*time.Second, hlog.Named("raft-net")),
			func() (raft.Configuration, bool) {
				if r := started.Load(); r != nil {
					return r.GetConfiguration().Configuration(), true
				}
				return raft.Configuration{}, false
			}, cfg.Logger)
		logs, stable, snaps, trans = store, store, fsnaps, nt
		parts.closers = []func() error{nt.Close, store.Close}
	}
	closeAll := func() {
		for _, c := range parts.closers {
			_ = c()
		}
	}
	trans, parts.terms = watchTerms(trans)
	stop := make(chan struct{})
	parts.stopRetries = sync.OnceFunc(func() { close(stop) })
	// Failed replication calls are retried as often as Raft sends
	// heartbeats to a member that does not answer (HeartbeatTimeout/2),
	// not after Raft's back-off of up to 10s.
	trans = retryReplication(trans, rc.HeartbeatTimeout/2, stop, leadsAt(started.Load))
	hasState, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("node: reading raft state: %w", err)
	}
	if hasState && cfg.RaftTransport == nil {
		// The id the dir records first: copied or mixed-up volumes of
		// members that are all in the log pass the checks below (an
		// audit: n3's dir started as n2 was taken, and shut the real n2
		// out of the cluster). A record that does not read as an id
		// records nothing: the id given is written over it (serve
		// without --id refuses it, asking for one).
		if rec, err := RecordedID(cfg.DataDir); err == nil && rec != "" && rec != cfg.ID {
			closeAll()
			return nil, fmt.Errorf("%w: %s is the data dir of member %q (its %s), not of %q: start it with --id %s (or without --id), and %q over a data dir of its own, or an empty one to join as a new member",
				ErrDataDir, cfg.DataDir, rec, memberIDFile, cfg.ID, rec, cfg.ID)
		}
	}
	local := replayLocal(logs, snaps, cfg.ID)
	if hasState && local.left {
		// Raft would wait for a leader that no longer sends it anything,
		// and the member would say it waits for its log to be confirmed,
		// forever (seen by a new user restarting a member after leave).
		closeAll()
		return nil, fmt.Errorf("%w: member %q left the cluster (ringlimit leave): this data dir's log holds its removal; start it over an empty --data-dir to join again as a new member", ErrDataDir, cfg.ID)
	}
	if hasState && local.stranger {
		// Raft would wait for a leader that never sends it anything, and
		// the member would say it waits for its log to be confirmed,
		// forever (an audit: another member's data dir copied for a
		// new one).
		closeAll()
		members := slices.Sorted(maps.Keys(local.known))
		return nil, fmt.Errorf("%w: %s holds the Raft state of a cluster that never had a member %q (its members: %s): it is another member's data dir; start %q over an empty --data-dir to join as a new member, or start it with the id it had",
			ErrDataDir, cfg.DataDir, cfg.ID, strings.Join(members, ", "), cfg.ID)
	}
	if cfg.RaftTransport == nil {
		if err := recordID(cfg.DataDir, cfg.ID); err != nil {
			closeAll()
			return nil, err
		}
	}
	parts.fsm = &restoreWatch{FSM: fsm}
	r, err := raft.NewRaft(rc, parts.fsm, logs, stable, indexedSnapshots{snaps}, trans)
	started.Store(r)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("node: starting raft: %w", err)
	}
	parts.raft, parts.hasState = r, hasState
	parts.lastCommand = lastCommand(logs, snaps)
	parts.logs = logs
	parts.local = local
	return parts, nil
}

// close shuts Raft down, once Raft has answered every future the node
// awaits (answers), or answerWait has passed.
//
// Raft drops some of the futures it holds when it shuts down, unanswered
// (hashicorp/raft#498): an entry committed as it stops, whose answer was
// queued for its FSM goroutine, or a leadership transfer still in its
// queue. The goroutine that waits for such an answer (await) then waited
// forever: a leak in a process, and a deadlock that fails a synctest
// bubble at its end. While Raft runs it answers each of them soon: a
// committed entry once applied, the others when a leader without a
// quorum steps down (after LeaderLeaseTimeout, half a Raft timeout) or a
// leadership transfer ends (an election timeout); answerWait, two Raft
// timeouts, covers those. Only a Raft that does not work (a disk that
// hangs, which Shutdown waits for anyway) leaves one waiting past it.
func (p *raftParts) close() error {
	p.answers.close()
	if k := p.answers.wait(p.answerWait); k > 0 {
		p.log.Warn("shutting raft down before it answered every request the node waited on: their outcome stays unknown", "requests", k)
	}
	p.stopRetries()
	err := p.raft.Shutdown().Error()
	for _, c := range p.closers {
		if e := c(); err == nil {
			err = e
		}
	}
	return err
}

// applied is the index of the last log entry the FSM's state reflects:
// the last command it applied, or the snapshot it restored last when
// that is later. A snapshot stands for every entry it covers, which the
// FSM then never applies: a member restarted over its data dir whose
// leader has compacted away the entries it missed gets the leader's
// snapshot (InstallSnapshot) instead, and counting only the commands
// applied, it took itself for still replaying the log it restarted with
// until the cluster's next command (which nothing it waited for would
// write: it marks itself down only once it has caught up).
func (n *Node) applied() uint64 {
	a := n.fsm.Applied()
	if n.raft != nil && n.raft.fsm != nil {
		a = max(a, n.raft.fsm.restored.Load())
	}
	return a
}

// restoreWatch is the node's FSM as Raft drives it: the same FSM, which
// also keeps the log index of the last snapshot it restored (from
// indexedSnapshots, as raft.FSM's Restore is not told it).
type restoreWatch struct {
	raft.FSM
	restored atomic.Uint64 // the last restored snapshot's index; 0: none
}

// Restore restores the snapshot and, once it is the FSM's state, keeps
// its index: after the FSM has published it, so that nothing takes an
// index for reached before its state is there.
func (f *restoreWatch) Restore(rc io.ReadCloser) error {
	if err := f.FSM.Restore(rc); err != nil {
		return err
	}
	if i, ok := snapshotIndex(rc); ok {
		f.restored.Store(i)
	}
	return nil
}

// snapshotIndex is the log index of the snapshot rc reads, when
// indexedSnapshots opened it (through Raft's wrappers around it).
func snapshotIndex(rc io.ReadCloser) (uint64, bool) {
	for {
		switch r := rc.(type) {
		case *snapshotSource:
			return r.index, true
		case raft.ReadCloserWrapper:
			rc = r.WrappedReadCloser()
		default:
			return 0, false
		}
	}
}

// indexedSnapshots is Raft's snapshot store, whose snapshots, as Open
// returns them, say at which log index they are (snapshotIndex).
type indexedSnapshots struct{ raft.SnapshotStore }

// snapshotSource is a snapshot opened by indexedSnapshots.
type snapshotSource struct {
	io.ReadCloser
	index uint64
}

func (s indexedSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err != nil || meta == nil {
		return meta, rc, err
	}
	return meta, &snapshotSource{ReadCloser: rc, index: meta.Index}, nil
}

// answers counts the goroutines that wait for Raft's answers to futures
// (of), so that raftParts.close can let Raft answer them before it shuts
// down. The zero value is ready to use.
type answers struct {
	mu      sync.Mutex
	pending int           // goroutines waiting; guarded by mu
	idle    chan struct{} // closed when pending drops to 0; guarded by mu
	shut    bool          // Raft is shutting down (close); guarded by mu
}

// of returns where Raft's answer to f arrives: a goroutine waits for it
// (f.Error, which watches nothing else) and ends when Raft answers.
// Once Raft shuts down (close) it starts none and returns a channel that
// never delivers: the node is closing, so its caller (await) returns on
// that, and Raft may drop f unanswered.
//
// Was: a goroutine all the same. A leader's chore that asked Raft for a
// barrier as its node closed, after close had waited for the answers it
// knew of, left one waiting for ever on a future Raft dropped as it
// shut down (a harness run ended in "deadlock: main bubble goroutine has
// exited but blocked goroutines remain", 1 in 942).
func (a *answers) of(f raft.Future) <-chan error {
	a.mu.Lock()
	if a.shut {
		a.mu.Unlock()
		return nil
	}
	if a.pending == 0 {
		a.idle = make(chan struct{})
	}
	a.pending++
	a.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		done <- f.Error()
		a.mu.Lock()
		if a.pending--; a.pending == 0 {
			close(a.idle)
		}
		a.mu.Unlock()
	}()
	return done
}

// close makes of start no more waiters: Raft is shutting down.
func (a *answers) close() {
	a.mu.Lock()
	a.shut = true
	a.mu.Unlock()
}

// wait waits until no goroutine waits for an answer, at most d, and
// returns how many still do.
func (a *answers) wait(d time.Duration) int {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		a.mu.Lock()
		pending, idle := a.pending, a.idle
		a.mu.Unlock()
		if pending == 0 {
			return 0
		}
		select {
		case <-idle:
		case <-t.C:
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.pending
		}
	}
}

// lastCommand finds the last LogCommand entry after the latest snapshot.
func lastCommand(logs raft.LogStore, snaps raft.SnapshotStore) uint64 {
	var floor uint64
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		floor = metas[0].Index
	}
	first, err1 := logs.FirstIndex()
	last, err2 := logs.LastIndex()
	if err1 != nil || err2 != nil {
		return 0
	}
	for i := last; i >= first && i > floor && i > 0; i-- {
		var l raft.Log
		if logs.GetLog(i, &l) == nil && l.Type == raft.LogCommand {
			return i
		}
	}
	return 0
}

// localHistory is what a member's local snapshot and log say
// (replayLocal), committed or not.
type localHistory struct {
	// known are the HTTP addresses of the members listed at the end, by id.
	known map[string]string
	// left: the member was listed at some point of that history and is
	// not at its end (its removal, by leave, is in the log).
	left bool
	// seed is the cluster's hash seed (0 when the history holds no Init):
	// it identifies the cluster, being drawn at random when one is
	// initialised.
	seed uint64
	// since is the index of the last change to the member's own record
	// at the end of the history (fsm.Member.Since); 0 when not listed.
	// sinceTerm is the term of that entry in the log; 0 when the
	// snapshot holds it (committed, then).
	since, sinceTerm uint64
	// stranger: neither the history's members nor any Raft configuration
	// in it ever named the member (the data dir is another member's).
	stranger bool
}

// replayLocal replays the local snapshot and log into a scratch FSM and
// returns what they say of the cluster and of member self. Errors just
// shorten the history.
func replayLocal(logs raft.LogStore, snaps raft.SnapshotStore, self string) localHistory {
	f := fsm.New()
	var floor uint64
	var inRaft bool // a Raft configuration of the snapshot or the log names self
	names := func(c raft.Configuration) bool {
		return slices.ContainsFunc(c.Servers, func(s raft.Server) bool { return s.ID == raft.ServerID(self) })
	}
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		inRaft = names(metas[0].Configuration)
		if _, rc, err := snaps.Open(metas[0].ID); err == nil {
			if f.Restore(rc) == nil {
				floor = metas[0].Index
			}
			rc.Close()
		}
	}
	listed := func() bool { _, ok := f.State().Member(self); return ok }
	was := listed()
	first, err1 := logs.FirstIndex()
	last, err2 := logs.LastIndex()
	if err1 == nil && err2 == nil {
		for i := max(first, floor+1); i <= last && i > 0; i++ {
			var l raft.Log
			if logs.GetLog(i, &l) != nil {
				continue
			}
			switch l.Type {
			case raft.LogCommand:
				f.Apply(&l)
				was = was || listed()
			case raft.LogConfiguration:
				inRaft = inRaft || names(raft.DecodeConfiguration(l.Data))
			}
		}
	}
	st := f.State()
	h := localHistory{known: map[string]string{}, seed: st.Config.Seed}
	for _, m := range st.Members {
		h.known[m.ID] = m.HTTP
	}
	m, ok := st.Member(self)
	h.left, h.since = was && !ok, m.Since
	h.stranger = !was && !inRaft
	var l raft.Log
	if h.since > floor && logs.GetLog(h.since, &l) == nil {
		h.sinceTerm = l.Term
	}
	return h
}

// advertiseAddr is the Raft address as configured, not resolved: Raft
// puts it in every RPC header and peers compare it with the address in
// their configuration, which holds the name a member advertised (a DNS
// name in Compose or Kubernetes), not an IP it happened to resolve to.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }
