package clustertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/internal/pause"
	"github.com/ringlimit/ringlimit/transport"
)

// ErrRefused is what a call to a member that is not running gets (a
// crashed process: connection refused).
var ErrRefused = errors.New("clustertest: connection refused")

// link is the state of one direction between two members.
type link struct {
	cut     bool          // packets are dropped: calls hang until their deadline
	delay   time.Duration // added before delivery
	raftCut bool          // Raft's packets alone are dropped (see CutRaft)
	// callsCut drops the data-plane calls made in this direction alone:
	// the other side's calls, and their answers, still pass (see CutCalls).
	callsCut bool
	// handoffDelay and backupDelay hold each hand-off push, and each
	// backup push, that carries parts that long before delivery (see
	// SetHandoffDelay, SetBackupDelay); every other call passes at once.
	handoffDelay, backupDelay time.Duration
}

// network is the in-memory data plane and the link table that Raft's
// in-memory transports follow too. Addresses are member ids prefixed with
// "peer-"; every call knows its sender, so links are directional.
type network struct {
	mu       sync.Mutex
	members  map[string]*Member // by id; guarded by mu
	links    map[[2]string]link // (from, to) → state; guarded by mu
	byPeer   map[string]string  // peer address → id; guarded by mu
	byHTTP   map[string]string  // HTTP address → id; guarded by mu
	drops    map[[2]string]int  // calls dropped per link, for tests; guarded by mu
	log      *slog.Logger       // set once: each decided check at debug (CLUSTERTEST_LOG), or nil
	maxFrame int                // the largest push frame that goes (Options.MaxFrame); guarded by mu
}

func newNetwork() *network {
	return &network{members: map[string]*Member{}, links: map[[2]string]link{}, byPeer: map[string]string{}, byHTTP: map[string]string{}, drops: map[[2]string]int{}}
}

// frameLimit is the largest push frame that goes now.
func (n *network) frameLimit() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.maxFrame
}

func (n *network) link(from, to string) link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.links[[2]string{from, to}]
}

// route finds the member at addr and applies the link from → it: it
// returns the member to deliver to, or the error the caller sees (after
// waiting out a cut link's silence until ctx ends).
func (n *network) route(ctx context.Context, from, addr string) (*Member, error) {
	n.mu.Lock()
	id, ok := n.byPeer[addr]
	m := n.members[id]
	l := n.links[[2]string{from, id}]
	back := n.links[[2]string{id, from}]
	dropped := l.cut || back.cut || l.callsCut
	if ok && dropped {
		n.drops[[2]string{from, id}]++
	}
	n.mu.Unlock()
	if !ok || m == nil {
		return nil, fmt.Errorf("%w: no member at %s", ErrRefused, addr)
	}
	if dropped {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if l.delay > 0 {
		if err := pause.For(ctx, l.delay); err != nil {
			return nil, err
		}
	}
	if !m.running() {
		return nil, fmt.Errorf("%w: %s is not running", ErrRefused, id)
	}
	return m, nil
}

// holdPush waits out the delay of the link from → to for a push of
// kind that carries parts, or until ctx ends.
func (n *network) holdPush(ctx context.Context, from, to string, kind transport.PushKind) error {
	l, d := n.link(from, to), time.Duration(0)
	switch kind {
	case transport.PushHandoff:
		d = l.handoffDelay
	case transport.PushBackup:
		d = l.backupDelay
	}
	if d > 0 {
		return pause.For(ctx, d)
	}
	return nil
}

// endpoint is one member's (or router's) side of the data plane: it
// implements router.Remote and node.DataPlane.
type endpoint struct {
	net  *network
	from string
}

func (e endpoint) Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	m, err := e.net.route(ctx, e.from, addr)
	if err != nil {
		return err
	}
	// What a real peer sees is a decoded copy, never the sender's memory.
	in := &transport.BatchRequest{Epoch: req.Epoch, RulesVersion: req.RulesVersion, Checks: slices.Clone(req.Checks)}
	out := &transport.BatchResponse{Results: make([]transport.Result, len(in.Checks))}
	for i := range out.Results {
		out.Results[i] = transport.Result{Status: transport.StatusInternal}
	}
	m.node().HandleBatch(ctx, in, out)
	logDecided(e.net.log, m.ID, in, out)
	if err := ctx.Err(); err != nil {
		return err
	}
	resp.Epoch, resp.Results = out.Epoch, append(resp.Results[:0], out.Results...)
	return nil
}

func (e endpoint) Push(ctx context.Context, addr string, push *transport.Push, ack *transport.PushAck) error {
	// As transport.Client refuses it: before it goes anywhere.
	if size, limit := transport.PushFrameSize(push), e.net.frameLimit(); size > limit {
		return &transport.FrameTooLargeError{Size: uint64(size), Limit: limit}
	}
	m, err := e.net.route(ctx, e.from, addr)
	if err != nil {
		return err
	}
	if len(push.Parts) > 0 {
		if err := e.net.holdPush(ctx, e.from, m.ID, push.Kind); err != nil {
			return err
		}
	}
	// Every field as the wire carries it (a copy named fields once, and
	// lost Delta and the rules version as they came), the data copied as
	// the server's decoder does.
	in := new(transport.Push)
	*in = *push
	in.Parts = nil
	for _, p := range push.Parts {
		p.Data = slices.Clone(p.Data)
		in.Parts = append(in.Parts, p)
	}
	out := &transport.PushAck{Status: make([]transport.PushStatus, len(in.Parts))}
	for i := range out.Status {
		out.Status[i] = transport.PushRejected
	}
	m.node().HandlePush(ctx, in, out)
	if err := ctx.Err(); err != nil {
		return err
	}
	*ack = *out
	return nil
}

// logDecided logs each check of req that owner answered in resp, when
// log is set: which member decided a key, and how, is what a failure of
// a budget test asks first.
func logDecided(log *slog.Logger, owner string, req *transport.BatchRequest, resp *transport.BatchResponse) {
	if log == nil {
		return
	}
	for i := range req.Checks {
		c, r := &req.Checks[i], &resp.Results[i]
		log.Debug("clustertest: decided", "node", owner, "epoch", resp.Epoch, "req_epoch", req.Epoch,
			"p", c.Partition, "kh", c.KeyHash, "cost", c.Cost, "status", r.Status, "allowed", r.Allowed, "remaining", r.Remaining)
	}
}
