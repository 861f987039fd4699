package node

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
)

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
				ack, err := n.pushParts(b.To.Peer, transport.PushBackup, b.Epoch, b.Parts)
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
// KeepCopies kept (kept) copyReserve later. They stand in for a
// hand-off or a whole push from an old owner that may have crashed, so
// they go only for partitions whose old owner does not answer a ping
// (copyPingTimeout): an owner that answers hands them off and pushes
// them itself, and copies would only double a graceful change's traffic
// (a join over 633k keys: 21 → 29 MB on loopback, its new member ready
// 0.1 s later). The ring may move on during the ping: the copies go where
// it is then (was: where the planning ring said, which refused them).
// A graceful stop waits for these sends (StopGracefully), not for the
// release.
func (n *Node) sendCopies(epoch uint64, plan map[uint32]ring.Member, kept []uint32) {
	o := n.owner.Load()
	if len(plan) == 0 {
		n.releaseLater(o, epoch, kept)
		return
	}
	n.copying.add()
	copied := make(chan struct{})
	for _, to := range copyTargets(o.self, o.cell.Load().Ring, plan) {
		n.h.announceWhile(epoch, to, func() bool {
			select {
			case <-copied:
				return false
			default:
				return true
			}
		})
	}
	if !n.goLoop(func() {
		defer n.copying.done()
		defer n.releaseLater(o, epoch, kept)
		defer close(copied)
		silent := n.silentOwners(epoch, plan)
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
		n.copying.done()
		close(copied)
	}
}

// copyTargets lists, once each, the owners in rg (the ring the copies of
// plan go under) of the partitions of plan whose old owner rg no longer
// lists (marked dead, or gone), self excepted: they hold nothing of
// those partitions, maybe (AwaitCopies), and are told that a copy is on
// its way while sendCopies pings, exports and pushes, seconds on a
// starved machine (announceWhile), so that their wait for it goes on.
func copyTargets(self string, rg *ring.Ring, plan map[uint32]ring.Member) []ring.Member {
	var out []ring.Member
	seen := map[string]bool{self: true}
	for p, was := range plan {
		if _, in := rg.Member(was.ID); in {
			continue
		}
		if ow, ok := rg.Owner(p); ok && !seen[ow.ID] {
			seen[ow.ID] = true
			out = append(out, ow)
		}
	}
	return out
}

// copyReserve is how long a member keeps the backup copies it kept
// through a ring change (KeepCopies) once it has passed on those of
// silent owners: long enough for the partitions' owners to push them
// whole to their new backups (seconds under load), and for the crash of
// one that did not, before that, to be marked (--dead-after), when the
// kept copy is the only one (Reserves). Was: released at once, and such
// a crash lost every key of those partitions.
func (n *Node) copyReserve() time.Duration { return n.cfg.DeadAfter + 30*time.Second }

// releaseLater releases kept (KeepCopies for the ring of epoch) after
// copyReserve, unless the node stops first.
func (n *Node) releaseLater(o *Owner, epoch uint64, kept []uint32) {
	if len(kept) == 0 {
		return
	}
	n.goLoop(func() {
		t := time.NewTimer(n.copyReserve())
		defer t.Stop()
		select {
		case <-t.C:
			o.ReleaseCopies(epoch, kept)
		case <-n.ctx.Done():
		}
	})
}

// copyAttempts bounds how often pushCopies sends a batch whose push
// failed or whose parts were refused for now, copyRetry apart, doubling.
const (
	copyAttempts = 4
	copyRetry    = 250 * time.Millisecond
)

// pushCopies pushes b, copies passed on (sendCopies), and again, up to
// copyAttempts times in all, the parts not taken for a reason that may
// pass (pushBackups). A part answered NOT_OWNER by a member at b's ring
// or a newer one is not sent again: the ring moved on, and the member
// that owns it now got or gets the copy from its own ring change or not
// at all. Was: one attempt, so a new
// member more than ~0.7 s behind the sender lost the copies, and served
// from nothing.
func (n *Node) pushCopies(b *BackupBatch) {
	taken, left, err := n.pushBackups(b, copyAttempts)
	n.log.Info("backup copies of a silent owner's partitions passed on", "to", b.To.ID, "epoch", b.Epoch, "partitions", len(b.Parts), "taken", len(taken), "left", left, "err", err)
}

// pushBackups pushes b's parts to b.To as backup copies, up to attempts
// times, copyRetry apart and doubling, sending again the parts not taken
// for a reason that may pass: the push failed (the member busy or
// unreachable for a moment), or the member was not ready for them: its
// ring had not reached b's epoch after epochWait (a starved machine, a
// member whose Raft lags), and it refused them or, by its older ring,
// answered NOT_OWNER (its ack's epoch is below b's). Was: that NOT_OWNER
// was taken for final, and a stopping member's copies of a crashed
// owner's partitions, passed on to a new backup that lagged, were
// dropped: served from nothing once the crash was marked. It returns the
// partitions taken, how many parts were left untaken for such a reason,
// and the last push's error.
func (n *Node) pushBackups(b *BackupBatch, attempts int) (taken []uint32, left int, err error) {
	parts, wait := b.Parts, copyRetry
	for attempt := 1; len(parts) > 0; attempt++ {
		var ack transport.PushAck
		ack, err = n.pushParts(b.To.Peer, transport.PushBackup, b.Epoch, parts)
		// Behind: it judged the parts by a ring older than b's.
		behind := err == nil && ack.Epoch < b.Epoch
		var again []transport.PushPart
		for i, pt := range parts {
			switch {
			case err != nil || i >= len(ack.Status) || ack.Status[i] == transport.PushRejected,
				behind && ack.Status[i] == transport.PushNotOwner:
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
	select {
	case <-n.copying.idle():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// underWay counts work under way that a caller may wait for while more
// of it starts, which a sync.WaitGroup forbids (an Add from zero during
// a Wait: a ring change's sendCopies while a graceful stop waits). The
// zero value is idle.
type underWay struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0
}

func (u *underWay) add() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == 0 {
		u.zero = make(chan struct{})
	}
	u.n++
}

func (u *underWay) done() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n--; u.n == 0 {
		close(u.zero)
	}
}

// idle is closed once nothing is under way (at once if nothing is).
func (u *underWay) idle() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	return u.zero
}

// copyPingTimeout is how long sendCopies waits for an old owner's answer
// to its ping before it takes the owner for crashed.
const copyPingTimeout = 500 * time.Millisecond

// silentOwners pings, at once, the old owners of plan (PlanCopyForwards)
// at the addresses of the ring that planned it, the ring of epoch, and
// returns those that did not answer within copyPingTimeout.
func (n *Node) silentOwners(epoch uint64, plan map[uint32]ring.Member) map[string]bool {
	owners := map[string]ring.Member{}
	for _, m := range plan {
		if m.ID != n.cfg.ID {
			owners[m.ID] = m
		}
	}
	return n.silentOf(epoch, owners)
}

// memberSilent reports whether a member of this member's ring, itself
// excepted, does not answer a ping within copyPingTimeout (or what
// silentHook says, in tests), or whether a member left the ring in the
// last handoffTimeout: a killed member marked dead no longer counts as
// silent, and the copies kept of what it was handing off are only then
// on their way (their holders say so once they have applied that ring,
// a moment later: Node.sendCopies). Was: a joiner whose recheck came
// first served them from nothing (a helper's kill 2.5 s after a join:
// 92 partitions, the copies merged a moment later).
func (n *Node) memberSilent() bool {
	if at := n.memberGone.Load(); at != nil && time.Since(*at) < handoffTimeout {
		return true
	}
	if n.silentHook != nil {
		return n.silentHook()
	}
	o := n.owner.Load()
	if o == nil {
		return false
	}
	v := o.cell.Load()
	if v == nil {
		return false
	}
	members := map[string]ring.Member{}
	for _, m := range v.Ring.Members() {
		if m.ID != n.cfg.ID {
			members[m.ID] = m
		}
	}
	return len(n.silentOf(v.Epoch(), members)) > 0
}

// silentOf pings members (by id), at once, and returns those that did not
// answer within copyPingTimeout.
func (n *Node) silentOf(epoch uint64, owners map[string]ring.Member) map[string]bool {
	var mu sync.Mutex
	silent := map[string]bool{}
	var wg sync.WaitGroup
	for id, m := range owners {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(n.ctx, copyPingTimeout)
			defer cancel()
			var ack transport.PushAck
			// No From: a leader takes a ping that names its sender for
			// that member's lease request (noteLeaseRequest), and a
			// liveness check from a member whose log is stuck cleared
			// the leader's count of it as behind, which then never
			// marked it dead (TestMemberWhoseRingOrRulesCannotFollowIsMarkedDead,
			// once memberSilent pinged at every hand-off wait's end).
			if n.cfg.DataPlane.Push(ctx, m.Peer, &transport.Push{Kind: transport.PushPing, Epoch: epoch}, &ack) != nil {
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
// backups (see below), as backup copies, and returns the
// partitions a backup took: the target may have crashed, not yet
// marked dead, and this member will be gone when it is; the backup, which
// then owns the partition, promotes the copy. (The parts are kept in the
// bucket file as well, for this member's next start.) Was: only the
// bucket file had them, and the partitions were served from nothing
// from the crash's mark until this member came back. A backup merges the
// copy with what it holds, as it does any copy that is not the owner's
// own push, so a target that was only slow, and pushes the partition
// whole once it took the hand-off, loses nothing either.
//
// The backups are those of the owner's view, which Apply set before the
// hand-offs began, not of the node's: refresh stores that after starting
// them, and a push refused at once (a crashed target's closed port) found
// the ring before there, where the target was often the partition's
// backup itself, and insured nothing (about 1 harness run in 15).
func (n *Node) insureWithBackups(epoch uint64, to string, parts []transport.PushPart) (taken []uint32) {
	o := n.owner.Load()
	if o == nil {
		return nil
	}
	v := o.cell.Load()
	if v == nil {
		return nil
	}
	by := batchesTo{epoch: max(epoch, v.Epoch())}
	for _, pt := range parts {
		b, ok := v.Ring.Backup(pt.Partition)
		if pt.Lost || !ok || b.ID == n.cfg.ID || b.ID == to {
			continue
		}
		pt.Delta = false
		by.add(b, pt)
	}
	for _, b := range by.list {
		k, _, err := n.pushBackups(b, 1)
		n.log.Info("hand-offs to a member that does not answer given to their backups too", "target", to, "backup", b.To.ID, "partitions", len(b.Parts), "taken", len(k), "err", err)
		taken = append(taken, k...)
	}
	return taken
}

// pushParts pushes parts to the member at peer, as pushes of kind at
// epoch that each fit the data plane's largest frame (maxPushFrame), in
// order, each within a second, and returns their answers as one: the
// parts' statuses in order, and the lowest epoch answered. It stops at
// the first push that fails, with its error; the parts after it are not
// sent. Was: one push, so a member whose backup copies came to more
// than 16 MiB (about a million token-bucket keys for one backup member,
// a round after a ring change, when whole partitions go) had every
// round's push refused by its own client before it left, and its
// backups held nothing.
func (n *Node) pushParts(peer string, kind transport.PushKind, epoch uint64, parts []transport.PushPart) (transport.PushAck, error) {
	var all transport.PushAck
	limit := n.maxPushFrame()
	for len(parts) > 0 {
		push := &transport.Push{Kind: kind, Epoch: epoch, From: n.cfg.ID}
		size, k := transport.PushFrameSize(push)+binary.MaxVarintLen32, 0
		for ; k < len(parts); k++ {
			if size += transport.PushPartSize(&parts[k]); k > 0 && size > limit {
				break
			}
		}
		push.Parts = parts[:k]
		var ack transport.PushAck
		if err := n.pushWithin(time.Second, peer, push, &ack); err != nil {
			return all, err
		}
		if all.Status == nil || ack.Epoch < all.Epoch {
			all.Epoch = ack.Epoch
		}
		all.Status = append(all.Status, ack.Status...)
		parts = parts[k:]
	}
	return all, nil
}
