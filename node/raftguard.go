package node

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// raftGuard is a raft.Transport that refuses RPCs from senders outside the
// current Raft configuration. hashicorp/raft checks membership for votes
// but acts on AppendEntries from anyone with a higher term, so one stray
// RPC could install a stranger's log. The connection layer authenticates
// peers (cluster secret, mutual TLS); this guard is the second line: it
// stops a removed member, a member of another cluster sharing the secret,
// or anybody on an --insecure cluster that does not claim a listed id and
// address, and terms no real cluster reaches.
//
// Its rules: an RPC is acted on when the sender's id and address both
// appear in the latest configuration (which includes entries not yet
// committed), or when this node has no configuration yet (a member that
// joins learns its first configuration from the leader), or when it is an
// AppendEntries carrying a configuration that lists its sender (a
// follower that missed the change which added a new leader catches up).
// Refusals are answered with an error, which the sender treats as a
// failed RPC.
type raftGuard struct {
	*raft.NetworkTransport
	config func() (raft.Configuration, bool) // the latest configuration; false until raft runs
	log    *slog.Logger
	out    chan raft.RPC
	stop   chan struct{}

	// hbMu is held shared by every heartbeat in flight and exclusively by
	// Close, which so waits for them: hashicorp/raft's heartbeat fast path
	// runs on the transport's connection goroutines, may pass its
	// shutdown check just before Raft shuts down, and then write the term
	// to a store the caller closes next ("database not open", a panic).
	hbMu     sync.RWMutex
	hbClosed bool // guarded by hbMu

	refused   atomic.Int64
	lastLogNS atomic.Int64
}

// errRaftRefused is answered to refused RPCs.
var errRaftRefused = errors.New("node: raft rpc refused: sender not in this cluster's configuration")

// maxSaneTerm: a term no real cluster reaches (one election per ms for
// 10^9 years is < 2^55); a larger one is an attack that would wrap.
const maxSaneTerm = 1 << 62

func newRaftGuard(t *raft.NetworkTransport, config func() (raft.Configuration, bool), log *slog.Logger) *raftGuard {
	g := &raftGuard{NetworkTransport: t, config: config, log: log, out: make(chan raft.RPC), stop: make(chan struct{})}
	go g.filter()
	return g
}

// Consumer returns the filtered RPCs.
func (g *raftGuard) Consumer() <-chan raft.RPC { return g.out }

// SetHeartbeatHandler filters heartbeats too: they bypass Consumer.
func (g *raftGuard) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		g.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	g.NetworkTransport.SetHeartbeatHandler(g.heartbeats(cb))
}

// heartbeats wraps Raft's heartbeat handler cb: refused senders and
// heartbeats after Close are answered with an error, and Close waits for
// those in cb.
func (g *raftGuard) heartbeats(cb func(raft.RPC)) func(raft.RPC) {
	return func(rpc raft.RPC) {
		g.hbMu.RLock()
		defer g.hbMu.RUnlock()
		if g.hbClosed {
			rpc.Respond(nil, raft.ErrTransportShutdown)
			return
		}
		if err := g.check(rpc); err != nil {
			rpc.Respond(nil, err)
			return
		}
		cb(rpc)
	}
}

// Close waits for the heartbeats in flight, refuses later ones, stops
// the filter and closes the transport.
func (g *raftGuard) Close() error {
	g.hbMu.Lock()
	g.hbClosed = true
	g.hbMu.Unlock()
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	return g.NetworkTransport.Close()
}

func (g *raftGuard) filter() {
	in := g.NetworkTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			if err := g.check(rpc); err != nil {
				rpc.Respond(nil, err)
				continue
			}
			select {
			case g.out <- rpc:
			case <-g.stop:
				return
			}
		case <-g.stop:
			return
		}
	}
}

func (g *raftGuard) check(rpc raft.RPC) error {
	err := AllowRPC(rpc.Command, g.config)
	if err != nil {
		n := g.refused.Add(1)
		now := time.Now().UnixNano()
		if last := g.lastLogNS.Load(); now-last > int64(time.Second) && g.lastLogNS.CompareAndSwap(last, now) {
			g.log.Warn("refused a raft rpc", "err", err, "refused_total", n)
		}
	}
	return err
}

// AllowRPC is the guard's decision for an RPC's command, given the
// receiver's latest Raft configuration (false: Raft not started): nil to
// act on it (pure but for the configuration read). In-memory transports
// that have no guard of their own (internal/clustertest) use it to
// decide as the TCP path does.
func AllowRPC(cmd any, config func() (raft.Configuration, bool)) error {
	h, ok := cmd.(raft.WithRPCHeader)
	if !ok {
		return fmt.Errorf("%w: %T without a header", errRaftRefused, cmd)
	}
	hdr := h.GetRPCHeader()
	var term uint64
	switch c := cmd.(type) {
	case *raft.AppendEntriesRequest:
		term = c.Term
	case *raft.RequestVoteRequest:
		term = c.Term
	case *raft.RequestPreVoteRequest:
		term = c.Term
	case *raft.InstallSnapshotRequest:
		term = c.Term
	}
	if term >= maxSaneTerm {
		return fmt.Errorf("%w: term %d", errRaftRefused, term)
	}
	cfg, ok := config()
	if !ok || len(cfg.Servers) == 0 {
		return nil // not started, or joining: the first leader teaches us
	}
	id, addr := raft.ServerID(hdr.ID), raft.ServerAddress(hdr.Addr)
	if listed(cfg, id, addr) {
		return nil
	}
	if ae, ok := cmd.(*raft.AppendEntriesRequest); ok && carriesConfigWith(ae.Entries, id, addr) {
		return nil
	}
	return fmt.Errorf("%w: id %q address %q", errRaftRefused, truncateID(string(id)), truncateID(string(addr)))
}

// listed reports whether cfg has a server of id at addr: one server,
// both. Was: the id and the address each listed, by any server, so a
// header naming one member's id and another's address passed (a security
// review; only a peer that authenticated could send it).
func listed(cfg raft.Configuration, id raft.ServerID, addr raft.ServerAddress) bool {
	if id == "" || addr == "" {
		return false
	}
	for _, s := range cfg.Servers {
		if s.ID == id && s.Address == addr {
			return true
		}
	}
	return false
}

// carriesConfigWith reports whether entries hold a configuration that
// lists id at addr.
func carriesConfigWith(entries []*raft.Log, id raft.ServerID, addr raft.ServerAddress) bool {
	for _, e := range entries {
		if e == nil || e.Type != raft.LogConfiguration {
			continue
		}
		cfg, ok := decodeConfiguration(e.Data)
		if ok && listed(cfg, id, addr) {
			return true
		}
	}
	return false
}

// decodeConfiguration is raft.DecodeConfiguration, which panics on bad
// bytes.
func decodeConfiguration(b []byte) (cfg raft.Configuration, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return raft.DecodeConfiguration(b), true
}

func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
