package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
)

// Prober lets the leader reach a joining member before it trusts it.
type Prober interface {
	// Reach opens a connection to a Raft or data-plane address,
	// authenticated as every inter-node connection is (so each side
	// proves itself to the other), and closes it.
	Reach(ctx context.Context, addr string) error
	// Ready returns nil once the member whose HTTP API is at httpAddr
	// answers /readyz with 200: it has caught up with the log.
	Ready(ctx context.Context, httpAddr string) error
}

// An embedder that brings its own Raft transport (Config.RaftTransport)
// and no Prober gets joins without address checks, as voters at once.

// dialProber reaches addresses with the node's Raft dialer and takes a
// member for caught up once its Raft address answers (used when the
// embedder gives no Prober).
type dialProber func(ctx context.Context, addr string) (net.Conn, error)

func (d dialProber) Reach(ctx context.Context, addr string) error {
	c, err := d(ctx, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func (d dialProber) Ready(context.Context, string) error { return nil }

func (n *Node) prober() Prober {
	if n.cfg.Prober != nil {
		return n.cfg.Prober
	}
	return dialProber(n.cfg.raftDial())
}

// Join limits.
const (
	maxIDLen         = 128
	probeTimeout     = 3 * time.Second
	promotionTimeout = 2 * time.Minute
	promotionPoll    = 200 * time.Millisecond
)

// validateJoin checks a join request's shape: an id of printable UTF-8,
// and three host:port addresses.
func validateJoin(req api.JoinRequest) error {
	if !validID(req.ID) {
		return fmt.Errorf("%w: id must be 1 to %d printable characters without spaces", api.ErrBadRequest, maxIDLen)
	}
	for _, f := range [...]struct{ name, v string }{{"http", req.HTTP}, {"raft", req.Raft}, {"peer", req.Peer}} {
		if err := ValidHostPort(f.v); err != nil {
			return fmt.Errorf("%w: %s address %q: %w", api.ErrBadRequest, f.name, truncateID(f.v), err)
		}
	}
	if len(req.Incarnation) > maxIDLen {
		return fmt.Errorf("%w: incarnation of %d bytes, at most %d", api.ErrBadRequest, len(req.Incarnation), maxIDLen)
	}
	return nil
}

// ValidHostPort checks s as a member's advertised address: host:port,
// the host a name or an IP address that can be reached (not 0.0.0.0 or
// ::), the port 1 to 65535. serve checks --join and --advertise-host
// with it before starting, as the leader checks a join's addresses.
func ValidHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want host:port")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return errors.New("port must be 1 to 65535")
	}
	if host == "" {
		return errors.New("empty host")
	}
	if net.ParseIP(host) != nil {
		if ip := net.ParseIP(host); ip.IsUnspecified() {
			return errors.New("an unspecified address (0.0.0.0, ::) cannot be reached")
		}
		return nil
	}
	if len(host) > 253 {
		return errors.New("host name too long")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return errors.New("not a host name or IP address")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return errors.New("not a host name or IP address")
			}
		}
	}
	return nil
}

// checkJoin runs on the leader before a join changes anything: the
// request's shape, a live member already holding the id elsewhere (409),
// and the joining member's Raft and data-plane addresses reached with the
// cluster's authentication (so a member that cannot be reached, or cannot
// prove it belongs, is never added: it would cost quorum or own
// partitions nobody can serve).
// promotesLater reports whether new members join as non-voters to be
// promoted once caught up; an embedder's own Raft transport without a
// Prober (in-memory tests) adds them as voters at once, as before.
func (n *Node) promotesLater() bool { return n.cfg.RaftTransport == nil || n.cfg.Prober != nil }

func (n *Node) checkJoin(ctx context.Context, req api.JoinRequest) error {
	if !n.promotesLater() {
		// An embedder's own Raft transport (in-memory tests) has its own
		// address space and nothing to dial: joins are taken as given.
		return nil
	}
	if err := validateJoin(req); err != nil {
		return err
	}
	if req.ID == n.cfg.ID {
		if req == n.self() {
			return nil // our own registration: these are our listeners
		}
		// Our id at other addresses: a second process (a copy of this
		// member's config started elsewhere, or a hand-made join). This
		// process is the live holder. Was: taken as our own, so the leader
		// re-addressed its own Raft voter to the stranger's address, lost
		// its quorum and left the cluster without a leader for good.
		return fmt.Errorf("%w: member %q is live at raft %s (the leader); a second process cannot take its id", api.ErrConflict, req.ID, n.cfg.RaftAdvertise)
	}
	p := n.prober()
	if m, ok := n.fsm.State().Member(req.ID); ok && (m.Raft != req.Raft || m.Peer != req.Peer || m.HTTP != req.HTTP) {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := p.Reach(pctx, m.Raft)
		cancel()
		if err == nil {
			return fmt.Errorf("%w: member %q is live at raft %s; a second process cannot take its id", api.ErrConflict, req.ID, m.Raft)
		}
	}
	for _, a := range [...]struct{ name, addr string }{{"raft", req.Raft}, {"peer", req.Peer}} {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := p.Reach(pctx, a.addr)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: cannot reach the joining member's %s address %s: %w", api.ErrBadRequest, a.name, a.addr, err)
		}
	}
	return nil
}

// promoteNonvoters runs promoteLater for every non-voter of the Raft
// configuration that the cluster lists as an active member at the same
// Raft address: a leader that lost the lead while a member was catching
// up took that member's promotion with it, and the new one takes it on.
// A member left a non-voter because the cluster had MaxVoters voters is
// looked at again too, and stays one (promote checks the room). The
// failure detector runs it too when a voter has left, so that a
// non-voter takes the seat.
func (n *Node) promoteNonvoters() {
	if !n.promotesLater() {
		return
	}
	cf := n.raft.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	st := n.fsm.State()
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage != raft.Nonvoter {
			continue
		}
		if m, ok := st.Member(string(s.ID)); ok && m.State == fsm.Active && m.Raft == string(s.Address) {
			n.promoteLater(api.JoinRequest{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer})
		}
	}
}

// raftVoters counts the voters among servers.
func raftVoters(servers []raft.Server) int {
	n := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// errReaddressed: the member to promote joined again at another Raft
// address since its promotion was planned; that join plans its own.
var errReaddressed = errors.New("re-addressed since it joined")

// promoteLater makes a member that joined as a non-voter a voter once it
// has caught up (its /readyz answers), if there is still room for a voter.
// It keeps trying, every promotionPoll for at most promotionTimeout, while
// this node leads; when the lead moves, the new leader takes it over
// (promoteNonvoters).
func (n *Node) promoteLater(req api.JoinRequest) {
	n.promotingMu.Lock()
	if n.promoting == nil {
		n.promoting = make(map[string]bool)
	}
	if n.promoting[req.ID] {
		n.promotingMu.Unlock()
		return
	}
	n.promoting[req.ID] = true
	n.promotingMu.Unlock()
	n.goLoop(func() {
		defer func() {
			n.promotingMu.Lock()
			delete(n.promoting, req.ID)
			n.promotingMu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(n.ctx, promotionTimeout)
		defer cancel()
		t := time.NewTicker(promotionPoll)
		defer t.Stop()
		for {
			rctx, rcancel := context.WithTimeout(ctx, probeTimeout)
			err := n.prober().Ready(rctx, req.HTTP)
			rcancel()
			if err == nil {
				err = n.promote(req)
				if err == nil {
					return
				}
				n.log.Warn("promoting a caught-up member to voter", "id", req.ID, "err", err)
				if errors.Is(err, errReaddressed) || !n.isLeader() {
					return // its new join, or the new leader, takes it on
				}
			}
			select {
			case <-ctx.Done():
				n.log.Warn("a member did not catch up; it stays a non-voter", "id", req.ID, "err", err)
				return
			case <-t.C:
			}
		}
	})
}

func (n *Node) promote(req api.JoinRequest) error {
	n.membership.lock()
	defer n.membership.unlock()
	if !n.isLeader() {
		return errors.New("no longer the leader")
	}
	cf := n.raft.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	voters, found := 0, false
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
		if s.ID == raft.ServerID(req.ID) {
			if s.Suffrage == raft.Voter {
				// Promoted already (by us or an earlier leader), maybe
				// without its flag: that write may have been lost.
				return n.syncVoterFlags()
			}
			if s.Address != raft.ServerAddress(req.Raft) {
				return errReaddressed
			}
			found = true
		}
	}
	if !found || voters >= MaxVoters {
		return nil
	}
	if _, err := n.await(n.ctx, n.raft.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.Raft), 0, applyTimeout), "membership change"); err != nil {
		return err
	}
	n.log.Info("member promoted to voter", "id", req.ID)
	return n.syncVoterFlags()
}

// voterFlagFixes returns the active members of st whose Voter flag is not
// what Raft's configuration servers says (a member missing from it does
// not vote), each with its flag corrected.
//
// The flag is written after the Raft change it records (join, promote),
// so a write lost in between (the lead moved, a timeout, a shutdown)
// leaves it stale. Only active members are corrected: AddMember, the one
// command that writes the flag, makes a member active too. A member that
// is down or dead gets its flag from Raft when it joins again.
func voterFlagFixes(st *fsm.State, servers []raft.Server) []fsm.Member {
	var fixes []fsm.Member
	for _, m := range st.Members {
		if m.State != fsm.Active {
			continue
		}
		voter := false
		for _, s := range servers {
			if s.ID == raft.ServerID(m.ID) {
				voter = s.Suffrage == raft.Voter
				break
			}
		}
		if m.Voter != voter {
			m.Voter = voter
			fixes = append(fixes, m)
		}
	}
	return fixes
}

// syncVoterFlags writes the corrections of voterFlagFixes through the
// log. The caller holds n.membership (so no other membership change runs
// meanwhile) and leads.
func (n *Node) syncVoterFlags() error {
	fixes, err := n.voterFlagFixes()
	if err != nil || len(fixes) == 0 {
		return err
	}
	// A leader early in its term may not have applied all of the log
	// yet, and AddMember writes a member's addresses with its flag: wait
	// until the state is current rather than write an old address back.
	if _, err := n.await(n.ctx, n.raft.raft.Barrier(applyTimeout), "barrier"); err != nil {
		return raftUnavailable("waiting for the log before correcting voter flags", err)
	}
	if fixes, err = n.voterFlagFixes(); err != nil {
		return err
	}
	for _, m := range fixes {
		cmd, err := fsm.AddMember(m)
		if err != nil {
			return err
		}
		if err := n.apply(n.ctx, cmd); err != nil {
			return err
		}
		n.log.Info("member's voter flag set as Raft has it", "id", m.ID, "voter", m.Voter)
	}
	return nil
}

func (n *Node) voterFlagFixes() ([]fsm.Member, error) {
	cf := n.raft.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, err
	}
	return voterFlagFixes(n.fsm.State(), cf.Configuration().Servers), nil
}

// syncVoterFlagsLater runs syncVoterFlags in the background while this
// node leads, unless a run is under way. The leader's liveness loop
// (detectLoop) calls it whenever a tick finds a stale flag, the first
// tick after it gains the lead included, so a failed run is retried.
func (n *Node) syncVoterFlagsLater() {
	n.leaderChoreLater(&n.syncingVoters, "setting members' voter flags as Raft has them", n.syncVoterFlags)
}

// leaderChoreLater runs chore in the background under the membership
// lock (no other membership change runs meanwhile) if this node then
// leads, unless a run flagged by busy is under way; a chore's error is
// logged as a warning about what. Its caller, the leader's liveness loop
// (detectLoop), asks again at a later tick while there is work left.
func (n *Node) leaderChoreLater(busy *atomic.Bool, what string, chore func() error) {
	if !busy.CompareAndSwap(false, true) {
		return
	}
	n.goLoop(func() {
		defer busy.Store(false)
		n.membership.lock()
		defer n.membership.unlock()
		if !n.isLeader() {
			return
		}
		if err := chore(); err != nil {
			n.log.Warn(what, "err", err)
		}
	})
}

// leaderInConfig reports whether the Raft leader is a server of this node's
// configuration (a stranger that took the lead is not a leader to serve
// under).
func (n *Node) leaderInConfig() bool {
	addr, id := n.raft.raft.LeaderWithID()
	cfg := n.raft.raft.GetConfiguration().Configuration()
	for _, s := range cfg.Servers {
		if s.ID == id && s.Address == addr {
			return true
		}
	}
	return false
}
