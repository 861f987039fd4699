package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// NextView builds the view of FSM state st, given the previous view (nil
// for the first): the ring is rebuilt only when the membership or the
// ring config changed, so an unchanged ring keeps its identity (callers
// compare pointers to see a ring change).
func NextView(prev *view.View, st *fsm.State) (*view.View, error) {
	var r *ring.Ring
	if prev != nil && prev.Ring.Epoch() == st.MembershipIndex && prev.Ring.Config() == st.Config.Ring() {
		r = prev.Ring
	} else {
		var members []ring.Member
		for _, m := range st.Active() {
			members = append(members, ring.Member{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer})
		}
		var err error
		if r, err = ring.New(st.Config.Ring(), st.MembershipIndex, members); err != nil {
			return nil, err
		}
	}
	return view.New(r, st.Config.Seed, rules.Effective(st.Rules), st.RulesIndex), nil
}

// awaiting lists the gained partitions that wait for a hand-off.
func (m Moves) awaiting() []uint32 {
	var ps []uint32
	for p, g := range m.Gained {
		if g == GainAwait && !m.CopyOnly[p] {
			ps = append(ps, p)
		}
	}
	return ps
}

// awaitingCopies lists the partitions m awaits for a backup copy alone
// (AwaitCopies).
func (m Moves) awaitingCopies() []uint32 {
	var ps []uint32
	for p := range m.CopyOnly {
		ps = append(ps, p)
	}
	return ps
}

// handoffs sends the partitions a ring change took from this member to
// their new owners, retrying (and re-targeting when the ring moves on)
// until each is taken or the node stops.
type handoffs struct {
	n       *Node
	mu      sync.Mutex
	pending int           // partitions not yet acknowledged; guarded by mu
	idle    chan struct{} // closed when pending drops to 0; guarded by mu
	// under is the deliveries under way (deliver); guarded by mu.
	under map[*delivery]struct{}
	// given is closed by abandon: the deliveries stop; guarded by mu
	// (abandoned, once closed).
	given     chan struct{}
	abandoned bool
}

// delivery is what one deliver loop has left to push.
type delivery struct {
	group []Outgoing // guarded by handoffs.mu
	// failing is since when its pushes fail without an answer (the
	// target unreachable); zero once one is answered. Guarded by
	// handoffs.mu.
	failing time.Time
	// insured holds the partitions of group that a backup took as well
	// (insureWithBackups): their state survives the target's crash
	// without this member. Guarded by handoffs.mu.
	insured map[uint32]bool
}

func newHandoffs(n *Node) *handoffs {
	h := &handoffs{n: n, idle: make(chan struct{}), under: map[*delivery]struct{}{}, given: make(chan struct{})}
	close(h.idle)
	return h
}

// track records d's progress: what it has left, and whether its last
// push failed unanswered (or was refused whole, which stranded counts
// the same). It reports whether the hand-offs were
// abandoned meanwhile (the caller stops: what it had left was taken).
func (h *handoffs) track(d *delivery, group []Outgoing, unanswered bool) (abandoned bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d.group = group
	switch {
	case !unanswered:
		d.failing = time.Time{}
	case d.failing.IsZero():
		d.failing = time.Now()
	}
	return h.abandoned
}

// stranded reports whether every hand-off left has failed unanswered for
// at least strandedAfter while v's ring lists one member, not this one
// (the last active member of a cluster stopped together, which the
// cluster never marks down, and whose process is gone or cut off), or
// while there is no Raft leader (several stopped together: the members
// left cannot mark the gone ones down). The ring will not move these
// partitions elsewhere; waiting out the drain gains nothing.
func (h *handoffs) stranded(v *view.View) bool {
	if v == nil {
		return false
	}
	if ms := v.Ring.Members(); (len(ms) != 1 || ms[0].ID == h.n.cfg.ID) && !h.n.leaderless() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == 0 || len(h.under) == 0 {
		return false
	}
	for d := range h.under {
		if len(d.group) > 0 && (d.failing.IsZero() || time.Since(d.failing) < strandedAfter) {
			return false
		}
	}
	return true
}

// insuredAll reports whether every hand-off left has failed unanswered
// for at least strandedAfter and was taken by its partition's backup as
// well (insureWithBackups): waiting longer only waits for a target that
// may have crashed, whose partitions its backup will serve with this
// member's state once it is marked dead. (A Lost part carries no state.)
func (h *handoffs) insuredAll() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == 0 || len(h.under) == 0 {
		return false
	}
	for d := range h.under {
		if len(d.group) == 0 {
			continue
		}
		if d.failing.IsZero() || time.Since(d.failing) < strandedAfter {
			return false
		}
		for _, og := range d.group {
			if !og.Part.Lost && !d.insured[og.Part.Partition] {
				return false
			}
		}
	}
	return true
}

// strandedAfter is how long a stopping member keeps pushing hand-offs
// to a sole remaining member that does not answer (stranded).
const strandedAfter = time.Second

// abandon stops every delivery under way and returns what they had left
// to push (some may land meanwhile: a duplicate is merged as one).
func (h *handoffs) abandon() []Outgoing {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.abandoned {
		h.abandoned = true
		close(h.given)
	}
	var left []Outgoing
	for d := range h.under {
		left = append(left, d.group...)
	}
	return left
}

// send pushes out to their owners in the background.
func (h *handoffs) send(epoch uint64, out []Outgoing) {
	if len(out) == 0 {
		return
	}
	h.mu.Lock()
	if h.pending == 0 {
		h.idle = make(chan struct{})
	}
	h.pending += len(out)
	h.mu.Unlock()
	byOwner := map[string][]Outgoing{}
	var later []Outgoing
	for _, o := range out {
		if o.awaited {
			later = append(later, o)
			continue
		}
		byOwner[o.To.ID] = append(byOwner[o.To.ID], o)
	}
	for _, group := range byOwner {
		// Registered now, not on its goroutine: owes counts it from here.
		d := h.register(group)
		if !h.n.goLoop(func() { h.deliverAs(epoch, d) }) {
			h.mu.Lock()
			delete(h.under, d)
			h.mu.Unlock()
		}
	}
	if len(later) > 0 {
		// A Lost part makes a receiver that holds a copy of the
		// partition serve it at once from that copy. For a partition
		// this member awaited, the state is on its way here: refused
		// now, its sender takes it to the new owner, whom it should
		// reach first.
		h.n.goLoop(func() {
			t := time.NewTimer(lostDelay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-h.n.ctx.Done():
			case <-h.given:
			}
			h.deliver(epoch, later)
		})
	}
}

// announce tells each of targets, every announceEvery from now on, that
// a hand-off from this member is on its way to it, with an empty
// hand-off push (its receiver notes the sender: Owner.sawHandoff, and
// its hand-off wait goes on: expireUnlessArriving), for as long as this
// member owes it one (owes), at most handoffWaitMore. The caller is
// about to apply the ring of epoch that moves partitions of this member
// to targets, and calls the function returned once it has handed their
// hand-offs to send: the exports come first, and a new owner's hand-off
// wait counts from its own apply of the ring.
//
// Was: nothing until the first push, which a sender of a million states
// exports, restamps and encodes first: 2–3 s on a starved machine, most
// of a joining member's 3.75 s wait.
func (h *handoffs) announce(epoch uint64, targets []ring.Member) (sent func()) {
	if len(targets) == 0 {
		return func() {}
	}
	exporting := make(chan struct{})
	for _, to := range targets {
		h.announceWhile(epoch, to, func() bool {
			select {
			case <-exporting:
				return h.owes(to.ID)
			default:
				return true
			}
		})
	}
	return sync.OnceFunc(func() { close(exporting) })
}

// announceWhile sends member to, now and every announceEvery while on()
// holds, at most handoffWaitMore, an empty hand-off push of the ring of
// epoch (see announce).
func (h *handoffs) announceWhile(epoch uint64, to ring.Member, on func() bool) {
	n := h.n
	n.goLoop(func() {
		t := time.NewTicker(announceEvery)
		defer t.Stop()
		until := time.Now().Add(handoffWaitMore)
		for {
			ctx, cancel := context.WithTimeout(n.ctx, announceEvery)
			_ = n.cfg.DataPlane.Push(ctx, to.Peer, &transport.Push{Kind: transport.PushHandoff, Epoch: epoch, From: n.cfg.ID}, &transport.PushAck{})
			cancel()
			select {
			case <-n.ctx.Done():
				return
			case <-h.given:
				return
			case <-t.C:
			}
			if !on() || time.Now().After(until) {
				return
			}
		}
	})
}

// handoffTargets lists, once each, the members of rg that lost names as
// the new owners of partitions this member gives up (Moves.Lost).
func handoffTargets(rg *ring.Ring, lost map[uint32]string) []ring.Member {
	var out []ring.Member
	seen := map[string]bool{}
	for _, id := range lost {
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		if m, ok := rg.Member(id); ok {
			out = append(out, m)
		}
	}
	return out
}

// announceEvery is how often announce tells a member that a hand-off is
// on its way (well within the handoffTimeout a receiver looks back).
const announceEvery = time.Second

// owes reports whether a delivery under way has a part for member id.
func (h *handoffs) owes(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for d := range h.under {
		for _, og := range d.group {
			if og.To.ID == id {
				return true
			}
		}
	}
	return false
}

// lostDelay is how long a Lost part for a partition this member awaited
// itself waits before it goes (handoffs.send): longer than a hand-off
// refused here takes to be pushed again to the new owner.
const lostDelay = 500 * time.Millisecond

// done counts k partitions handed off (or given up). Zero changes
// nothing: a delivery that ends with nothing left may be the last, and
// idle is closed already.
func (h *handoffs) done(k int) {
	if k == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending -= k
	if h.pending == 0 {
		close(h.idle)
	}
}

// wait waits until every hand-off was taken or ctx ends.
func (h *handoffs) wait(ctx context.Context) error {
	select {
	case <-h.idleCh():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// idleCh is closed once every hand-off sent so far was taken.
func (h *handoffs) idleCh() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.idle
}

// Pending is how many partitions this member still has to hand off.
func (h *handoffs) Pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pending
}

// deliver pushes parts (all for one member at first) until each is taken.
// Every attempt sends them as of its own instant (sendable): a part that
// waited for a retry or a new owner arrives as old as its states are.
func (h *handoffs) deliver(epoch uint64, group []Outgoing) {
	h.deliverAs(epoch, h.register(group))
}

// register records a delivery of group as under way (and so owed to its
// targets: owes) and returns it, for deliverAs.
func (h *handoffs) register(group []Outgoing) *delivery {
	d := &delivery{group: group, insured: map[uint32]bool{}}
	h.mu.Lock()
	h.under[d] = struct{}{}
	h.mu.Unlock()
	return d
}

// deliverAs is deliver for the delivery d, registered (register).
func (h *handoffs) deliverAs(epoch uint64, d *delivery) {
	n := h.n
	group := d.group
	backoff := 20 * time.Millisecond
	insuredTo := map[string]bool{} // targets whose parts went to the backups (insureWithBackups)
	warnedTooLarge := false        // a part too large for any push was logged
	defer func() {
		h.mu.Lock()
		delete(h.under, d)
		h.mu.Unlock()
	}()
	for len(group) > 0 {
		if n.ctx.Err() != nil {
			h.done(len(group))
			return
		}
		changed := n.cell.Changed() // before this attempt reads the view
		to := group[0].To
		var batch, rest []Outgoing
		for _, o := range group {
			if o.To.ID == to.ID {
				batch = append(batch, o)
			} else {
				rest = append(rest, o)
			}
		}
		push := &transport.Push{Kind: transport.PushHandoff, Epoch: epoch, From: n.cfg.ID}
		batch, over := n.fitPush(push, batch)
		rest = append(rest, over...)
		var ack transport.PushAck
		err := n.pushWithin(2*time.Second, to.Peer, push, &ack)
		if n.log.Enabled(n.ctx, slog.LevelDebug) {
			n.log.Debug("hand-off pushed", "to", to.ID, "epoch", epoch, "parts", debugParts(push.Parts, ack.Status), "ack_epoch", ack.Epoch, "err", err)
		}
		var retry []Outgoing
		refused := err != nil
		settled := 0 // parts this attempt settled (taken, or given up)
		if err != nil {
			n.log.Debug("hand-off failed", "to", to.ID, "parts", len(batch), "lost", lostParts(batch), "err", err)
			if tooLarge := (*transport.FrameTooLargeError)(nil); errors.As(err, &tooLarge) && !warnedTooLarge {
				// One part alone (fitPush): no attempt will carry it.
				warnedTooLarge = true
				n.log.Error("a partition's hand-off is larger than the data plane's largest frame and cannot be sent; its owner will serve it without this state", "to", to.ID, "partition", batch[0].Part.Partition, "err", err)
			}
			if (n.stopping.Load() || n.removed.Load()) && !insuredTo[to.ID] {
				// Going, and its target does not answer: the target may
				// have crashed, and this member will not see it marked
				// dead (it will be gone, or out of Raft). Give the parts
				// to their backups too, once per target.
				insuredTo[to.ID] = true
				taken := n.insureWithBackups(epoch, to.ID, push.Parts)
				h.mu.Lock()
				for _, p := range taken {
					d.insured[p] = true
				}
				h.mu.Unlock()
			}
			// The target may have died since (and the ring moved on):
			// send each part to whoever owns it now.
			retry, settled = h.readdress(n.cell.Load(), batch, "", 0)
		} else {
			taken := 0
			var moved []Outgoing
			for i, st := range ack.Status {
				switch st {
				case transport.PushOK:
					taken++
				case transport.PushNotOwner:
					moved = append(moved, batch[i]) // the ring moved on
				default:
					retry = append(retry, batch[i])
				}
			}
			// Every part refused: the target cannot take them now (it
			// is stopping and has saved its own state, say), which for
			// stranded counts as no answer.
			refused = len(retry) == len(batch)
			if taken > 0 {
				n.m.handoffParts.Add(float64(taken))
			}
			settled = taken
			if len(moved) > 0 {
				again, k := h.readdress(n.cell.Await(n.ctx, ack.Epoch, 0, time.Second), moved, to.ID, ack.Epoch)
				retry = append(retry, again...)
				settled += k
			}
			epoch = max(epoch, ack.Epoch)
		}
		if n.stopping.Load() {
			// A Lost part carries no state: it only spares its receiver
			// the wait for a hand-off that will not come (its hand-off
			// wait ends that too). A member that stops does not wait its
			// drain out for one its target could not take (was: the
			// whole drain, when the target had stopped too).
			k := len(retry)
			retry = slices.DeleteFunc(retry, func(o Outgoing) bool { return o.Part.Lost })
			settled += k - len(retry)
		}
		group = append(rest, retry...)
		// What is left is recorded before what landed is counted: the
		// count reaching zero lets a stopping member take what is left
		// (abandon) for its bucket file at once, and a part already
		// taken must not be in it (see settle).
		if h.settle(d, group, refused, settled) {
			return
		}
		if len(retry) > 0 {
			// A new view ends the pause: the ring that moved on from a
			// target that fails (dead, then marked so) names the part's
			// owner now, which is sent it at once rather than a backoff
			// (up to 1 s) later, while it serves the partition from its
			// backup copy.
			t := time.NewTimer(backoff)
			settled = 0
			select {
			case <-t.C:
			case <-changed:
				group, settled = h.readdress(n.cell.Load(), group, "", 0)
			case <-n.ctx.Done():
			case <-h.given:
			}
			t.Stop()
			backoff = min(2*backoff, time.Second)
			if h.settle(d, group, refused, settled) {
				return
			}
		}
	}
}

// settle records group as what delivery d has left to push, then counts
// settled parts done; once abandoned it gives up what is left (counted
// done too) and reports true. In that order: a stopping member that sees
// the count reach zero takes what is left at once (abandon) for its
// bucket file, and a part already taken must not be in it. Was: counted
// first, and a stop saved hand-offs its target had just taken; at the
// next start it handed them again, and an empty copy among them (a
// partition it awaited, passed on from its backup copy) ended the wait
// of an owner still awaiting the real state from the member that held
// it, which then served those keys from nothing.
func (h *handoffs) settle(d *delivery, group []Outgoing, unanswered bool, settled int) (abandoned bool) {
	abandoned = h.track(d, group, unanswered)
	h.done(settled)
	if abandoned {
		h.done(len(group))
	}
	return abandoned
}

// lostParts counts the Lost parts of batch (they carry no state).
func lostParts(batch []Outgoing) int {
	k := 0
	for _, o := range batch {
		if o.Part.Lost {
			k++
		}
	}
	return k
}

// sendable returns the parts of batch as they go out now: each
// restamped from its export to this instant of the owner's clock
// (Owner.sendable), at every attempt, from the data exported once.
func (n *Node) sendable(batch []Outgoing) []transport.PushPart {
	parts := make([]transport.PushPart, len(batch))
	o := n.owner.Load()
	if o == nil { // unreachable: the owner that exported them is kept
		for i, og := range batch {
			parts[i] = og.Part
		}
		return parts
	}
	now := o.now()
	for i, og := range batch {
		parts[i] = o.sendable(og, now)
	}
	return parts
}

// fitPush fills push with the parts of batch as they go out now
// (sendable), in order, while its frame stays within the data plane's
// largest (Config.MaxPushFrame), and returns the parts of batch it holds
// and those left for the next push. It takes one part at least: one
// that alone is larger cannot go in any push (deliver says so).
//
// Was: every part for one member in one push. A whole cluster's last
// member, restarted after the others with busy sliding logs in its
// bucket file (exact: ~26 MB for one owner's share), had its hand-off
// refused by its own client before it left (over the 16 MiB frame),
// again every second and logged at debug alone, while the owner served
// those partitions from nothing once its hand-off wait ended.
func (n *Node) fitPush(push *transport.Push, batch []Outgoing) (in, over []Outgoing) {
	limit := n.maxPushFrame()
	// With room for the varint of the part count to grow.
	size := transport.PushFrameSize(push) + binary.MaxVarintLen32
	for i := range batch {
		pt := n.sendable(batch[i : i+1])[0]
		k := transport.PushPartSize(&pt)
		if i > 0 && size+k > limit {
			return batch[:i], batch[i:]
		}
		push.Parts = append(push.Parts, pt)
		size += k
	}
	return batch, nil
}

// pushWithin pushes push to the member at peer over the data plane,
// allowed base to be answered plus 0.25 s for each MiB of its frame (4 s
// more for a full 16 MiB frame). Was: base alone (2 s for a hand-off,
// 1 s for a backup push), whatever the push carried: on a machine
// starved of CPU a 16 MiB push, written, read and imported, can take
// longer, and a push that always times out is sent again and again and
// never counts as taken.
func (n *Node) pushWithin(base time.Duration, peer string, push *transport.Push, ack *transport.PushAck) error {
	d := base + time.Duration(transport.PushFrameSize(push))*time.Second/(4<<20)
	ctx, cancel := context.WithTimeout(n.ctx, d)
	defer cancel()
	return n.cfg.DataPlane.Push(ctx, peer, push, ack)
}

// maxPushFrame is the most bytes one push's frame may hold
// (Config.MaxPushFrame, the data plane's default when 0).
func (n *Node) maxPushFrame() int {
	if n.cfg.MaxPushFrame > 0 {
		return n.cfg.MaxPushFrame
	}
	return transport.DefaultMaxFrameSize
}

// readdress sends parts where view v says they belong now: to another
// owner (returned, to push again), or nowhere when nobody owns them.
// settled counts the parts that need no further push.
//
// Parts the ring gave back to this member (their target died, or refused
// them as NOT_OWNER under a newer ring) are taken back into its own table
// (Owner.TakeBack): merged into what it serves, or, into a partition that
// awaits its hand-off, held and merged with that hand-off when it comes
// (whoever owned the partition in between may have served it). Dropping
// them lost the state (a refused hand-off was not taken); a copy the
// target took after all (its answer was lost) comes back in its own
// hand-off and is merged as a duplicate. A Lost part holds nothing and is
// not taken back. A part the owner side
// refuses (its partition is moving out under a newer ring right now)
// goes back to its old target, whose answer (NOT_OWNER at the newer
// epoch, or an error once that ring is ours) sends it on.
//
// refusedBy, when set, is the member that refused parts as NOT_OWNER at
// its view of epoch refusedAt: a part this member takes back whose
// partition awaits that member's hand-off alone waits no longer than
// handoffTimeout (Owner.AwaitedFromAlone).
func (h *handoffs) readdress(v *view.View, parts []Outgoing, refusedBy string, refusedAt uint64) (retry []Outgoing, settled int) {
	n := h.n
	if v == nil {
		return parts, 0
	}
	var mine []Outgoing
	for _, og := range parts {
		m, ok := v.Ring.Owner(og.Part.Partition)
		switch {
		case !ok:
			settled++ // nobody owns it: nothing to hand
		case m.ID == n.cfg.ID && og.Part.Lost:
			settled++ // nothing to take back
		case m.ID == n.cfg.ID:
			mine = append(mine, og)
		default:
			og.To = m
			retry = append(retry, og)
		}
	}
	if len(mine) == 0 {
		return retry, settled
	}
	o := n.owner.Load()
	if o == nil {
		return append(retry, mine...), settled
	}
	status := make([]transport.PushStatus, len(mine))
	o.TakeBack(n.ctx, v.Epoch(), n.sendable(mine), status)
	var taken []uint32
	for i, st := range status {
		if st == transport.PushOK {
			settled++
			taken = append(taken, mine[i].Part.Partition)
		} else {
			retry = append(retry, mine[i])
		}
	}
	if refusedBy != "" && len(taken) > 0 {
		h.expireSoon(o.AwaitedFromAlone(refusedBy, refusedAt, taken))
	}
	return retry, settled
}

// expireSoon promotes, once handoffTimeout has passed, the partitions of
// byEpoch (by the epoch of the ring each began awaiting under) that
// still await their hand-off (Owner.AwaitedFromAlone).
func (h *handoffs) expireSoon(byEpoch map[uint64][]uint32) {
	for epoch, parts := range byEpoch {
		h.after(handoffTimeout, func(o *Owner) {
			if k := o.ExpireAwaitingSince(epoch, parts); k > 0 {
				h.n.log.Info("hand-off not coming: the member awaited refused this member's own hand-off of the partitions and never held them; serving them", "epoch", epoch, "partitions", k)
			}
		})
	}
}

// handoffWait is how long a gained partition waits for its hand-off
// before its backup copy is promoted: handoffTimeout, or longer when a
// member's lease (memberLease) is longer. An old owner that has not seen
// the ring change (cut off from Raft) answers for the partition until its
// lease, renewed last before the leader's epoch moved on, runs out, so
// the backup copy may only be promoted after that: the lease and the
// leader's margin after this member saw the change.
func (n *Node) handoffWait() time.Duration {
	return max(handoffTimeout, memberLease(n.cfg.DeadAfter)+leaseMargin(n.cfg.DeadAfter))
}

// expireLater promotes the backup copies of parts, which began awaiting
// their hand-off under the ring of epoch, that still await it once
// handoffWait has passed; one that began awaiting afresh under a newer
// ring meanwhile waits for that ring's timer (Owner.ExpireAwaitingSince).
// One whose hand-off is still arriving then waits on, up to
// handoffWaitMore longer (expireUnlessArriving).
func (h *handoffs) expireLater(epoch uint64, parts []uint32) {
	h.after(h.n.handoffWait(), func(o *Owner) {
		h.expireUnlessArriving(o, epoch, parts, o.mono()+int64(handoffWaitMore), false, false)
	})
}

// expireCopiesLater serves parts, awaited for a backup copy alone under
// the ring of epoch (AwaitCopies), after handoffTimeout: from the copies
// that came, or from nothing, counted. Their owner is dead, its lease
// long over (it went without contact for --dead-after), so their wait
// need not be handoffWait. A copy still on its way then (its holder,
// starved, applied the ring that marked the owner dead a second or two
// after this member, and says so: Node.sendCopies) is waited for on, as
// a hand-off is (expireUnlessArriving).
func (h *handoffs) expireCopiesLater(epoch uint64, parts []uint32) {
	h.after(handoffTimeout, func(o *Owner) {
		h.expireUnlessArriving(o, epoch, parts, o.mono()+int64(handoffWaitMore), true, false)
	})
}

// expireUnlessArriving promotes the partitions of parts (awaiting since
// the ring of epoch) whose hand-off is not arriving, and looks again at
// the others every handoffRecheck: each waits on while its hand-off's
// sender (any sender, for a partition awaited from no one member alone)
// had a hand-off push arrive here, or parts of one taken, in the last
// handoffTimeout, until until (monotonic ns since the owner's start),
// after which all are promoted. One that holds nothing to serve from
// waits on too while a member of the ring does not answer a ping, or
// just left it (Node.memberSilent): killed, not yet marked dead, it may
// have been handing the partition off, and once the kill is marked the
// member that kept a copy passes it on (Owner.Reserves); serving it from
// nothing meanwhile readmits every spent key (live, scenario 14 with a
// kill: 6 to 77 partitions, 140 to 1,480 of a 20,000-key sample).
// copies says the parts await copies (AwaitCopies), not hand-offs, and
// kept that the wait was extended already (both for the log).
//
// Was: every partition promoted when handoffWait ended. A member joining
// a cluster of 8M keys on a starved machine was still being sent its
// hand-offs, in 16 MiB pushes, when its 3 s wait ended: it served
// 159–198 partitions from nothing, their keys' budgets full again until
// the late hand-offs were merged (TestSlowHandoffIsAwaitedWhileItArrives).
func (h *handoffs) expireUnlessArriving(o *Owner, epoch uint64, parts []uint32, until int64, copies, kept bool) {
	since := int64(math.MaxInt64) // past until: no more waiting
	hold := false
	if now := o.mono(); now < until {
		since = now - int64(handoffTimeout)
		hold = h.n.memberSilent()
	}
	k, bare, arriving := o.expireAwaitingSince(epoch, parts, since, hold)
	switch {
	case k > bare && copies:
		h.n.log.Info("a dead owner's partitions this member held no copy of: serving the copies passed on", "epoch", epoch, "partitions", k-bare)
	case k > bare:
		h.n.log.Warn("hand-off did not arrive in time; serving the backup copies", "epoch", epoch, "partitions", k-bare)
	}
	switch {
	case bare > 0 && copies:
		h.n.log.Warn("a dead owner's partitions this member held no copy of, and no member passed one on: serving them from nothing, their keys' budgets start full", "epoch", epoch, "partitions", bare)
	case bare > 0:
		// Was: counted in the line above, so an owner and its
		// backup lost together read as a failover that kept the
		// budgets.
		h.n.log.Warn("hand-off did not arrive in time and this member holds no backup copy: serving the partitions from nothing, their keys' budgets start full", "epoch", epoch, "partitions", bare)
	}
	if len(arriving) == 0 {
		return
	}
	switch {
	case !kept && copies:
		h.n.log.Info("backup copies of a dead owner's partitions still on their way at the end of the wait for them: those partitions wait on",
			"epoch", epoch, "partitions", len(arriving), "at_most", handoffWaitMore)
	case !kept:
		h.n.log.Info("hand-offs still arriving at the end of the hand-off wait: their partitions wait on while parts keep coming",
			"epoch", epoch, "partitions", len(arriving), "at_most", handoffWaitMore)
	}
	h.after(handoffRecheck, func(o *Owner) { h.expireUnlessArriving(o, epoch, arriving, until, copies, true) })
}

// handoffWaitMore is how much longer than its hand-off wait a partition
// may wait for a hand-off that is still arriving (expireUnlessArriving);
// handoffRecheck is how often such a wait is looked at again.
const (
	handoffWaitMore = 30 * time.Second
	handoffRecheck  = 500 * time.Millisecond
)

// dropLoadedLater drops the loaded copies of parts that handOffLoaded
// kept, once handoffWait has passed: by then their hand-offs have landed,
// or been kept by their owners' backup copies' promotion.
func (h *handoffs) dropLoadedLater(parts []uint32) {
	h.after(h.n.handoffWait(), func(o *Owner) { o.dropLoadedAway(parts) })
}

// after calls f with the owner once d has passed, unless the member
// closes first.
func (h *handoffs) after(d time.Duration, f func(o *Owner)) {
	n := h.n
	n.goLoop(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if o := n.owner.Load(); o != nil {
			f(o)
		}
	})
}

// WaitHandoffs waits until this member has handed off every partition it
// gave up, or ctx ends.
func (n *Node) WaitHandoffs(ctx context.Context) error { return n.h.wait(ctx) }

// debugParts describes the parts of a push and their answers for a
// debug log line: "p:states/status", L for a Lost part.
func debugParts(parts []transport.PushPart, status []transport.PushStatus) string {
	var b strings.Builder
	for i, pt := range parts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:", pt.Partition)
		if pt.Lost {
			b.WriteString("L")
		} else {
			fmt.Fprintf(&b, "%dB", len(pt.Data))
		}
		if i < len(status) {
			fmt.Fprintf(&b, "/%d", status[i])
		}
	}
	return b.String()
}
