package node

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// Gain says how a partition this member starts owning gets its state.
type Gain uint8

// How a gained partition is filled.
const (
	GainFresh   Gain = iota // nobody had it (a new cluster): serve from empty
	GainPromote             // its owner is gone (dead, or never held it): promote our backup copy and serve
	GainAwait               // its owner is alive: wait for its hand-off (promote the backup after a timeout)
)

// Moves is what one member must do when the ring changes: the pure
// decision, computed by PlanMoves and carried out by Owner.Apply.
type Moves struct {
	Gained  map[uint32]Gain   // partitions we start owning, and how
	Lost    map[uint32]string // partitions we stop owning → their new owner ("" = none)
	Unback  []uint32          // partitions whose backup copy we no longer keep
	Restart bool              // the first ring after a restart with state
	// From names, for a partition awaited from its owner in the ring
	// just before when one member changed in between (as far as this
	// member saw: no other owner's hand-off is expected), that owner.
	From map[uint32]string
	// CopyOnly names the partitions awaited for a backup copy alone
	// (AwaitCopies): their owner is gone, and no hand-off comes.
	CopyOnly map[uint32]bool
}

// PlanMoves decides what member self does when the ring goes from prev
// (nil for the first ring this process sees) to next. In a first ring of
// one member everything is fresh; in a larger first ring what self owns
// is awaited from the members that owned it before. alive reports
// whether a member of prev will still hand its partitions off (active,
// draining, down after a graceful stop, or removed by leave while
// running) rather than having vanished (dead). restarted says this process
// started over a data dir that held state, so in its first ring it holds
// nothing of what it owned before.
//
// rejoined says self's own membership changed between prev and next (it
// was marked down or dead and came back, and this process saw only the
// two ends): what it kept owning may have been served by others in
// between, so it awaits those partitions again instead of trusting its
// own, possibly stale, state.
//
// A partition whose owner in prev is gone (dead, or nobody: prev was
// empty) is promoted only when prev is the ring just before next. When
// prev and next differ in more than one member, this process did not see
// the rings in between (a membership command changes one member): a new
// member catching up with the log, whose first view was the empty ring
// of the cluster's Init (its join's answer did not say where the join
// is: api.JoinResponse), sees next name three members at once. prev's
// owner is then not necessarily the partition's last one: the last one
// may be alive and handing it off, and promoting would serve the
// partition from empty until that hand-off came (it is merged then, see
// Owner.takeHandoff, but what was admitted meanwhile was admitted against
// an empty budget). So it is awaited, and if nothing comes,
// handoffTimeout promotes the backup copy all the same.
func PlanMoves(prev, next *ring.Ring, self string, alive func(id string) bool, restarted, rejoined bool) Moves {
	m := Moves{Gained: map[uint32]Gain{}, Lost: map[uint32]string{}, From: map[uint32]string{}}
	gap := prev != nil && membersChanged(prev, next) > 1
	for _, p := range next.PartitionsOf(self) {
		var from string
		if prev != nil {
			if o, ok := prev.Owner(p); ok {
				from = o.ID
			}
		}
		switch {
		case prev == nil && restarted:
			// We owned it before a crash or stop and hold nothing now: the
			// backup has it. Await it: the restart protocol (mark down,
			// then active) moves it to the backup and back to us.
			m.Gained[p] = GainAwait
			m.Restart = true
		case prev == nil && len(next.Members()) == 1:
			m.Gained[p] = GainFresh // a new cluster, or the only member
		case prev == nil:
			// Our first ring already names us (we joined, and the log
			// reached us with our own join in it): the partitions came
			// from members that are handing them to us.
			m.Gained[p] = GainAwait
		case from == self && rejoined && len(next.Members()) == 1:
			// kept: nobody else can have served it in between (awaiting a
			// hand-off, then promoting an empty backup copy, dropped what
			// this member held)
		case from == self && rejoined:
			m.Gained[p] = GainAwait
		case from == self:
			// kept
		case from != "" && alive(from), gap:
			m.Gained[p] = GainAwait
			if !gap {
				m.From[p] = from
			}
		default:
			m.Gained[p] = GainPromote // nobody will hand it off
		}
	}
	if prev != nil {
		for _, p := range prev.PartitionsOf(self) {
			if o, ok := next.Owner(p); !ok || o.ID != self {
				m.Lost[p] = o.ID
			}
		}
		for p := range uint32(next.Config().Partitions) {
			if b, ok := prev.Backup(p); ok && b.ID == self {
				if nb, ok := next.Backup(p); !ok || nb.ID != self {
					if _, gained := m.Gained[p]; !gained {
						m.Unback = append(m.Unback, p)
					}
				}
			}
		}
	}
	return m
}

// resume is PlanMoves's first ring of a member restarted listed active
// whose data dir held its bucket file (it stopped gracefully, nobody
// else marked down in between: Node.needsRecovery): the partitions of
// saved, the file's, that it owns are promoted from their loaded copies
// rather than awaited, as after a crash, from backups that were never
// asked to send them (the hand-off wait, an hour with --dead-after 1h).
// The file is their latest state unless the ring gave one to another
// member while this one was away; that member, alive, hands it back
// now, and its hand-off is merged into what this member serves.
func (m Moves) resume(saved []uint32) {
	for _, p := range saved {
		if m.Gained[p] == GainAwait {
			m.Gained[p] = GainPromote
		}
	}
}

// PlanBackupForwards returns the partitions (→ their owner) whose backup
// copy self should hand to their owner when the ring goes from prev to
// next: those self backed up in prev, owned by the same member M in prev
// and next, where M's membership changed in between (flapped(M): it was
// marked down or dead and came back, as a restart does) although prev
// and next name the same members. Self then skipped the ring in between
// (its Raft apply lagged by the ~30 ms of a restart's mark-down), in
// which it owned those partitions and would have promoted its copy and
// handed it back to M; M, restarted, awaits that hand-off. Was: self sent
// nothing, and M promoted its own empty copy after the hand-off timeout:
// every key of those partitions started afresh, after 3 s of degraded
// answers. A copy that reaches an M that serves the partition already is
// merged conservatively, so a needless one changes nothing.
func PlanBackupForwards(prev, next *ring.Ring, self string, flapped func(id string) bool) map[uint32]string {
	if prev == nil {
		return nil
	}
	var out map[uint32]string
	for p := range uint32(next.Config().Partitions) {
		b, ok := prev.Backup(p)
		if !ok || b.ID != self {
			continue
		}
		po, ok1 := prev.Owner(p)
		no, ok2 := next.Owner(p)
		if !ok1 || !ok2 || po.ID != no.ID || no.ID == self || !flapped(no.ID) {
			continue
		}
		if out == nil {
			out = map[uint32]string{}
		}
		out[p] = no.ID
	}
	return out
}

// ForwardBackups returns this member's backup copies of parts (partition
// → its owner in next), as hand-offs to send (PlanBackupForwards). Call
// it before Apply, which may drop those copies.
func (o *Owner) ForwardBackups(next *view.View, parts map[uint32]string) []Outgoing {
	now := o.now()
	var out []Outgoing
	for p, to := range parts {
		mem, ok := next.Ring.Member(to)
		if !ok {
			continue
		}
		// A whole copy goes even with nothing in it (an idle partition),
		// as Apply sends one: M awaits this hand-off, and self, had it
		// seen the ring in between, would have promoted that copy and
		// handed it back. Was: only a copy holding states went, so M
		// awaited its idle partitions for the whole hand-off wait.
		if data := o.copyOf(p, now); data != nil {
			out = append(out, Outgoing{To: mem, Part: transport.PushPart{Partition: p, Data: data}, At: now, src: o.backup})
		}
	}
	return out
}

// PlanCopyForwards returns, partition → its owner in prev (with that
// ring's addresses, which a member marked down or dead is not in any
// more), the
// partitions self backed up in prev whose owner or backup next changes:
// those whose backup copy self may have to pass on (Node.sendCopies).
//
// The partition's old owner hands it off to its new owner, and pushes it
// whole to its new backup, if it runs. If it crashed and is not marked
// dead yet (the ring changed for another reason: a join, a leave,
// another member's restart), self's copy is the only state there is: the
// new owner serves it when its hand-off wait is over (Owner.takeCopy),
// and the new backup promotes it when the old owner is marked dead. Was:
// self dropped its copy (it backs the partition up no more) or kept it
// for nobody, and the partition's keys started afresh (in
// TestCrashedOwnersPartitionsMovedBeforeItIsMarkedDeadKeepTheirBudget,
// 23 keys of 60 with 5 of 10 spent).
func PlanCopyForwards(prev, next *ring.Ring, self string) map[uint32]ring.Member {
	if prev == nil {
		return nil
	}
	var out map[uint32]ring.Member
	for p := range uint32(next.Config().Partitions) {
		b, ok := prev.Backup(p)
		if !ok || b.ID != self {
			continue
		}
		po, ok := prev.Owner(p)
		if !ok {
			continue
		}
		no, _ := next.Owner(p)
		nb, _ := next.Backup(p)
		if no.ID == self || no.ID == po.ID && nb.ID == self {
			continue // self owns it now, or nothing changed for self
		}
		if out == nil {
			out = map[uint32]ring.Member{}
		}
		out[p] = po
	}
	return out
}

// KeepCopies keeps, through Apply, this member's backup copies of the
// partitions of plan (PlanCopyForwards, with Reserves) that m would drop
// (Unback), or that an earlier ring kept, for the ring of epoch, next,
// until ReleaseCopies. The copies are exported only once their old owner
// turns out silent (Node.sendCopies), which takes a ping, and exporting
// every one at once (20-40 ms per member in a join over 633k keys) would
// delay the ring's own hand-offs. It also has Apply keep, as such a
// copy, what it hands off of the partitions m loses to a member that is
// not their backup in next, this member being neither: their new
// owner's backup holds nothing of them until that owner's first whole
// push. Each kept copy notes the partition's owner in next (see
// Reserves). It returns the partitions kept.
func (o *Owner) KeepCopies(epoch uint64, m *Moves, plan map[uint32]ring.Member, next *ring.Ring) []uint32 {
	var kept []uint32
	for p, to := range m.Lost {
		if b, ok := next.Backup(p); to == "" || ok && b.ID == o.self {
			continue
		}
		ow, _ := next.Owner(p)
		g := &o.moving[p]
		g.Lock()
		o.kept[p] = keptCopy{epoch: epoch, owner: ow}
		g.Unlock()
		kept = append(kept, p)
	}
	unback := m.Unback[:0]
	dropped := map[uint32]bool{}
	for _, p := range m.Unback {
		if _, planned := plan[p]; planned {
			dropped[p] = true
		} else {
			unback = append(unback, p)
		}
	}
	m.Unback = unback
	for p := range plan {
		g := &o.moving[p]
		g.Lock()
		if dropped[p] || o.kept[p].epoch != 0 {
			k := keptCopy{epoch: epoch}
			k.owner, _ = next.Owner(p)
			// The member planned (its owner before) is handing the
			// partition off to that owner, unless it is gone: then its
			// copy is passed on now, if it is silent (Node.sendCopies).
			if was := plan[p]; was.ID != k.owner.ID {
				if _, in := next.Member(was.ID); in {
					k.from = was
				}
			}
			o.kept[p] = k
			kept = append(kept, p)
		}
		g.Unlock()
	}
	return kept
}

// Reserves returns, partition → the owner it was kept for, the backup
// copies this member keeps (KeepCopies) of partitions that next gives
// to another member than that owner, itself excepted. Kept copies
// outlive the ring change that took them from this member
// (Node.copyReserve): a partition's owner that keeps it pushes it whole
// to its new backup at its next backup round, seconds later at millions
// of keys under load, and if it crashes before that push got through,
// this member's copy is the only one. That owner's crash, once marked, is such a ring: the copy goes
// on as any copy of a silent owner's partition does (Node.sendCopies),
// to the owner in next (its new backup, which holds nothing of it:
// AwaitCopies) and its backup. So is one whose owner before that ring
// change was handing it off to its owner and has since left the ring
// (keptCopy.from: a member killed while a joiner awaited its hand-offs),
// to the owner that may have served it from nothing meanwhile: merged
// there, it spends again what the lost hand-off held.
func (o *Owner) Reserves(next *ring.Ring) map[uint32]ring.Member {
	var out map[uint32]ring.Member
	for p := range o.moving {
		g := &o.moving[p]
		g.Lock()
		if k := o.kept[p]; k.epoch != 0 && k.owner.ID != "" {
			ow, ok := next.Owner(uint32(p))
			var ask ring.Member // the member whose silence sends the copy on
			switch _, senderIn := next.Member(k.from.ID); {
			case !ok || ow.ID != k.owner.ID && ow.ID != o.self:
				ask = k.owner
			case k.from.ID != "" && !senderIn && ow.ID != o.self:
				ask = k.from // crashed while handing it off
			}
			if ask.ID != "" {
				if out == nil {
					out = map[uint32]ring.Member{}
				}
				out[uint32(p)] = ask
			}
		}
		g.Unlock()
	}
	return out
}

// AwaitCopies turns each partition that m promotes (GainPromote: its
// owner in the ring before is gone) and of which this member holds
// nothing (holdsAny: no state, no backup copy, not even an empty whole
// one) into one awaited for a backup copy alone (CopyOnly), when next
// has other members: a member that backed it up or owned it in an
// earlier ring may keep one (Reserves) and is passing it on. Copies
// that come are merged (takeCopy: several may, of different ages), and
// served after handoffTimeout, or later while copies are said to be on
// their way (handoffs.expireCopiesLater); with none, the partition is
// served from nothing then, and counted (ServedFromNothing). Was: served
// from nothing at once, uncounted, and any copy merged when it came: a
// member that crashed seconds after another joined, before its first
// whole push reached the joiner, its new backup, had every key of those
// partitions admitted again (live: 83 of 226 partitions).
//
// A partition of this member's bucket file (loaded, resumed: Moves.resume)
// is not one of those, even idle (no states): the file is its state.
// Was: an idle one awaited copies that never come, was counted served
// from nothing, and, given to another member meanwhile, went there as a
// Lost part, which that member, holding nothing either, awaited for its
// whole hand-off wait (an hour with --dead-after 1h: seen as a flaky
// TestLastActiveMemberStoppedCleanlyNeedsNoRecovery).
func (o *Owner) AwaitCopies(m *Moves, next *ring.Ring) {
	if len(next.Members()) < 2 {
		return
	}
	loaded := make(map[uint32]bool, len(o.loaded))
	for _, p := range o.loaded {
		loaded[p] = true
	}
	for p, how := range m.Gained {
		if how != GainPromote || loaded[p] {
			continue
		}
		g := &o.moving[p]
		g.Lock()
		bare := !o.holdsAny(p)
		g.Unlock()
		if bare {
			m.Gained[p] = GainAwait
			if m.CopyOnly == nil {
				m.CopyOnly = map[uint32]bool{}
			}
			m.CopyOnly[p] = true
		}
	}
}

// ReleaseCopies drops the backup copies of kept that KeepCopies kept for
// the ring of epoch, unless this member owns or backs up the partition
// in its view now, or a newer ring kept the copy again. It runs between
// two Applies, never during one (applyMu): the view it reads is the one
// the copies were last kept or dropped under.
func (o *Owner) ReleaseCopies(epoch uint64, kept []uint32) {
	o.applyMu.Lock()
	defer o.applyMu.Unlock()
	v := o.cell.Load()
	for _, p := range kept {
		g := &o.moving[p]
		g.Lock()
		if o.kept[p].epoch == epoch {
			o.kept[p] = keptCopy{}
			ow, _ := v.Ring.Owner(p)
			b, _ := v.Ring.Backup(p)
			if ow.ID != o.self && b.ID != o.self {
				o.dropBackup(p)
			}
		}
		g.Unlock()
	}
}

// CopiesFor exports this member's backup copies of the partitions of
// plan (PlanCopyForwards) whose old owner is silent, as backup pushes at
// v's epoch to their owner and their backup in v, the ring now (which
// may be newer than the one that planned them), one batch per member. A
// member that is silent itself gets nothing, and neither does the
// backup of a partition this member owns now (it pushes its own whole
// copy there, the copy merged in). A copy that holds nothing and was
// never whole (no push reached this member) is not sent: there is
// nothing to keep.
func (o *Owner) CopiesFor(v *view.View, plan map[uint32]ring.Member, silent map[string]bool) []*BackupBatch {
	now := o.now()
	out := batchesTo{epoch: v.Epoch()}
	for p, was := range plan {
		if !silent[was.ID] {
			continue
		}
		ow, ok := v.Ring.Owner(p)
		if !ok || ow.ID == o.self {
			continue
		}
		data := o.copyOf(p, now)
		if data == nil {
			continue
		}
		pt := transport.PushPart{Partition: p, Data: data}
		if !silent[ow.ID] {
			out.add(ow, pt)
		}
		if b, ok := v.Ring.Backup(p); ok && b.ID != o.self && b.ID != ow.ID && !silent[b.ID] {
			out.add(b, pt)
		}
	}
	return out.list
}

// batchesTo groups push parts into one BackupBatch per member, in the
// order the members first come, all at one epoch.
type batchesTo struct {
	epoch uint64
	by    map[string]*BackupBatch
	list  []*BackupBatch
}

// add appends pt to the batch for member to, starting it if need be.
func (g *batchesTo) add(to ring.Member, pt transport.PushPart) {
	b := g.by[to.ID]
	if b == nil {
		if g.by == nil {
			g.by = map[string]*BackupBatch{}
		}
		b = &BackupBatch{To: to, Epoch: g.epoch}
		g.by[to.ID] = b
		g.list = append(g.list, b)
	}
	b.Parts = append(b.Parts, pt)
}

// copyOf exports this member's backup copy of partition p at now, or
// returns nil when it holds none: no state, and never a whole copy (an
// empty whole copy is one: an idle partition).
func (o *Owner) copyOf(p uint32, now int64) []byte {
	g := &o.moving[p]
	g.Lock()
	defer g.Unlock()
	if o.backup.PartitionLen(p) > 0 || o.based[p].Load() {
		return o.backup.Export(nil, p, now)
	}
	return nil
}

// membersChanged counts the members that are in one of a and b and not
// the same (id and addresses) in the other.
func membersChanged(a, b *ring.Ring) int {
	n := 0
	for _, m := range a.Members() {
		if o, ok := b.Member(m.ID); !ok || o != m {
			n++
		}
	}
	for _, m := range b.Members() {
		if _, ok := a.Member(m.ID); !ok {
			n++
		}
	}
	return n
}

// Outgoing is a partition to push to its new owner after a ring change.
//
// Part.Data is the partition's stream as exported at At (the owner's
// clock, Unix ns) by src; it is kept as it is and restamped at each send
// (Owner.sendable), so that a hand-off retried, readdressed or taken back
// later still arrives normalised to its sender's now.
type Outgoing struct {
	To   ring.Member
	Part transport.PushPart
	At   int64          // when Part.Data was exported, on the owner's clock (ns)
	src  *limiter.Table // the table that exported Part.Data; nil for a Lost part
	// awaited says Part is Lost because this member awaited the
	// partition's hand-off itself when the ring moved on: the state is
	// on its way from the member before, whose push this member now
	// refuses, so that it goes to the new owner next (see lostDelay).
	awaited bool
	// standIn says Part is this member's backup copy of a partition it
	// awaited when the ring moved on: passed on as the best it holds,
	// while the state itself is on its way from the member that served
	// the partition. It is never kept in a bucket file (saveBuckets).
	standIn bool
}

// sendable is og's part as it goes out at now (the owner's clock, ns):
// its data restamped from its export at og.At to now (see
// limiter.Table.Restamp), so that its states arrive as old as they are,
// however long the hand-off waited. Data that does not restamp (it
// cannot: it is src's own export) goes as exported, younger than its
// states, which admits less, never more.
func (o *Owner) sendable(og Outgoing, now int64) transport.PushPart {
	pt := og.Part
	if og.src == nil || pt.Lost || now <= og.At {
		return pt
	}
	data, err := og.src.Restamp(nil, pt.Data, og.At, now)
	if err != nil {
		o.log.Error("hand-off does not restamp; sending it as exported", "partition", pt.Partition, "err", err)
		return pt
	}
	pt.Data = data
	return pt
}

// Apply publishes next and carries out m: partitions lost are frozen,
// exported and dropped (returned as pushes for their new owners, whom the
// caller must send them to), partitions gained become servable now or
// await their hand-off. It must be called from one goroutine at a time.
func (o *Owner) Apply(next *view.View, m Moves) []Outgoing {
	o.applyMu.Lock()
	defer o.applyMu.Unlock()
	o.useRules(next)
	now := o.now()
	var out []Outgoing
	for p, to := range m.Lost {
		g := &o.moving[p]
		g.Lock()
		st := o.getState(p)
		o.setState(p, partAway)
		part := transport.PushPart{Partition: p}
		var src *limiter.Table
		awaited, standIn := false, false
		switch {
		case st == partServing:
			src = o.table
		case o.table.PartitionLen(p) > 0:
			// It awaits its hand-off holding states of its own (a refused
			// hand-off taken back, or what it kept across a rejoin: see
			// TakeBack): they go with the backup copy merged in.
			if o.backup.PartitionLen(p) > 0 {
				if _, err := o.table.Import(p, o.backup.Export(nil, p, now), now); err != nil {
					o.log.Error("merging a backup copy into a partition moving out", "partition", p, "err", err)
				}
			}
			src = o.table
		case o.backup.PartitionLen(p) > 0 || o.based[p].Load():
			// Its state never reached us (the ring moved on before the
			// hand-off came), but we hold its backup copy: the best there
			// is. A whole copy with nothing in it goes too (an idle
			// partition): a Lost part in its place no longer makes a
			// receiver with nothing of its own serve at once
			// (takeHandoff), and a crashed member's restart, whose
			// mark-down and return a backup applies within its lostDelay,
			// would await its idle partitions for the hand-off wait.
			src, standIn = o.backup, true
		default:
			part.Lost = true
			awaited = st == partAwaiting
		}
		if src != nil {
			part.Data = src.Export(nil, p, now)
			if b, ok := next.Ring.Backup(p); ok && b.ID == o.self || o.kept[p].epoch == next.Epoch() {
				// We back up the partition we hand off (the usual case: the
				// backup is the owner of the ring without the new owner),
				// or keep it for a while (KeepCopies: its backup is another
				// member, which holds nothing of it yet).
				// Keep what we hand off as our copy until the new owner's
				// first whole push replaces it: was none, so a new owner
				// that crashed before that push (one backup interval) had
				// its partitions promoted from nothing.
				//
				// It is a whole copy, as a backup push's is (based): even
				// empty (an idle partition), it is what the new owner
				// serves from, so a crash of the new owner before its
				// first push has it promoted and handed back at once.
				// Was: not based, and an empty one counted as nothing
				// (holdsAny): the backup and the restarted owner each
				// awaited the other's hand-off for the whole hand-off wait.
				if src != o.backup {
					o.dropBackup(p)
					if _, err := o.backup.Import(p, part.Data, now); err != nil {
						o.log.Error("keeping a handed-off partition as its backup copy", "partition", p, "err", err)
					} else {
						o.based[p].Store(true)
					}
				}
			}
		}
		o.table.Drop(p)
		o.dirty[p].Store(false)
		g.Unlock()
		if to == "" {
			continue
		}
		if mem, ok := next.Ring.Member(to); ok {
			out = append(out, Outgoing{To: mem, Part: part, At: now, src: src, awaited: awaited, standIn: standIn})
		}
	}
	for _, p := range m.Unback {
		o.dropBackup(p)
	}
	for p, how := range m.Gained {
		switch how {
		case GainAwait:
			// Awaited afresh even if it awaited already: next expects its
			// own hand-off, maybe from another member, and gets its own
			// handoffTimeout (ExpireAwaitingSince).
			g := &o.moving[p]
			g.Lock()
			o.setState(p, partAwaiting)
			o.ownerSilent[p].Store(false) // a new wait: its own copy will say
			o.awaitFrom[p] = next.Epoch()
			o.awaitOwner[p] = m.From[p]
			g.Unlock()
		default:
			o.promote(p, now)
		}
	}
	// An owned partition whose backup changed goes whole to the new one
	// at the next backup round; one whose backup stayed the same member
	// has a whole copy there, and its changes go on as deltas (a copy
	// lost meanwhile refuses them, and is then sent whole: MarkDirty). A
	// partition gained goes whole when it is served (promote,
	// takeHandoff). Was: every owned partition went whole after any ring
	// change, so after a join each owner's first round carried its whole
	// table (seconds of 16 MiB pushes under load at millions of keys),
	// and the partitions whose backup had moved waited that long for a
	// copy (Reserves).
	prev := o.cell.Load()
	for _, p := range next.Ring.PartitionsOf(o.self) {
		if prev == nil || !sameBackup(prev.Ring, next.Ring, p) {
			o.markWhole(p)
		}
	}
	o.cell.Store(next)
	if o.log.Enabled(context.Background(), slog.LevelDebug) {
		// For diagnosis: each gained partition as partition:Gain/states
		// held, each part going out as partition>owner:Lost/bytes.
		var b strings.Builder
		for p, how := range m.Gained {
			fmt.Fprintf(&b, "%d:%d/%d ", p, how, o.table.PartitionLen(p))
		}
		var l strings.Builder
		for _, og := range out {
			fmt.Fprintf(&l, "%d>%s:%v/%dB ", og.Part.Partition, og.To.ID, og.Part.Lost, len(og.Part.Data))
		}
		o.log.Debug("moves applied", "epoch", next.Epoch(), "gained", b.String(), "out", l.String(), "restart", m.Restart)
	}
	return out
}

// sameBackup reports whether a and b give partition p the same backup
// member, with the same addresses.
func sameBackup(a, b *ring.Ring, p uint32) bool {
	ba, ok1 := a.Backup(p)
	bb, ok2 := b.Backup(p)
	return ok1 && ok2 && ba == bb
}

// promote makes partition p servable from our backup copy (empty if we
// have none).
func (o *Owner) promote(p uint32, now int64) {
	g := &o.moving[p]
	g.Lock()
	o.promoteLocked(p, now)
	g.Unlock()
}

// promoteLocked is promote; the caller holds o.moving[p]. States the
// table already holds for p (a partition that awaited its hand-off
// holding states of its own: TakeBack) are merged with the copy, not
// replaced by it: each is what some member admitted.
func (o *Owner) promoteLocked(p uint32, now int64) {
	data := o.backup.Export(nil, p, now)
	o.dropBackup(p)
	if _, err := o.table.Import(p, data, now); err != nil {
		o.log.Error("promoting a backup copy", "partition", p, "err", err)
	}
	o.setState(p, partServing)
	o.markWhole(p)
}

// ExpireAwaiting promotes the backup copy of every partition of parts
// that still waits for its hand-off, whichever ring it began waiting
// under (ExpireAwaitingSince with no bound); tests use it to serve at
// once.
func (o *Owner) ExpireAwaiting(parts []uint32) (promoted int) {
	return o.ExpireAwaitingSince(math.MaxUint64, parts)
}

// ExpireAwaitingSince promotes the backup copy of every partition of
// parts that has waited for its hand-off since the ring of epoch, or an
// older one; the node calls it when the hand-off timeout it started on
// applying that ring ends. A partition that began waiting again under a
// newer ring (it went away and came back, or this member rejoined: a new
// hand-off is due, maybe from another member) is left alone: that ring's
// own timeout, started later, promotes it, so that every wait lasts
// handoffTimeout. Epochs grow with every ring an owner applies.
//
// The state is read under the partition's moving lock: a hand-off taken
// just before is served as it came, not replaced by the copy.
func (o *Owner) ExpireAwaitingSince(epoch uint64, parts []uint32) (promoted int) {
	promoted, _, _ = o.expireAwaitingSince(epoch, parts, math.MaxInt64, false)
	return promoted
}

// expireAwaitingSince is ExpireAwaitingSince, also reporting how many of
// the promoted partitions held nothing to serve from (bare: no copy, no
// state of their own), counted in ServedFromNothing, except that a
// partition whose hand-off is still arriving keeps awaiting it and is
// returned in arriving: one that awaits a member that took part in a
// hand-off to this owner at or after since (monotonic ns since start,
// see handoffSeen; any member's when it awaits none alone), unless that
// owner is known silent. math.MaxInt64 promotes every one. holdBare
// keeps those that hold nothing (bare) awaiting too, returned in
// arriving.
func (o *Owner) expireAwaitingSince(epoch uint64, parts []uint32, since int64, holdBare bool) (promoted, bare int, arriving []uint32) {
	now := o.now()
	o.seenMu.Lock()
	seen := maps.Clone(o.handoffSeen)
	o.seenMu.Unlock()
	for _, p := range parts {
		g := &o.moving[p]
		g.Lock()
		if o.getState(p) == partAwaiting && o.awaitFrom[p] <= epoch {
			if at, ok := seen[o.awaitOwner[p]]; ok && at >= since && !o.ownerSilent[p].Load() {
				arriving = append(arriving, p)
				g.Unlock()
				continue
			}
			if !o.holdsAny(p) {
				if holdBare {
					arriving = append(arriving, p)
					g.Unlock()
					continue
				}
				bare++
			}
			o.promoteLocked(p, now)
			promoted++
		}
		g.Unlock()
	}
	o.servedBare.Add(uint64(bare))
	return promoted, bare, arriving
}

// sawHandoff records that a hand-off push from member from just arrived,
// or had parts taken (handoffSeen).
func (o *Owner) sawHandoff(from string) {
	at := o.mono()
	o.seenMu.Lock()
	o.handoffSeen[from] = at
	o.handoffSeen[""] = at
	o.seenMu.Unlock()
}

// mono is the monotonic instant now, in ns since the owner began.
func (o *Owner) mono() int64 { return int64(time.Since(o.start)) }

// AwaitingParts lists the partitions waiting for their state.
func (o *Owner) AwaitingParts() []uint32 {
	var ps []uint32
	for p := range o.state {
		if o.getState(uint32(p)) == partAwaiting {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// HandlePush takes a hand-off or a backup copy (the data plane's push
// handler).
func (o *Owner) HandlePush(ctx context.Context, push *transport.Push, ack *transport.PushAck) {
	v := o.cell.Load()
	if push.Kind == transport.PushPing {
		// A liveness probe (leader → member) or a lease request (member →
		// leader): the answer is our epoch. Leases are taken by the side
		// that sent, from its own send time (see node's leases).
		if v != nil {
			ack.Epoch = v.Epoch()
		}
		return
	}
	if push.Kind == transport.PushHandoff {
		// Arrived: a wait for this sender's hand-off that ends while the
		// push is being taken (a 16 MiB push of a million states takes a
		// second on a starved machine) goes on. Was: noted only once it
		// was taken, and a joining member whose first pushes came 3 s
		// into its 3.75 s wait served ~200 partitions from nothing while
		// it took them.
		o.sawHandoff(push.From)
	}
	// The pushed states are normalised to their sender's now at its send
	// (Outgoing): their ages count from their arrival, not from after
	// the wait for the push's epoch below, or they would be that much
	// younger than they are.
	now := o.now()
	if v == nil || push.Epoch > v.Epoch() {
		v = o.cell.Await(ctx, push.Epoch, 0, epochWait)
	}
	if v == nil {
		return // every part stays PushRejected
	}
	ack.Epoch = v.Epoch()
	var late lateHandoffs
	taken := false
	defer func() {
		if taken { // and again once taken
			o.sawHandoff(push.From)
		}
	}()
	for i := range push.Parts {
		pt := &push.Parts[i]
		if int(pt.Partition) >= len(o.moving) {
			ack.Status[i] = transport.PushRejected
			continue
		}
		switch push.Kind {
		case transport.PushHandoff:
			if ack.Status[i] = o.takeHandoff(v, pt, now, &late, false); ack.Status[i] == transport.PushOK {
				o.handoffsIn.Add(1)
				taken = true
			}
		case transport.PushBackup:
			ack.Status[i] = o.takeBackup(v, pt, push.From, push.Epoch, now)
		}
	}
	late.log(o.log, push.From)
}

// lateHandoffs tallies the parts of one push that came for partitions
// already served (see mergeHandoff), for one log line per push rather
// than one per partition (a restart's hand-back logged ~130).
type lateHandoffs struct {
	merged, states int // parts merged, and the states they carried
	lost           int // Lost parts: nothing to merge
	first          uint32
}

func (l *lateHandoffs) add(p uint32, states int, lost bool) {
	if l.merged+l.lost == 0 {
		l.first = p
	}
	if lost {
		l.lost++
		return
	}
	l.merged++
	l.states += states
}

func (l *lateHandoffs) log(log *slog.Logger, from string) {
	if l.merged > 0 {
		// Worth seeing: a promotion that should have waited is otherwise
		// invisible.
		log.Info("late or duplicate hand-offs merged into partitions already served",
			"from", from, "partitions", l.merged, "states", l.states, "first", l.first)
	}
	if l.lost > 0 {
		log.Debug("lost hand-offs for partitions already served; nothing to merge", "from", from, "partitions", l.lost)
	}
}

// takeHandoff takes the hand-off of partition p from its previous owner.
// Awaited, it becomes what the partition serves. Already served (its
// backup copy was promoted after handoffTimeout, this member kept the
// partition across rings it never saw, or the push is a duplicate of one
// taken), it is merged into what is served: the old owner may have
// admitted more than the copy knew, and dropping that would hand budget
// back. Import merges per key conservatively (limiter.Table.Import), so a
// duplicate changes nothing. A Lost hand-off has nothing to merge; into
// a partition that awaits, it ends the wait only when this member has
// something of its own to serve the partition from (holdsAny), never
// from nothing: the state may still come from elsewhere, and the
// hand-off wait is what bounds waiting for it.
//
// Everything happens under p's moving lock, against p's state as it is
// then: a move out of p (Apply) either comes after, and its export holds
// what was merged, or came before, and the hand-off is refused as
// NOT_OWNER so that its sender takes it to the new owner; the table, and
// its fence, are never written for a partition this member has let go.
//
// back says the part is this member's own, taken back (TakeBack): into a
// partition that awaits its hand-off it is merged, and the partition
// keeps waiting.
//
// A sealed owner (stopping, its state saved: saveBuckets) refuses every
// part as PushRejected: taken now, it would be lost with the process.
// Its sender keeps it (in its own bucket file if it stops too: see
// handoffs.stranded) or takes it to the next owner the ring names.
func (o *Owner) takeHandoff(v *view.View, pt *transport.PushPart, now int64, late *lateHandoffs, back bool) transport.PushStatus {
	if owner, ok := v.Ring.Owner(pt.Partition); !ok || owner.ID != o.self {
		return transport.PushNotOwner
	}
	p := pt.Partition
	g := &o.moving[p]
	g.Lock()
	defer g.Unlock()
	if o.sealed.Load() {
		return transport.PushRejected
	}
	switch o.getState(p) {
	case partAway:
		// v names us, but a newer ring is moving p out right now (Apply
		// publishes its view only after the move).
		return transport.PushNotOwner
	case partServing:
		return o.mergeHandoff(p, pt, now, late)
	}
	switch {
	case pt.Lost && back:
		return transport.PushOK // nothing to hold
	case pt.Lost && !o.holdsAny(p):
		// The sender has nothing, and neither have we: serving now would
		// serve the partition from nothing, while its state may be on its
		// way from a member the sender awaited it from (listed active,
		// not back yet: a whole cluster's last member, its buckets in
		// its bucket file, started after the others). The partition
		// keeps awaiting; its hand-off wait (expireLater) ends that.
		return transport.PushOK
	case pt.Lost:
		o.promoteLocked(p, now)
		return transport.PushOK
	}
	// Merged with what the partition holds while it awaits (taken back).
	if _, err := o.table.Import(p, pt.Data, now); err != nil {
		o.log.Error("hand-off does not decode", "partition", p, "back", back, "err", err)
		return transport.PushRejected
	}
	if back {
		return transport.PushOK
	}
	if o.backup.PartitionLen(p) > 0 {
		// Our copy may hold what the sender's state lacks: our own budgets
		// saved at a stop (handOffLoaded) while the sender served the
		// partition afresh. A copy of the sender's own history adds nothing.
		if _, err := o.table.Import(p, o.backup.Export(nil, p, now), now); err != nil {
			o.log.Error("merging a backup copy into a hand-off", "partition", p, "err", err)
		}
	}
	o.dropBackup(p)
	o.setState(p, partServing)
	o.markWhole(p)
	return transport.PushOK
}

// holdsAny reports whether this member has anything to serve partition
// p from besides a hand-off: a backup copy (a whole one, even empty, or a
// bucket file's loaded copy) or states of its own in the table (taken
// back: TakeBack). The caller holds o.moving[p].
func (o *Owner) holdsAny(p uint32) bool {
	return o.based[p].Load() || o.backup.PartitionLen(p) > 0 || o.table.PartitionLen(p) > 0
}

// TakeBack takes back parts of hand-offs of this member's own that the
// ring gives back to it (their target refused them, or is gone: see
// handoffs.readdress), under the view of epoch or a newer one; status
// gets each part's answer, as HandlePush's ack would.
//
// A part for a partition this member serves is merged into it, as a late
// hand-off is. A part for a partition that awaits its hand-off is merged
// into the table but the partition keeps waiting: the ring gave it back
// through a ring in which another member owned it, and that member may
// have served it meanwhile (from its backup copy: this member was marked
// dead while asleep, say), so only that member's hand-back, or the
// hand-off timeout, makes it servable, each merged with what was taken
// back. Serving the taken-back states at once answered the checks queued
// while this member slept from its own stale budget (bug G in
// test/chaos/README.md: 42 admitted of 40).
func (o *Owner) TakeBack(ctx context.Context, epoch uint64, parts []transport.PushPart, status []transport.PushStatus) {
	now := o.now()
	v := o.cell.Load()
	if v == nil || epoch > v.Epoch() {
		v = o.cell.Await(ctx, epoch, 0, epochWait)
	}
	for i := range parts {
		status[i] = transport.PushRejected
	}
	if v == nil {
		return
	}
	var late lateHandoffs
	for i := range parts {
		if int(parts[i].Partition) < len(o.moving) {
			status[i] = o.takeHandoff(v, &parts[i], now, &late, true)
		}
	}
	late.log(o.log, o.self)
}

// AwaitedFromAlone returns, by the epoch of the ring each began awaiting
// under, those of parts that still await their hand-off from member by
// alone (Moves.From) under a ring no newer than epoch: by refused this
// member's own hand-off of them as NOT_OWNER at epoch, so it never took
// their state, and it will not serve them (its view is past the ring
// that gave them back); if it held them all the same, its hand-off is
// on its way already (as is any from an owner of rings this member
// skipped), and one later than the wait is merged as a late hand-off.
// Their wait need not outlast a lease of by's (Node.handoffWait):
// handoffTimeout, as with the default --dead-after, is enough
// (handoffs.expireSoon).
// Was: a member that joined and skipped the ring in which it owned a
// partition refused the hand-off and never sent one back, and the
// partition awaited it for the whole hand-off wait (an hour with
// --dead-after 1h; a CI flake of TestCrashRestartWithABackupThatSkipsTheMarkDownIdle).
func (o *Owner) AwaitedFromAlone(by string, epoch uint64, parts []uint32) map[uint64][]uint32 {
	if by == "" {
		return nil
	}
	var out map[uint64][]uint32
	for _, p := range parts {
		if int(p) >= len(o.moving) {
			continue
		}
		g := &o.moving[p]
		g.Lock()
		if o.getState(p) == partAwaiting && o.awaitOwner[p] == by && o.awaitFrom[p] <= epoch {
			if out == nil {
				out = map[uint64][]uint32{}
			}
			out[o.awaitFrom[p]] = append(out[o.awaitFrom[p]], p)
		}
		g.Unlock()
	}
	return out
}

// mergeHandoff merges a hand-off into partition p, which this member
// already serves (see takeHandoff); the caller holds o.moving[p]. Checks
// go on meanwhile: Import is one step under the table partition's lock.
func (o *Owner) mergeHandoff(p uint32, pt *transport.PushPart, now int64, late *lateHandoffs) transport.PushStatus {
	if pt.Lost {
		late.add(p, 0, true)
		return transport.PushOK
	}
	n, err := o.table.Import(p, pt.Data, now)
	if err != nil {
		o.log.Error("hand-off does not decode", "partition", p, "err", err)
		return transport.PushRejected
	}
	o.markWhole(p) // its backup holds the served states, not the merged ones
	late.add(p, n, false)
	return transport.PushOK
}

func (o *Owner) takeBackup(v *view.View, pt *transport.PushPart, from string, epoch uint64, now int64) transport.PushStatus {
	b, ok := v.Ring.Backup(pt.Partition)
	if !ok || b.ID != o.self {
		if st, ok := o.takeCopy(v, pt, epoch, now); ok {
			return st
		}
		o.registerSets(pt, now)
		return transport.PushNotOwner
	}
	if pt.Lost {
		return transport.PushOK
	}
	p := pt.Partition
	if pt.Delta {
		// The states changed since the owner's previous push replace
		// ours; without a whole copy to apply them to, ask for one.
		if !o.based[p].Load() {
			o.registerSets(pt, now)
			return transport.PushRejected
		}
		if _, err := o.backup.ImportChanges(p, pt.Data, now); err != nil {
			return transport.PushRejected
		}
		return transport.PushOK
	}
	if owner, ok := v.Ring.Owner(p); !ok || owner.ID != from {
		// Not the owner's push: the partition's backup in an earlier ring
		// passing its copy on (PlanCopyForwards), or an owner of an
		// earlier ring. It is merged, conservatively, with what the
		// owner pushed: replacing that would forget what the owner
		// admitted since the copy was made.
		if _, err := o.backup.Import(p, pt.Data, now); err != nil {
			return transport.PushRejected
		}
		o.based[p].Store(true)
		return transport.PushOK
	}
	// A whole copy replaces the previous one: states that went idle on
	// the owner are gone from its export too.
	o.dropBackup(p)
	if _, err := o.backup.Import(p, pt.Data, now); err != nil {
		return transport.PushRejected
	}
	o.based[p].Store(true)
	return transport.PushOK
}

// takeCopy takes a whole backup copy of a partition this member owns in
// v: its backup in an earlier ring passes its copy on, the old owner
// being silent (PlanCopyForwards, Node.sendCopies), or the old owner, not
// yet aware that it lost the partition, still pushes what it admits to
// its backup of then. Into a partition that awaits its hand-off the copy
// is merged into this member's own copy, which the hand-off is merged
// with when it comes, and which is served if it does not (the hand-off
// wait); pushed at epoch, the ring the partition awaits under or a newer
// one, it marks the old owner silent (ownerSilent). Into a partition
// served already (promoted at once: the old owner marked dead right
// after the change that moved it) it is merged as a late hand-off is,
// conservatively: a copy older than what is served changes nothing. ok
// is false when the part is not such a copy (this member does not own
// the partition, or the part is a delta or lost): the caller answers as
// before.
func (o *Owner) takeCopy(v *view.View, pt *transport.PushPart, epoch uint64, now int64) (st transport.PushStatus, ok bool) {
	p := pt.Partition
	if owner, ok := v.Ring.Owner(p); !ok || owner.ID != o.self || pt.Lost || pt.Delta {
		return 0, false
	}
	g := &o.moving[p]
	g.Lock()
	defer g.Unlock()
	switch o.getState(p) {
	case partAwaiting:
		if _, err := o.backup.Import(p, pt.Data, now); err != nil {
			o.log.Error("backup copy for an awaited partition does not decode", "partition", p, "err", err)
			return transport.PushRejected, true
		}
		o.based[p].Store(true)
		if epoch >= o.awaitFrom[p] {
			// Sent under the ring this member awaits the partition under
			// (or a newer one), in which nobody else owns it: a copy
			// passed on by its backup of the ring before, which pinged
			// the old owner and got no answer, so no hand-off comes
			// before the wait ends. (A push of an older ring is the old
			// owner's own, to its backup of then: it has not seen the
			// change yet, and its hand-off is near.)
			o.ownerSilent[p].Store(true)
		}
		return transport.PushOK, true
	case partServing:
		if o.sealed.Load() {
			return transport.PushRejected, true // saved already: it would be lost
		}
		o.registerSets(pt, now) // the push's later backup parts may name them
		var late lateHandoffs
		return o.mergeHandoff(p, pt, now, &late), true
	}
	return 0, false
}

// registerSets registers the rule sets a backup part not taken carries
// in full: the push's later parts may name them by reference (Sent).
func (o *Owner) registerSets(pt *transport.PushPart, now int64) {
	if !pt.Lost {
		_ = o.backup.RegisterSets(pt.Data, now) // a stream that does not decode registers nothing
	}
}

// dropBackup forgets our backup copy of partition p.
func (o *Owner) dropBackup(p uint32) {
	o.based[p].Store(false)
	o.backup.Drop(p)
}

// markWhole makes the next backup round push all of partition p: its
// backup member may have changed, or lost a push, or p's state came from
// elsewhere (a hand-off, a promoted copy) rather than from checks.
func (o *Owner) markWhole(p uint32) {
	o.whole[p].Store(true)
	o.dirty[p].Store(true)
}

// BackupPushes exports every changed partition this member owns and
// serves, grouped by backup member, and clears their changed marks: the
// states changed since the previous push (a delta), or the whole
// partition when markWhole asked for it. The caller sends them, and marks
// them dirty again (MarkDirty) if sending fails.
func (o *Owner) BackupPushes() map[string]*BackupBatch {
	v := o.cell.Load()
	if v == nil {
		return nil
	}
	now := o.now()
	out := map[string]*BackupBatch{}
	var buf []byte // every partition's stream, one after another: few allocations a round
	for _, p := range v.Ring.PartitionsOf(o.self) {
		if !o.dirty[p].Load() || o.getState(p) != partServing {
			continue
		}
		b, ok := v.Ring.Backup(p)
		if !ok {
			o.dirty[p].Store(false)
			continue
		}
		o.dirty[p].Store(false)
		bb := out[b.ID]
		if bb == nil {
			bb = &BackupBatch{To: b, Epoch: v.Epoch(), refs: o.refsOf(b).round()}
			out[b.ID] = bb
		}
		start := len(buf)
		var whole bool
		buf, whole = o.table.ExportChanges(buf, p, now, o.whole[p].Swap(false), bb.refs)
		data := buf[start:len(buf):len(buf)] // a later append never writes into it
		bb.Parts = append(bb.Parts, transport.PushPart{Partition: p, Delta: !whole, Data: data})
	}
	return out
}

// BackupBatch is the changed partitions bound for one backup member.
type BackupBatch struct {
	To    ring.Member
	Epoch uint64
	Parts []transport.PushPart

	refs *roundRefs // the rule sets its streams name by reference, and those they carry in full
}

// BackupAnswered takes the answer to the push of b: err when it failed,
// else ack. The parts not taken go again, whole, at the next round
// (MarkDirty; all of them when the push failed). When its backup member
// took every part, the rule sets b carried in full are held there and
// later pushes name them by reference; otherwise later pushes carry
// every set in full until they are taken (a member that restarted,
// released a set, or could not read a stream holds what it holds, not
// what was sent).
func (o *Owner) BackupAnswered(b *BackupBatch, ack *transport.PushAck, err error) {
	taken := err == nil && len(ack.Status) == len(b.Parts)
	if err != nil {
		o.MarkDirty(b.Parts)
	} else {
		for i, st := range ack.Status {
			if st == transport.PushRejected {
				o.MarkDirty(b.Parts[i : i+1])
			}
			taken = taken && st == transport.PushOK
		}
	}
	if b.refs != nil {
		b.refs.settle(taken)
	}
}

// setRefs is what this member knows of one backup member's rule sets:
// the versions pushes to it carried in full and it took (see
// Owner.BackupAnswered). A backup member's table holds only the sets its
// imports brought (members apply rules to their own table alone), so
// without this every push carried every rule of every set it named, per
// partition: O(rules) bytes, encoding and decoding for each changed
// partition every backup interval.
type setRefs struct {
	mu    sync.Mutex
	peer  string          // the data-plane address it was known at
	known map[uint64]bool // guarded by mu
}

// refsOf returns what this member knows of backup member m's sets,
// forgotten when m is at another address (another process).
func (o *Owner) refsOf(m ring.Member) *setRefs {
	o.refsMu.Lock()
	defer o.refsMu.Unlock()
	r := o.refs[m.ID]
	if r == nil || r.peer != m.Peer {
		if o.refs == nil {
			o.refs = map[string]*setRefs{}
		}
		r = &setRefs{peer: m.Peer, known: map[uint64]bool{}}
		o.refs[m.ID] = r
	}
	return r
}

// round begins a push round's use of r: a copy of what is known now
// (limiter.SetRefs reads it under partition locks, without r's).
func (r *setRefs) round() *roundRefs {
	r.mu.Lock()
	defer r.mu.Unlock()
	known := make(map[uint64]bool, len(r.known))
	for v := range r.known {
		known[v] = true
	}
	return &roundRefs{of: r, known: known}
}

// roundRefs is one push round's limiter.SetRefs for one backup member.
type roundRefs struct {
	of    *setRefs
	known map[uint64]bool
	full  []uint64 // the versions sent in full this round
}

func (r *roundRefs) Known(version uint64) bool { return r.known[version] }

// Sent notes a set written in full: the round's later streams to the
// same member name it by reference (its parts are taken in order, and
// the sets of one it does not take are registered all the same: see
// takeBackup). Was: every changed partition's stream of the round
// carried it, ~80 MB a round with 10,000 rules, and a push that took
// over its 1 s to send failed, so the next round carried them all again.
func (r *roundRefs) Sent(version uint64) {
	r.full = append(r.full, version)
	r.known[version] = true
}

func (r *roundRefs) settle(ok bool) {
	r.of.mu.Lock()
	defer r.of.mu.Unlock()
	if !ok {
		clear(r.of.known)
		return
	}
	for _, v := range r.full {
		r.of.known[v] = true
	}
}

// MarkDirty marks partitions to be pushed to their backup again, whole:
// a failed delta may have left the copy behind.
func (o *Owner) MarkDirty(parts []transport.PushPart) {
	for _, pt := range parts {
		if int(pt.Partition) < len(o.dirty) {
			o.markWhole(pt.Partition)
		}
	}
}

// handoffTimeout is how long a gained partition waits for its old owner's
// hand-off before its backup copy is promoted, at the least: a node waits
// longer when the old owner's lease may outlast it (Node.handoffWait).
const handoffTimeout = 3 * time.Second
