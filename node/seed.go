package node

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
)

// The seed of a --join list (Config.Seed) is the one member that may
// bootstrap a cluster. Started with no Raft state it does not bootstrap
// at once: its data dir may be a lost volume while the cluster it
// bootstrapped long ago runs on, and a second, one-member cluster would
// answer every check on fresh budgets. It first asks every other member
// of the list (Forwarder.InCluster, GET /v1/cluster/seed):
//
//   - one that holds Raft state: the cluster exists; the seed joins it
//     (through the list, as every other member joins);
//   - every one answered that it holds none (they all wait to join, as
//     at a cluster's first start): it bootstraps;
//   - SeedGrace passed and nobody said it holds state, some never
//     answered (a first start where a member is slow or not scheduled
//     yet): it bootstraps. This is the residual risk: a cluster none of
//     whose listed members answers for that long is taken for absent.
//
// Only the seed asks; the others never bootstrap, so two members that
// both have no state cannot each wait for the other.

// DefaultSeedGrace is Config.SeedGrace's default.
const DefaultSeedGrace = 15 * time.Second

// seedRound is how often the seed asks the members that have not told
// it yet, and seedAsk how long one question may take.
const (
	seedRound = 500 * time.Millisecond
	seedAsk   = 2 * time.Second
)

// Seed answers whether this node holds a cluster's Raft state
// (api.SeedStatus): it bootstrapped one, received a leader's log, or
// started with a data dir that holds one. A member waiting to join, or
// a seed still asking, holds none.
func (n *Node) Seed(context.Context) (api.SeedStatus, error) {
	return api.SeedStatus{ID: n.cfg.ID, InCluster: n.holdsCluster()}, nil
}

// holdsCluster reports whether this node's Raft holds any state: a log
// or a snapshot (Raft's last index counts both; a bootstrap writes the
// first configuration at index 1).
func (n *Node) holdsCluster() bool { return n.raft.raft.LastIndex() > 0 }

// seedLoop decides, for a seed with no Raft state, between joining and
// bootstrapping (see above), and closes n.seeded when it has: the
// registration waits for it.
func (n *Node) seedLoop() {
	defer close(n.seeded)
	defer n.seeding.Store(false)
	via, ok := n.askOthers(n.ctx, time.Now().Add(n.cfg.SeedGrace))
	switch {
	case !ok:
		return // closing
	case via != "":
		n.log.Info("seed with no raft state: a listed member holds the cluster; joining it instead of bootstrapping", "via", via)
		return
	}
	f := n.raft.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
		ID: raft.ServerID(n.cfg.ID), Address: raft.ServerAddress(n.cfg.RaftAdvertise), Suffrage: raft.Voter,
	}}})
	switch err := f.Error(); {
	case errors.Is(err, raft.ErrCantBootstrap):
		// A leader's log reached us while we asked: that cluster lists
		// this member (Raft sends only to its configuration). Join it.
		n.log.Info("seed with no raft state: a leader's log arrived while asking the other members; joining its cluster instead of bootstrapping")
	case err != nil:
		n.log.Error("seed: bootstrap failed; trying to join through the --join list instead", "err", err)
	default:
		n.joinEpoch.CompareAndSwap(joinPending, 0) // acts on its own log from the start
		n.log.Info("bootstrapped a new cluster")
	}
}

// askOthers asks the other members of the list, every seedRound, until
// one holds Raft state (its address is returned), or in one round every
// one has answered that it holds none, or grace has passed with nobody
// saying it holds state ("" for both: bootstrap). ok is false when the
// node closes first.
func (n *Node) askOthers(ctx context.Context, grace time.Time) (via string, ok bool) {
	type answer struct {
		addr string
		in   bool
		err  error
	}
	for round := 0; ; round++ {
		answers := make(chan answer, len(n.cfg.Join))
		for _, addr := range n.cfg.Join {
			go func() {
				actx, cancel := context.WithTimeout(ctx, seedAsk)
				defer cancel()
				in, err := n.cfg.Forward.InCluster(actx, addr)
				answers <- answer{addr, in, err}
			}()
		}
		var silent []string
		for range n.cfg.Join {
			a := <-answers
			switch {
			case a.err != nil:
				silent = append(silent, a.addr)
				n.log.Debug("seed: asked a listed member whether it holds a cluster; no answer", "addr", a.addr, "err", a.err)
			case a.in:
				return a.addr, true
			}
		}
		if ctx.Err() != nil {
			return "", false
		}
		if len(silent) == 0 {
			n.log.Info("seed with no raft state: every other listed member answered that it holds no cluster; bootstrapping", "asked", strings.Join(n.cfg.Join, ","))
			return "", true
		}
		if !time.Now().Before(grace) {
			n.log.Warn("seed with no raft state: some listed members never answered within the grace; bootstrapping, as at a first start (were they members of a running cluster, this is a second one)",
				"silent", strings.Join(silent, ","), "grace", n.cfg.SeedGrace.String())
			return "", true
		}
		if round == 0 {
			n.log.Info("seed with no raft state: asking the other listed members whether a cluster exists before bootstrapping", "waiting_for", strings.Join(silent, ","), "grace", n.cfg.SeedGrace.String())
		}
		t := time.NewTimer(min(seedRound, time.Until(grace)))
		select {
		case <-ctx.Done():
			t.Stop()
			return "", false
		case <-t.C:
		}
	}
}
