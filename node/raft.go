package node

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// streamLayer is raft's network layer over a listener we opened, so the
// caller chooses (and can test with) any port, and advertises addr.
type streamLayer struct {
	net.Listener
	advertise net.Addr
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

// raftParts are what openRaft built, to be closed in reverse order.
type raftParts struct {
	raft      *raft.Raft
	store     *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	hasState  bool
}

// openRaft wires hashicorp/raft the shortest correct way: one bolt store
// for the log and the stable store, file snapshots, TCP transport. It
// does not bootstrap.
func openRaft(cfg *Config, fsm raft.FSM, ln net.Listener) (*raftParts, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
	if err != nil {
		return nil, fmt.Errorf("node: raft advertise address %q: %w", cfg.RaftAdvertise, err)
	}
	logOut := cfg.LogOutput
	if logOut == nil {
		logOut = io.Discard
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: logOut, JSONFormat: true})
	rc.HeartbeatTimeout = cfg.RaftTimeout
	rc.ElectionTimeout = cfg.RaftTimeout
	rc.LeaderLeaseTimeout = cfg.RaftTimeout / 2
	rc.CommitTimeout = 20 * time.Millisecond
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("node: raft config: %w", err)
	}
	store, err := raftboltdb.NewBoltStore(filepath.Join(cfg.DataDir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("node: raft store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStore(cfg.DataDir, 2, logOut)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	hasState, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("node: reading raft state: %w", err)
	}
	trans := raft.NewNetworkTransport(&streamLayer{Listener: ln, advertise: adv}, 3, 10*time.Second, logOut)
	r, err := raft.NewRaft(rc, fsm, store, store, snaps, trans)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("node: starting raft: %w", err)
	}
	return &raftParts{raft: r, store: store, transport: trans, hasState: hasState}, nil
}

func (p *raftParts) close() error {
	err := p.raft.Shutdown().Error()
	if e := p.transport.Close(); err == nil {
		err = e
	}
	if e := p.store.Close(); err == nil {
		err = e
	}
	return err
}
