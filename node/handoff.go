package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

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
		if g == GainAwait {
			ps = append(ps, p)
		}
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
		h.n.goLoop(func() { h.deliver(epoch, group) })
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
	n := h.n
	backoff := 20 * time.Millisecond
	d := &delivery{group: group, insured: map[uint32]bool{}}
	insuredTo := map[string]bool{} // targets whose parts went to the backups (insureWithBackups)
	h.mu.Lock()
	h.under[d] = struct{}{}
	h.mu.Unlock()
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
		push.Parts = n.sendable(batch)
		var ack transport.PushAck
		ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
		err := n.cfg.DataPlane.Push(ctx, to.Peer, push, &ack)
		cancel()
		if n.log.Enabled(n.ctx, slog.LevelDebug) {
			n.log.Debug("hand-off pushed", "to", to.ID, "epoch", epoch, "parts", debugParts(push.Parts, ack.Status), "ack_epoch", ack.Epoch, "err", err)
		}
		var retry []Outgoing
		refused := err != nil
		settled := 0 // parts this attempt settled (taken, or given up)
		if err != nil {
			n.log.Debug("hand-off failed", "to", to.ID, "parts", len(batch), "lost", lostParts(batch), "err", err)
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
func (h *handoffs) expireLater(epoch uint64, parts []uint32) {
	h.after(h.n.handoffWait(), func(o *Owner) {
		k, bare := o.expireAwaitingSince(epoch, parts)
		if k > bare {
			h.n.log.Warn("hand-off did not arrive in time; serving the backup copies", "epoch", epoch, "partitions", k-bare)
		}
		if bare > 0 {
			// Was: counted in the line above, so an owner and its
			// backup lost together read as a failover that kept the
			// budgets.
			h.n.log.Warn("hand-off did not arrive in time and this member holds no backup copy: serving the partitions from nothing, their keys' budgets start full", "epoch", epoch, "partitions", bare)
		}
	})
}

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

// backupLoop pushes the changed partitions this member owns to their
// backups every BackupInterval.
func (n *Node) backupLoop() {
	n.everyTick(n.cfg.BackupInterval, func(o *Owner) {
		start := time.Now()
		batches := o.BackupPushes()
		var wg sync.WaitGroup
		for _, b := range batches {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(n.ctx, time.Second)
				defer cancel()
				push := &transport.Push{Kind: transport.PushBackup, Epoch: b.Epoch, From: n.cfg.ID, Parts: b.Parts}
				var ack transport.PushAck
				err := n.cfg.DataPlane.Push(ctx, b.To.Peer, push, &ack)
				if err != nil {
					n.m.backupErrors.Inc()
				}
				o.BackupAnswered(b, &ack, err)
			}()
		}
		wg.Wait()
		if len(batches) > 0 {
			// Lag: a change waits up to one interval, then the push.
			n.m.backupLag.Set((n.cfg.BackupInterval + time.Since(start)).Seconds())
		}
	})
}

// sendCopies passes this member's backup copies of the partitions of
// plan (PlanCopyForwards for the ring of epoch) on to their owner and
// backup in the ring of the moment it sends (Owner.CopiesFor; again
// while a push fails for now: pushCopies), then releases the copies
// KeepCopies kept (kept). They stand in for a
// hand-off or a whole push from an old owner that may have crashed, so
// they go only for partitions whose old owner does not answer a ping
// (copyPingTimeout): an owner that answers hands them off and pushes
// them itself, and copies would only double a graceful change's traffic
// (a join over 633k keys: 21 → 29 MB on loopback, its new member ready
// 0.1 s later). The ring may move on during the ping: the copies go where
// it is then (was: where the planning ring said, which refused them).
// A graceful stop waits for these sends (StopGracefully).
func (n *Node) sendCopies(epoch uint64, plan map[uint32]ring.Member, kept []uint32) {
	if len(plan) == 0 {
		return
	}
	o := n.owner.Load()
	n.copying.Add(1)
	if !n.goLoop(func() {
		defer n.copying.Done()
		defer o.ReleaseCopies(epoch, kept)
		silent := n.silentOwners(plan)
		if len(silent) == 0 {
			return
		}
		v := o.cell.Load()
		var wg sync.WaitGroup
		for _, b := range o.CopiesFor(v, plan, silent) {
			wg.Go(func() { n.pushCopies(b) })
		}
		wg.Wait()
	}) {
		n.copying.Done()
	}
}

// copyAttempts bounds how often pushCopies sends a batch whose push
// failed or whose parts were refused for now, copyRetry apart, doubling.
const (
	copyAttempts = 4
	copyRetry    = 250 * time.Millisecond
)

// pushCopies pushes b, copies passed on (sendCopies), and again, up to
// copyAttempts times in all, the parts not taken for a reason that may
// pass (pushBackups). A part answered NOT_OWNER is not sent again: the
// ring moved on, and the member that owns it now got or gets the copy
// from its own ring change or not at all. Was: one attempt, so a new
// member more than ~0.7 s behind the sender lost the copies, and served
// from nothing.
func (n *Node) pushCopies(b *BackupBatch) {
	taken, left, err := n.pushBackups(b, copyAttempts)
	n.log.Info("backup copies of a silent owner's partitions passed on", "to", b.To.ID, "epoch", b.Epoch, "partitions", len(b.Parts), "taken", len(taken), "left", left, "err", err)
}

// pushBackups pushes b's parts to b.To as backup copies, up to attempts
// times, copyRetry apart and doubling, sending again the parts not taken
// for a reason that may pass: the push failed (the member busy or
// unreachable for a moment), or the member refused them as not ready
// (its ring had not reached b's epoch after epochWait, on a starved
// machine). It returns the partitions taken, how many parts were left
// untaken for such a reason, and the last push's error.
func (n *Node) pushBackups(b *BackupBatch, attempts int) (taken []uint32, left int, err error) {
	parts, wait := b.Parts, copyRetry
	for attempt := 1; len(parts) > 0; attempt++ {
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		var ack transport.PushAck
		err = n.cfg.DataPlane.Push(ctx, b.To.Peer, &transport.Push{Kind: transport.PushBackup, Epoch: b.Epoch, From: n.cfg.ID, Parts: parts}, &ack)
		cancel()
		var again []transport.PushPart
		for i, pt := range parts {
			switch {
			case err != nil || i >= len(ack.Status) || ack.Status[i] == transport.PushRejected:
				again = append(again, pt)
			case ack.Status[i] == transport.PushOK:
				taken = append(taken, pt.Partition)
			}
		}
		parts = again
		if len(parts) == 0 || attempt == attempts {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-n.ctx.Done():
			t.Stop()
			return taken, len(parts), n.ctx.Err()
		}
		wait *= 2
	}
	return taken, len(parts), err
}

// waitCopies waits until sendCopies has sent what it had to, or ctx ends.
func (n *Node) waitCopies(ctx context.Context) error {
	done := make(chan struct{})
	go func() { n.copying.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyPingTimeout is how long sendCopies waits for an old owner's answer
// to its ping before it takes the owner for crashed.
const copyPingTimeout = 500 * time.Millisecond

// silentOwners pings, at once, the old owners of plan (PlanCopyForwards)
// at the addresses of the ring that planned it, and returns those that
// did not answer within copyPingTimeout.
func (n *Node) silentOwners(plan map[uint32]ring.Member) map[string]bool {
	epoch := n.cell.Load().Epoch()
	owners := map[string]ring.Member{}
	for _, m := range plan {
		if m.ID != n.cfg.ID {
			owners[m.ID] = m
		}
	}
	var mu sync.Mutex
	silent := map[string]bool{}
	var wg sync.WaitGroup
	for id, m := range owners {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(n.ctx, copyPingTimeout)
			defer cancel()
			var ack transport.PushAck
			if n.cfg.DataPlane.Push(ctx, m.Peer, &transport.Push{Kind: transport.PushPing, Epoch: epoch, From: n.cfg.ID}, &ack) != nil {
				mu.Lock()
				silent[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return silent
}

// insureWithBackups pushes parts, hand-offs of a stopping (or removed)
// member that its target (to) did not answer, to their partitions'
// backups in this member's view, as backup copies, and returns the
// partitions a backup took: the target may have crashed, not yet
// marked dead, and this member will be gone when it is; the backup, which
// then owns the partition, promotes the copy. (The parts are kept in the
// bucket file as well, for this member's next start.) Was: only the
// bucket file had them, and the partitions were served from nothing
// from the crash's mark until this member came back. A backup merges the
// copy with what it holds, as it does any copy that is not the owner's
// own push, so a target that was only slow, and pushes the partition
// whole once it took the hand-off, loses nothing either.
func (n *Node) insureWithBackups(epoch uint64, to string, parts []transport.PushPart) (taken []uint32) {
	v := n.cell.Load()
	if v == nil {
		return nil
	}
	by := map[string]*BackupBatch{}
	for _, pt := range parts {
		b, ok := v.Ring.Backup(pt.Partition)
		if pt.Lost || !ok || b.ID == n.cfg.ID || b.ID == to {
			continue
		}
		if by[b.ID] == nil {
			by[b.ID] = &BackupBatch{To: b, Epoch: max(epoch, v.Epoch())}
		}
		pt.Delta = false
		by[b.ID].Parts = append(by[b.ID].Parts, pt)
	}
	for _, b := range by {
		k, _, err := n.pushBackups(b, 1)
		n.log.Info("hand-offs to a member that does not answer given to their backups too", "target", to, "backup", b.To.ID, "partitions", len(b.Parts), "taken", len(k), "err", err)
		taken = append(taken, k...)
	}
	return taken
}

// pingEvery is the period of the leader's pings and of the members'
// lease requests: DeadAfter/10, at most 250ms, at least 10ms.
func (n *Node) pingEvery() time.Duration {
	return max(min(n.cfg.DeadAfter/10, 250*time.Millisecond), 10*time.Millisecond)
}

// leaderLease renews the leader's own lease while a quorum of the voters
// of Raft's latest configuration (servers; itself included) answered its
// pings within the lease, a quorum of them answered its Raft calls at its
// term within the lease and none at a newer term (leaderLeaseFrom), and
// its ring has caught up with its log. acked is scratch space.
func (n *Node) leaderLease(servers []raft.Server, answered, acked map[string]time.Time, now time.Time, lease time.Duration) {
	o := n.owner.Load()
	if o == nil || !n.viewCurrent() {
		return
	}
	term := n.raft.raft.CurrentTerm()
	superseded := n.raft.terms.acks(term, acked)
	if base, ok := leaderLeaseFrom(n.cfg.ID, servers, answered, acked, superseded, now, lease); ok {
		o.SetLeaseUntil(base.Add(lease))
		n.leaderLeaseAt.Store(&termLease{until: base.Add(lease), term: term})
	}
}

// leaderLeaseFrom is when the leader's lease counts from: the earlier of
// leaderLeaseBase over the answers to its pings (answered) and over the
// answers to its Raft calls at its term (acked, see termWatch); false
// unless both give one, or when an answer carried a newer term
// (superseded).
//
// An answer to a ping says that its member is alive, not that it follows
// this leader. A leader that Raft has not stepped down yet (a paused
// process just woken, or one whose disk hangs: Raft's leader loop is what
// would notice the newer term) still pings, and members that follow a
// newer leader still answer - at the epoch this one knows, until that
// leader marks this one dead: a lease taken from those answers outlives
// the mark by up to the lease while the backups already serve this
// one's partitions, so checking the answers' epochs is not enough
// either. A voter that answered a Raft call sent at t at this leader's
// term had not voted for a newer leader by then, so with a quorum of them
// no newer leader was elected before the quorum's base, and none marks
// this one dead sooner than DeadAfter after it: past the lease.
func leaderLeaseFrom(self string, servers []raft.Server, answered, acked map[string]time.Time, superseded bool, now time.Time, lease time.Duration) (time.Time, bool) {
	if superseded {
		return time.Time{}, false
	}
	pinged, ok := leaderLeaseBase(self, servers, answered, now, lease)
	if !ok {
		return time.Time{}, false
	}
	inTerm, ok := leaderLeaseBase(self, servers, acked, now, lease)
	if !ok {
		return time.Time{}, false
	}
	if inTerm.Before(pinged) {
		return inTerm, true
	}
	return pinged, true
}

// leaderLeaseBase is leaseBase over the voters of Raft's configuration
// servers, for the leader self, from answered (each member's last answer
// to its pings); false when self is not one of those voters.
//
// The voters are Raft's, not the cluster state's Voter flags: Raft's
// voters elect the next leader, which then marks a leader it cannot
// reach dead and gives its partitions to others, so only a quorum of
// Raft's voters can stand for "no other leader can be elected without
// one of these". The flags are written after the Raft change they record
// and lag it; counted over them, a voter missing from the flags shrinks
// the quorum (two missing of three or five voters let a leader lease
// itself from a minority, or alone) and a voter that answered but is not
// flagged does not count.
func leaderLeaseBase(self string, servers []raft.Server, answered map[string]time.Time, now time.Time, lease time.Duration) (time.Time, bool) {
	voters, voting := 0, false
	var buf [MaxVoters]time.Time
	others := buf[:0]
	for _, s := range servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(s.ID) == self {
			voting = true
			continue
		}
		if at, ok := answered[string(s.ID)]; ok && now.Sub(at) < lease {
			others = append(others, at)
		}
	}
	if !voting {
		return time.Time{}, false
	}
	return leaseBase(now, others, voters)
}

// leaseBase is the instant a leader's lease counts from: when the last of
// its freshest quorum of voters had answered - the quorum-th most recent
// answer, the leader itself answering at now - or false when fewer than a
// quorum answered (others holds the other voters' answers within the
// lease; voters counts the leader).
//
// The freshest quorum, not every voter that answered within the lease: a
// voter that has just died still counts as answered until the lease has
// passed since its last answer, and taking the oldest answer then made
// the lease end at that instant, one ping round before the dead voter
// stopped counting and the quorum of the living renewed it - a gap in
// which the leader answered nothing (the chaos suite saw ~250 ms of
// checks time out at dead-after/2 after killing a follower).
func leaseBase(now time.Time, others []time.Time, voters int) (time.Time, bool) {
	quorum := max(voters, 1)/2 + 1
	if 1+len(others) < quorum {
		return time.Time{}, false
	}
	if quorum == 1 {
		return now, true
	}
	slices.SortFunc(others, func(a, b time.Time) int { return b.Compare(a) }) // newest first
	return others[quorum-2], true                                             // the leader is the newest of all
}

// leaseLoop takes this member's lease while it follows: every DeadAfter/10
// (at most 250ms) it asks the leader for its ring epoch; when the leader
// grants it (grantsLease) and its own ring has reached that epoch, it may
// answer for what it owns until memberLease after it asked (a late answer
// extends nothing). A member cut off from
// the leader, or asleep (SIGSTOP), therefore stops answering before the
// leader marks it dead (DeadAfter) and the others take its partitions;
// when it wakes, it answers only once its ring has caught up.
//
// A request not granted while this member still holds a lease (no
// leader known, the leader unreachable, or a new leader without its own
// lease yet) is asked again after retryEvery, not a whole period later:
// after a leader's crash the next one grants leases as soon as it holds
// its own, and the members' leases, taken from the crashed one, are
// running out. A member without a lease (woken from a pause, back from
// dead) asks at the usual period: answering sooner would widen a window
// in which a partition it takes back serves its own stale state (bug G in
// test/chaos/README.md: a refused hand-off taken back by its sender while
// another member had served the partition).
func (n *Node) leaseLoop() {
	every := n.pingEvery()
	retry := min(every, retryEvery)
	lease := memberLease(n.cfg.DeadAfter)
	next := time.NewTimer(every)
	defer next.Stop()
	for {
		// Ask at once when this member has no lease (it just started or
		// joined): a ring change wakes the loop too.
		var changed <-chan struct{}
		if o := n.owner.Load(); o == nil || !o.Serving() {
			changed = n.cell.Changed()
		}
		select {
		case <-n.ctx.Done():
			return
		case <-next.C:
		case <-changed:
		}
		granted := n.askLease(every, lease)
		wait := every
		if o := n.owner.Load(); !granted && o != nil && o.Serving() {
			wait = retry
		}
		next.Reset(wait) // Go 1.23+: no stale tick can follow a Reset
	}
}

// retryEvery is how soon a member asks again for a lease it was not
// granted.
const retryEvery = 25 * time.Millisecond

// askLease asks the leader for this member's lease (leaseLoop), waiting
// at most timeout for its answer, and reports whether it was granted;
// true as well when there is nothing to ask (this member leads, or has
// no ring yet).
func (n *Node) askLease(timeout, lease time.Duration) bool {
	o, snap := n.owner.Load(), n.snap.Load()
	if o == nil || snap == nil || n.isLeader() {
		return true
	}
	lid, _ := n.leader()
	m, ok := snap.st.Member(lid)
	if !ok || m.Peer == "" {
		return false
	}
	asked := time.Now()
	ctx, cancel := context.WithTimeout(n.ctx, timeout)
	var ack transport.PushAck
	err := n.cfg.DataPlane.Push(ctx, m.Peer, transport.LeaseRequest(n.cfg.ID, snap.v.Epoch(), snap.v.RulesVersion), &ack)
	cancel()
	if err == nil && ack.Epoch != transport.NoLease && n.viewCurrent() && n.cell.Load().Epoch() >= ack.Epoch {
		o.SetLeaseUntil(asked.Add(lease))
		return true
	}
	return false
}

// viewCurrent reports whether the published view is the FSM's latest
// membership (the ring has caught up with the log).
func (n *Node) viewCurrent() bool {
	s := n.snap.Load()
	return s != nil && s.v.Epoch() >= n.fsm.State().MembershipIndex
}

// detectLoop is the failure detector. While this member leads it pings
// every other active member over the data plane every DeadAfter/10 (at
// most 250ms); a member that has not answered a ping sent in the last
// DeadAfter is marked dead through the log, so every node moves its
// partitions at one epoch. The leader takes its own lease from the pings
// a quorum of Raft's voters answered (from their sending time) and from
// the Raft calls a quorum of them answered at its term (leaderLease), and
// has the members' voter flags corrected where they differ from Raft's
// configuration (syncVoterFlagsLater) and, when a voter has left, a
// non-voter promoted in its place (promoteNonvoters). Raft's own
// heartbeat failures are reported only after its transport's I/O timeout
// (10s), far too late for DeadAfter, hence the pings.
func (n *Node) detectLoop() {
	every := n.pingEvery()
	timeout := max(n.cfg.DeadAfter/4, 20*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastSeen := &n.contacts            // member → last answered ping, or when we first saw it, while we lead
	answered := map[string]time.Time{} // member → last answered ping only
	var servers []raft.Server          // Raft's configuration at the last tick, while we lead
	acked := map[string]time.Time{}    // scratch for leaderLease
	orphans := orphanWatch{}           // Raft servers that are no members, while we lead
	lease := leaderLease(n.cfg.DeadAfter)
	leading := false
	prevLeader := ""    // the leader this node last followed
	var heard time.Time // when this node last heard from prevLeader (Raft's LastContact)
	type pong struct {
		id string
		at time.Time
	}
	pongs := make(chan pong, 64)
	inflight := map[string]bool{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case p := <-pongs:
			delete(inflight, p.id)
			if !p.at.IsZero() {
				lastSeen.set(p.id, p.at)
				answered[p.id] = p.at
				if leading && servers != nil {
					// At once, not at the next tick: a new leader's lease,
					// and so the leases it grants, wait for its first pongs.
					n.leaderLease(servers, answered, acked, time.Now(), lease)
				}
			}
			continue
		case <-tick.C:
		case <-n.gainedLead:
		}
		if !n.isLeader() {
			if leading {
				lastSeen.reset()
				n.behind.reset()
				servers = nil
				clear(orphans)
			}
			leading = false
			if _, id := n.raft.raft.LeaderWithID(); id != "" && string(id) != n.cfg.ID {
				prevLeader, heard = string(id), n.raft.raft.LastContact()
			}
			continue
		}
		now := time.Now()
		if !leading {
			lastSeen.reset() // contact is measured afresh from our leadership
			n.behind.reset()
			clear(answered)
			leading = true
			if prevLeader != "" {
				lastSeen.set(prevLeader, n.deposedSilentSince(now, heard))
			}
		}
		snap := n.snap.Load()
		if snap == nil {
			continue
		}
		epoch := snap.v.Epoch()
		if cf := n.raft.raft.GetConfiguration(); cf.Error() == nil {
			servers = cf.Configuration().Servers
			n.leaderLease(servers, answered, acked, now, lease)
			if len(voterFlagFixes(snap.st, servers)) > 0 {
				n.syncVoterFlagsLater() // a flag whose write was lost after the Raft change
			}
			if v := raftVoters(servers); v < MaxVoters && v < len(servers) {
				// A seat is free and a non-voter waits (a voter left: a
				// leave, an orphan removed): it takes the seat, or the
				// cluster would stay with fewer voters, and tolerate fewer
				// failures, until the next change of leader. At every tick
				// (a promotion under way is not started twice): was only
				// when the count fell since the last tick, which missed a
				// leave that followed the fifth promotion within one tick
				// (a -race flake of TestNonVoterTakesTheSeatOfAVoterThatLeft).
				n.promoteNonvoters()
			}
			n.removeOrphansLater(orphans.update(snap.st, servers, n.cfg.ID, n.removed.Load(), now, orphanVoterGrace(n.cfg.DeadAfter)))
		}
		lastSeen.retain(func(id string) bool {
			if _, ok := snap.st.Member(id); !ok {
				// Left the cluster: if it joins again, under the same id,
				// its silence counts from then, not from before it left.
				delete(answered, id)
				n.behind.remove(id)
				return false
			}
			return true
		})
		for _, m := range snap.st.Members {
			if m.ID == n.cfg.ID || !pinged(m) {
				// Not expected to answer: its silence counts afresh from
				// when it is active again, not from before it stopped.
				lastSeen.remove(m.ID)
				n.behind.remove(m.ID)
				continue
			}
			seen := lastSeen.seen(m.ID, now)
			behind := false // it answers, but its ring or rules do not follow the log
			if from, ok := n.behind.since(m.ID, now, lease); ok && from.Before(seen) {
				seen, behind = from, true
			}
			if since := now.Sub(seen); since >= n.cfg.DeadAfter {
				if err := n.markDead(m.ID); err != nil {
					if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
						// Deposed meanwhile (a leader woken from a pause
						// finds everyone silent, and its lead gone): the
						// new leader decides.
						n.log.Debug("marking a member dead: no longer the leader", "id", m.ID, "err", err)
						continue
					}
					n.log.Warn("marking a member dead", "id", m.ID, "err", err)
					continue
				}
				n.m.markedDead.Inc()
				if behind {
					n.log.Warn("member marked dead: it answers, but its ring or rules have not followed the log (its Raft log cannot grow: a full or failing disk?), so it could not answer for its partitions",
						"id", m.ID, "behind_for", since.Round(time.Millisecond).String())
				} else {
					n.log.Warn("member marked dead", "id", m.ID, "silent_for", since.Round(time.Millisecond).String())
				}
				lastSeen.remove(m.ID)
				n.behind.remove(m.ID)
				continue
			}
			if inflight[m.ID] {
				continue
			}
			inflight[m.ID] = true
			id, addr := m.ID, m.Peer
			go func() {
				ctx, cancel := context.WithTimeout(n.ctx, timeout)
				defer cancel()
				var ack transport.PushAck
				sent := time.Now() // contact counts from the ping's sending: a late pong never extends it
				err := n.cfg.DataPlane.Push(ctx, addr, &transport.Push{Kind: transport.PushPing, Epoch: epoch, From: n.cfg.ID}, &ack)
				p := pong{id: id}
				if err == nil {
					p.at = sent
				}
				select {
				case pongs <- p:
				case <-n.ctx.Done():
				}
			}()
		}
	}
}

// deposedSilentSince is when the silence of the leader this node followed
// before it won the lead counts from, for a first leading tick at now,
// given when this node last heard from it (heard, Raft's LastContact as a
// follower; zero if unknown): from heard, as for any member, but never
// later than DeadAfter − leaderLease − leaseMargin before this node's
// election. So a crashed or hung leader leaves the ring after DeadAfter
// of silence or leaderLease (DeadAfter/4, + the margin) after the
// election, whichever is later, rather than DeadAfter after the election
// (chaos bug E).
//
// That is safe because of how a leader takes its own lease
// (leaderLeaseFrom): from Raft calls that a quorum of voters answered at
// its term, sent at or after the lease's base. This node's election needed
// a quorum too, and the two share a voter, which answered the old
// leader's call at the old term before it voted in the newer one: the
// base was before this node's election, so the old leader's lease, at most
// leaderLease long, ended before leaderLease after it. A lease it takes
// as a member once it has stepped down comes from this node's answers to
// its pings, as any member's does, and other members keep their whole
// DeadAfter: this argument bounds only the old leader's own lease.
func (n *Node) deposedSilentSince(now, heard time.Time) time.Time {
	won := now
	if t := n.leaderSince.Load(); t != nil && !t.After(now) {
		won = *t
	}
	d := n.cfg.DeadAfter
	bound := won.Add(-(d - leaderLease(d) - leaseMargin(d)))
	if heard.After(bound) && !heard.After(now) {
		return heard
	}
	return bound
}

func (n *Node) markDead(id string) error {
	n.membership.lock()
	defer n.membership.unlock()
	cmd, err := fsm.SetMemberState(id, fsm.Dead)
	if err != nil {
		return err
	}
	err = n.apply(n.ctx, cmd)
	if errors.Is(err, fsm.ErrUnknownMember) {
		return nil
	}
	return err
}

// TransferLeadership hands Raft leadership to another voter when this
// member leads (a graceful stop), so the cluster does not wait out an
// election timeout. It is a no-op otherwise.
func (n *Node) TransferLeadership() {
	if err := n.transferLeadership(n.ctx); err != nil {
		n.log.Debug("leadership transfer", "err", err)
	}
}

// transferLeadership is TransferLeadership waiting for Raft's answer no
// longer than ctx (and await's bounds). It returns await's error when it
// gave up waiting (wrapping api.ErrUnavailable); Raft's own refusal (no
// other voter to take the lead, say) is logged at debug level and
// returns nil: whether this node still leads tells the caller.
func (n *Node) transferLeadership(ctx context.Context) error {
	if !n.isLeader() {
		return nil
	}
	answered, err := n.await(ctx, n.raft.raft.LeadershipTransfer(), "leadership transfer")
	if !answered {
		return err
	}
	if err != nil && !errors.Is(err, raft.ErrNotLeader) {
		n.log.Debug("leadership transfer", "err", err)
	}
	return nil
}

// StopGracefully is the first half of a graceful stop (SIGTERM): the
// member is marked down, so the ring gives its partitions to the others;
// it hands them off (bounded by ctx) and, if it leads, transfers
// leadership. The caller then closes the node. Errors are logged causes
// of an incomplete drain; the stop goes on regardless.
func (n *Node) StopGracefully(ctx context.Context) error {
	if n.removed.Load() {
		n.stopRemoved(ctx)
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, markDownTimeout)
	last, err := n.markDown(mctx)
	cancel()
	switch {
	case err != nil:
		err = fmt.Errorf("node: marking down: %w", err)
		// Still listed active: hand-offs to it may be on their way (the
		// members stopping with it, when the cluster has lost its
		// leader). Take those before saving; an awaited partition whose
		// sender is gone is served from its backup copy after
		// handoffWait.
		if werr := n.awaitAlone(ctx, false); werr != nil {
			err = errors.Join(err, fmt.Errorf("node: taking the hand-offs on their way: %w", werr))
		}
	case last:
		// The members stopping with it hand their partitions to it: keep
		// them too (a whole cluster stopped together).
		if werr := n.awaitAlone(ctx, true); werr != nil {
			err = fmt.Errorf("node: the last active member taking the others' partitions: %w", werr)
		}
	default:
		if werr := n.waitCopies(ctx); werr != nil {
			err = fmt.Errorf("node: passing backup copies on: %w", werr)
		}
		switch werr := n.waitHandoffsStopping(ctx); {
		case errors.Is(werr, errInsured):
			n.log.Info("hand-offs not answered by their target (crashed, not yet marked dead?); their partitions' backups hold them, and so does the bucket file for the next start",
				"partitions", n.h.Pending())
		case errors.Is(werr, errStranded):
			n.log.Info("hand-offs not answered, and the ring will not move them (its last active member, or no Raft leader: stopped with the others?); those holding state are kept in the bucket file for the next start",
				"partitions", n.h.Pending())
		case werr != nil:
			err = fmt.Errorf("node: handing off: %w (%d partitions not handed off)", werr, n.h.Pending())
		}
	}
	// What is still ours had nobody to go to (the last active member),
	// and the hand-offs that did not land: keep them in the data dir for
	// the next start, which hands them to their owners.
	left := n.h.abandon()
	if o := n.Owner(); o != nil {
		if k, serr := o.saveBuckets(n.cfg.DataDir, left); serr != nil {
			n.log.Error("bucket state NOT saved: the budgets of the partitions this member held start afresh at its next start (unless the cluster serves them from backups meanwhile)", "err", serr)
			err = errors.Join(err, fmt.Errorf("%w: %w", ErrBucketsNotSaved, serr))
		} else if k > 0 {
			n.log.Info("bucket state saved for the next start", "partitions", k, "file", filepath.Join(n.cfg.DataDir, bucketFile))
		}
	}
	n.TransferLeadership()
	return err
}

// stopRemoved is StopGracefully for a member removed from the cluster:
// it owns nothing, and its data dir is refused at any next start (the id
// comes back only over an empty one), so nothing is saved there. It
// waits, bounded by ctx, for the wait for its hand-offs that its removal
// began (noteRemoved; not again once that has ended), and logs the
// hand-offs that did not land: their new owners serve those partitions
// from their backup copies, as after a crash.
func (n *Node) stopRemoved(ctx context.Context) {
	n.stopping.Store(true)
	select {
	case <-n.removedWaited:
	case <-ctx.Done():
	}
	held := 0
	for _, og := range n.h.abandon() {
		if !og.Part.Lost && len(og.Part.Data) > 0 {
			held++
		}
	}
	if held > 0 {
		n.log.Warn("removed from the cluster with hand-offs not confirmed: their new owners serve those partitions from backup copies (nothing is saved: this data dir cannot be used again)", "partitions", held)
	}
}

// ErrBucketsNotSaved is wrapped by StopGracefully's error when the bucket
// state it should have kept in the data dir could not be written (a full
// disk, say): those budgets are lost to the next start.
var ErrBucketsNotSaved = errors.New("node: bucket state not saved")

// waitHandoffsRemoved is a removed member's wait for its hand-offs
// (noteRemoved): until they all land, ctx ends, or those left are held
// by their backups as well (insuredAll). A removed member leaves Raft and
// does not see a crashed target marked dead, so no ring readdresses
// those hand-offs; waiting on gains nothing. Was: it waited the whole
// max(10 s, --dead-after + 5 s), and the backups held nothing, so those
// partitions were served from nothing once the target was marked dead
// (a leave during another member's crash: 7-18 keys of 80 reset, in a
// helper's runs with real processes).
func (n *Node) waitHandoffsRemoved(ctx context.Context) error {
	err := n.waitHandoffs(ctx, false)
	if errors.Is(err, errInsured) {
		n.log.Info("hand-offs not answered by their target (crashed, not yet marked dead?); their partitions' backups hold them", "partitions", n.h.Pending())
	}
	return err
}

// errStranded: the hand-offs left cannot land (handoffs.stranded).
var errStranded = errors.New("node: hand-offs stranded")

// errInsured: the hand-offs left do not land, and their backups hold them
// (handoffs.insuredAll).
var errInsured = errors.New("node: hand-offs insured with the backups")

// waitHandoffsStopping is WaitHandoffs for a member that stops: it also
// ends, with errStranded, once the hand-offs left are stranded, and with
// errInsured once their backups hold them.
func (n *Node) waitHandoffsStopping(ctx context.Context) error {
	return n.waitHandoffs(ctx, true)
}

// waitHandoffs waits until every hand-off landed (nil), ctx ends (its
// error), those left are insured with their backups (errInsured) or,
// when stranded applies, cannot land (errStranded).
func (n *Node) waitHandoffs(ctx context.Context, stranded bool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.h.idleCh():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if stranded && n.h.stranded(n.cell.Load()) {
				return errStranded
			}
			if n.h.insuredAll() {
				return errInsured
			}
		}
	}
}

// awaitAlone waits, until ctx ends, for every partition this member
// gained to have its state and, when alone is set, for its ring to list
// no other member.
func (n *Node) awaitAlone(ctx context.Context, alone bool) error {
	for {
		o := n.owner.Load()
		if o == nil {
			return nil
		}
		servable, changed := o.servable(), n.cell.Changed()
		v := n.cell.Load()
		if o.Awaiting() == 0 && (!alone || v != nil && len(v.Ring.Members()) == 1 || n.leaderless()) {
			// Alone, or nothing more can come: the ring lists members
			// that could not be marked down before the cluster lost its
			// leader (several stopped together), and will not change.
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond) // for the leader's loss, which the view does not show
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (%d partitions still awaited)", ctx.Err(), o.Awaiting())
		case <-servable:
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// leaderless reports whether this member has known no Raft leader for
// leaderlessAfter: the ring cannot change until one is elected.
func (n *Node) leaderless() bool {
	if n.raft.raft.Leader() != "" {
		n.noLeaderSince.Store(nil)
		return false
	}
	now := time.Now()
	since := n.noLeaderSince.Load()
	if since == nil {
		n.noLeaderSince.CompareAndSwap(nil, &now)
		return false
	}
	return now.Sub(*since) >= leaderlessAfter
}

// leaderlessAfter is how long a stopping member waits for a new Raft
// leader before it takes the ring for final (leaderless).
const leaderlessAfter = time.Second

// markDownTimeout bounds the attempt to mark a stopping member down.
const markDownTimeout = 2 * time.Second

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
