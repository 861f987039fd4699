package node

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// partState is what an owner does with checks for one partition.
type partState uint8

const (
	partAway     partState = iota // not ours at our epoch: NOT_OWNER
	partServing                   // ours, and the table holds its state
	partAwaiting                  // ours by the ring, its state not arrived yet: checks wait
)

// Owner is the Raft-free side of a member: the bucket tables of the
// partitions it owns, deciding checks for them (it is the data plane's
// handler), taking hand-offs and backup copies of partitions, and waiting
// for an epoch. The Node drives it with SetView as the ring changes; a
// test can drive it by hand.
//
// Fencing: a check is decided only when the owner's view names it owner
// of the partition, the partition's state has arrived (hand-off or backup
// promotion), and its lease is current (the member heard from a Raft
// quorum recently, see SetLease), so one member at most answers for a
// partition at any moment. A partition that is not servable is fenced
// in the table (limiter.Table.Fence), which checks read under the
// partition's own lock: moving a partition out fences it before its
// export, so no decision is lost between the export and the drop that
// follows it, and a check costs one lock. Moves of one partition are
// serialised by its moving lock, which checks never take.
//
// An Owner is safe for concurrent use.
type Owner struct {
	self   string
	now    func() int64 // bucket clock, Unix ns
	log    *slog.Logger
	cell   view.Cell
	table  *limiter.Table // partitions we own (or are handing off)
	backup *limiter.Table // copies of the partitions we back up

	moving []sync.Mutex    // per partition: held while moving it in or out (never by checks)
	state  []atomic.Uint32 // partState; the table is fenced in every state but partServing
	dirty  []atomic.Bool   // changed since the last backup push
	whole  []atomic.Bool   // the next backup push sends the whole partition (see markWhole)
	based  []atomic.Bool   // backup copies: a whole copy arrived, so deltas may follow
	loaded []uint32        // partitions of the bucket file read at start-up, until handOffLoaded
	// loadedAway: loaded copies handed to other owners, kept until
	// takeLoadedAway (both only on the goroutine that applies views)
	loadedAway []uint32
	// awaitFrom is, per partition in partAwaiting, the epoch of the ring
	// under which it began awaiting (see ExpireAwaitingSince); guarded by
	// its moving lock.
	awaitFrom []uint64
	// awaitOwner is, per partition in partAwaiting, the member it awaits
	// alone: its owner in the ring just before, when one member changed
	// in between (Moves.From); "" otherwise. Guarded by its moving lock.
	awaitOwner []string
	// kept is, per partition whose backup copy this member keeps past
	// the ring that took the partition's backing from it (KeepCopies),
	// until ReleaseCopies, what it was kept for (keptCopy); the zero
	// value otherwise. Guarded by its moving lock.
	kept []keptCopy
	// applyMu serializes Apply and ReleaseCopies.
	applyMu sync.Mutex
	// ownerSilent is, per partition in partAwaiting, whether a backup
	// copy came for it from the backup of the ring before, which sends
	// one only when the partition's old owner did not answer its ping
	// (Node.sendCopies): no hand-off is coming before the hand-off wait
	// ends, so checks of the partition are answered at once (by the
	// failure mode, at the router) rather than after waiting for it.
	// Set under its moving lock; cleared when the partition stops
	// awaiting (setState).
	ownerSilent []atomic.Bool

	mu      sync.Mutex    // guards changed
	changed chan struct{} // closed when a partition becomes servable

	seenMu sync.Mutex // guards handoffSeen
	// handoffSeen is, per sending member, the instant (ns since start,
	// monotonic) a hand-off push from it last arrived here or had parts
	// taken; the "" entry is any member's. A wait that ends while its
	// hand-off is still arriving goes on (expireAwaitingSince).
	handoffSeen map[string]int64

	refsMu sync.Mutex          // guards refs
	refs   map[string]*setRefs // per backup member id: the rule sets it holds (BackupPushes)

	// leaseUntil is the monotonic instant (ns since start) until which this
	// member may answer: refreshed while Raft hears from a quorum. 0 = no
	// lease needed (a single member, or tests).
	leaseUntil atomic.Int64
	leaseOn    atomic.Bool
	leaseEpoch atomic.Uint64 // the view's epoch at the last grant (lapsedLong)
	start      time.Time

	awaiting atomic.Int64 // partitions in partAwaiting
	// sealed: the member's stop has saved what it serves (saveBuckets);
	// hand-offs that come later are refused, not taken and then lost.
	sealed atomic.Bool

	decided    atomic.Uint64 // checks decided (StatusOK), for ringlimit_owner_checks_total
	handoffsIn atomic.Uint64 // hand-off parts taken, for ringlimit_handoff_received_partitions_total
	// servedBare: partitions served after their hand-off wait with
	// nothing to serve them from (no copy), for
	// ringlimit_partitions_served_from_nothing_total.
	servedBare atomic.Uint64

	rules atomic.Pointer[versionedRules] // the view's rules, each carrying its set's version

	maxKeys      int          // the most bucket states tracked; 0 = no cap
	refreshEvery uint64       // decided checks between two RefreshFull below the cap (SetMaxKeys)
	full         atomic.Bool  // the table holds maxKeys states or more (refreshed by the sweep and by checks)
	capWarned    atomic.Int64 // bucket clock of the last "at the key cap" line; 0 = none yet
	overCapacity atomic.Int64
}

// SetMaxKeys caps the bucket states this owner tracks (0: no cap). At the
// cap a check of a key it already tracks is decided as always; a check of
// a new key is answered OVER_CAPACITY, which the router answers by the
// rule's failure mode (degraded), and counted. Idle states are dropped
// by the sweep, so the cap frees up as keys go quiet.
//
// The cap is read from a flag that the sweep and every refreshEvery
// decided checks recompute (counting the table costs a lock a partition,
// too much for each check): the table may overshoot it by at most
// min(n/16, 4096) keys plus the checks of the batches in flight. Was:
// refreshed by the sweep only, so a burst of new keys went past any cap
// for a whole sweep tick (5,000 keys under a cap of 100).
func (o *Owner) SetMaxKeys(n int) {
	o.maxKeys = n
	o.refreshEvery = uint64(min(max(n/16, 1), 4096))
}

// RefreshFull recomputes whether the table is at its key cap, and logs
// (at most every capWarnEvery) when it has just reached it.
func (o *Owner) RefreshFull() {
	full := o.maxKeys > 0 && o.table.Len() >= o.maxKeys
	if was := o.full.Swap(full); !full || was {
		return
	}
	now, last := o.now(), o.capWarned.Load()
	if (last != 0 && now-last < int64(capWarnEvery)) || !o.capWarned.CompareAndSwap(last, now) {
		return
	}
	o.log.Warn("this member tracks --max-keys bucket states: checks of new keys are answered by their rule's failure_mode (degraded) until idle keys are swept; raise --max-keys or add members",
		"max_keys", o.maxKeys, "refused_so_far", o.overCapacity.Load())
}

// capWarnEvery is the least time between two lines saying that the
// owner reached its key cap: a table at the cap reaches it again after
// every sweep that freed a few keys. Was: never logged, only counted.
const capWarnEvery = 30 * time.Second

// OverCapacity is how many checks of new keys were refused at the cap.
func (o *Owner) OverCapacity() int64 { return o.overCapacity.Load() }

// versionedRules are a view's rules with Version set, as the table needs
// them to carry states over a rule change (limiter.Table.SetRules), each
// with its buckets' salt (view.Salt) under the view's seed.
type versionedRules struct {
	version uint64
	seed    uint64
	byName  map[string]saltedRule
	older   *versionedRules // the set before, for checks still deciding under the previous view
}

type saltedRule struct {
	rule *limiter.Rule
	salt uint64
}

// ruleFor returns the rule the table decides name with under view v, and
// its buckets' salt: one map lookup on the hot path.
func (o *Owner) ruleFor(v *view.View, name string) (*limiter.Rule, uint64) {
	if rs := o.rules.Load(); rs != nil && rs.seed == v.Seed {
		if rs.version == v.RulesVersion {
			e := rs.byName[name]
			return e.rule, e.salt
		}
		if rs.older != nil && rs.older.version == v.RulesVersion {
			e := rs.older.byName[name]
			return e.rule, e.salt
		}
	}
	r := v.Rules[name] // unversioned (no rules written yet)
	if r == nil {
		return nil, 0
	}
	return r, v.Salt(r)
}

// Publish makes next the owner's view, registering its rule set with the
// table first (states made under older sets carry over), without moving
// partitions; Apply does both.
func (o *Owner) Publish(next *view.View) {
	o.useRules(next)
	o.cell.Store(next)
}

// useRules registers next's rule set, when it is a new one, before any
// check can use it.
func (o *Owner) useRules(next *view.View) {
	if next.RulesVersion == 0 {
		return
	}
	if rs := o.rules.Load(); rs != nil && rs.version == next.RulesVersion {
		return
	}
	o.table.SetSeed(next.Seed) // a rule's algorithm changed keeps its keys' states
	if err := o.table.SetRules(next.RulesVersion, next.List, o.now()); err != nil {
		o.log.Error("registering the rule set; its keys start fresh", "version", next.RulesVersion, "err", err)
		return
	}
	rs := &versionedRules{version: next.RulesVersion, seed: next.Seed, byName: make(map[string]saltedRule, len(next.List))}
	if prev := o.rules.Load(); prev != nil && prev.seed == next.Seed {
		rs.older = &versionedRules{version: prev.version, seed: prev.seed, byName: prev.byName}
	}
	for i := range next.List {
		r := next.List[i]
		r.Version = next.RulesVersion
		rs.byName[r.Name] = saltedRule{&r, next.Salt(&r)}
	}
	o.rules.Store(rs)
}

// NewOwner returns an owner of a table of the given number of partitions.
func NewOwner(self string, partitions int, now func() int64, log *slog.Logger) (*Owner, error) {
	t, err := limiter.NewTable(partitions)
	if err != nil {
		return nil, err
	}
	t.TrackChanges() // backups are pushed as deltas
	b, _ := limiter.NewTable(partitions)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for p := range partitions {
		t.Fence(uint32(p)) // partAway until a move makes it servable
	}
	return &Owner{self: self, now: now, log: log, table: t, backup: b,
		moving: make([]sync.Mutex, partitions), state: make([]atomic.Uint32, partitions),
		dirty: make([]atomic.Bool, partitions), whole: make([]atomic.Bool, partitions), based: make([]atomic.Bool, partitions),
		awaitFrom: make([]uint64, partitions), awaitOwner: make([]string, partitions), kept: make([]keptCopy, partitions), ownerSilent: make([]atomic.Bool, partitions), changed: make(chan struct{}), handoffSeen: map[string]int64{}, start: time.Now()}, nil
}

// keptCopy is why a member keeps a backup copy it no longer needs for
// its own role (Owner.kept).
type keptCopy struct {
	// epoch is the ring the copy was kept under; 0: none kept.
	epoch uint64
	// owner is the partition's owner in that ring, whose crash before
	// the partition's new backup holds a whole copy leaves this copy the
	// only one (Reserves); from its owner before, when that one was
	// handing it off to owner (a crash of it then leaves the hand-off
	// undelivered).
	owner, from ring.Member
}

// Partitions is the table's partition count.
func (o *Owner) Partitions() int { return len(o.moving) }

// Table is the owner's bucket table (tests, metrics).
func (o *Owner) Table() *limiter.Table { return o.table }

// BackupTable holds the copies this member keeps as a backup.
func (o *Owner) BackupTable() *limiter.Table { return o.backup }

// Awaiting is how many owned partitions wait for their state.
func (o *Owner) Awaiting() int { return int(o.awaiting.Load()) }

// broadcast wakes every check waiting for a partition or a lease.
func (o *Owner) broadcast() {
	o.mu.Lock()
	close(o.changed)
	o.changed = make(chan struct{})
	o.mu.Unlock()
}

// SetLeaseUntil says this member may answer until t (a time on this
// process's monotonic clock: take it before asking, so a late answer
// never extends the lease).
func (o *Owner) SetLeaseUntil(t time.Time) {
	was := o.leased()
	if until := int64(t.Sub(o.start)); until > o.leaseUntil.Load() {
		o.leaseUntil.Store(until)
		if v := o.cell.Load(); v != nil {
			o.leaseEpoch.Store(v.Epoch())
		}
	}
	if !was && o.leased() {
		o.broadcast()
	}
}

// EnableLease makes answers depend on the lease (see SetLease).
func (o *Owner) EnableLease(on bool) { o.leaseOn.Store(on) }

// Serving reports whether this owner may answer now (its lease, when
// one is needed, is current).
func (o *Owner) Serving() bool { return o.leased() }

// LeaseRemaining returns how long this owner may still answer under its
// lease (0 once it has run out, or before the first), and false when it
// needs none (a single member): then it may always answer.
func (o *Owner) LeaseRemaining() (time.Duration, bool) {
	return o.leaseRemainingAt(time.Since(o.start))
}

// LeaseEnd is the instant this owner's lease ends (or ended), on the
// monotonic clock; o's start before the first grant.
func (o *Owner) LeaseEnd() time.Time {
	return o.start.Add(time.Duration(o.leaseUntil.Load()))
}

// leaseRemainingAt is LeaseRemaining at elapsed on the owner's monotonic
// clock (time since o.start).
func (o *Owner) leaseRemainingAt(elapsed time.Duration) (time.Duration, bool) {
	if !o.leaseOn.Load() {
		return 0, false
	}
	return max(time.Duration(o.leaseUntil.Load())-elapsed, 0), true
}

// staleLease is how long after its lease ran out an owner stops waiting
// for the next one to decide a batch (lapsedLong).
const staleLease = time.Second

// lapsedLong reports whether this owner's lease ran out staleLease ago or
// more (it had one). A batch that reaches it then, sent under a ring no
// newer than the one of its last grant (leaseEpoch), was most likely sent
// long ago: held in its socket while this process was paused (SIGSTOP, a
// VM's stall) or its network cut, and its sender has answered it by its
// rule's failure mode already. Waiting for the lease and deciding it then
// spent budget for an answer nobody reads — a denied request that counted
// (seen by a new user: a 10 s pause spent one unit per degraded answer
// given meanwhile). Such a batch is answered UNAVAILABLE at once,
// spending nothing. A batch sent under a newer ring (this member is back
// in it: marked dead and active again) or to a lease that lapsed only
// just (a leader's election) still waits for the next grant. A pause
// short of the dead mark leaves the ring as it was: the batches sent
// during it and read at the wake before the next grant are refused too,
// those read after it are decided.
func (o *Owner) lapsedLong() bool {
	until := o.leaseUntil.Load()
	return o.leaseOn.Load() && until > 0 && int64(time.Since(o.start))-until >= int64(staleLease)
}

func (o *Owner) leased() bool {
	return !o.leaseOn.Load() || int64(time.Since(o.start)) < o.leaseUntil.Load()
}

// markDirty notes that partition p changed since its last backup push.
// It writes only when the flag is clear (once per push): the flags of
// many partitions share a cache line, and a store on every check would
// bounce it between cores.
func (o *Owner) markDirty(p uint32) {
	if d := &o.dirty[p]; !d.Load() {
		d.Store(true)
	}
}

func (o *Owner) getState(p uint32) partState { return partState(o.state[p].Load()) }

// setState moves partition p to state s, fencing its table partition
// first when s is not partServing and unfencing it when it is; callers
// hold o.moving[p].
func (o *Owner) setState(p uint32, s partState) {
	if s == partServing {
		o.table.Unfence(p)
	} else {
		o.table.Fence(p)
	}
	old := partState(o.state[p].Swap(uint32(s)))
	if old == partAwaiting && s != partAwaiting {
		o.awaiting.Add(-1)
		o.ownerSilent[p].Store(false)
	} else if old != partAwaiting && s == partAwaiting {
		o.awaiting.Add(1)
	}
	if s == partServing {
		o.broadcast()
	}
}

func (o *Owner) servable() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

// epochWait bounds how long a check waits for this owner's ring to reach
// the sender's epoch; stateWait how long it waits for a partition's
// hand-off to arrive (both also bounded by the check's deadline).
const (
	epochWait = 200 * time.Millisecond
	// stateWait and leaseWait are upper bounds: the check's own deadline
	// (the router's forward timeout, 250ms by default) usually ends the
	// wait first. A hand-off is a few milliseconds on an idle machine.
	stateWait = 2 * time.Second
	leaseWait = 2 * time.Second // a new member's first lease is one ping away
)

// HandleBatch decides the checks of partitions this member owns; it is
// the data plane's handler and the router's local path.
//
// A sender whose ring is newer than ours is usually right: the change is
// on its way through Raft to us, so we wait for it (bounded by ctx and
// epochWait) rather than answer from a stale ring. A partition whose
// state is still on its way (hand-off) makes its checks wait for it,
// bounded by ctx and stateWait.
//
// A group of joined checks (transport.Check.Joined) is decided as a unit
// (limiter.Table.CheckGroup): every check spends or none does. A group
// that would wait for a partition waits whole and is decided again
// whole; any other refusal of one of its checks (NOT_OWNER, UNKNOWN_RULE,
// BAD_REQUEST, OVER_CAPACITY) is the answer of all, and nothing is spent.
func (o *Owner) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	v := o.cell.Load()
	if v == nil || req.Epoch > v.Epoch() || req.RulesVersion > v.RulesVersion {
		// A new member is sent checks as soon as the ring names it,
		// possibly before the log has reached it; a sender that decided
		// under newer rules (a write it acknowledged) must not be
		// answered under older ones.
		v = o.cell.Await(ctx, req.Epoch, req.RulesVersion, epochWait)
	}
	if v == nil {
		for i := range resp.Results {
			resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
		}
		return
	}
	resp.Epoch = v.Epoch()
	if !o.leased() && (o.lapsedLong() && req.Epoch <= o.leaseEpoch.Load() || !o.awaitLease(ctx)) {
		for i := range resp.Results {
			resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
		}
		return
	}
	var deadline *time.Timer
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	gaveUp := false
	now := o.now()
	var cx checkCtx
	cx.use(o, v, req.RulesVersion)
	for i, n := 0, len(req.Checks); i < n; {
		end := i + 1 // a group: the check at i and the joined ones after it
		for end < n && req.Checks[end].Joined {
			end++
		}
		cs, rs := req.Checks[i:end], resp.Results[i:end]
		i = end
		if deadline != nil && !o.leased() {
			// The batch waited for a partition, and the lease ran out
			// meanwhile: decide nothing more (see below).
			for k := range rs {
				rs[k] = transport.Result{Status: transport.StatusUnavailable}
			}
			continue
		}
		ok := o.decideRun(&cx, cs, rs, now)
		for !ok && !gaveUp && !o.awaitsSilentOwner(cs) {
			// A partition's state is on its way (hand-off), or it is
			// moving out right now (its new view is being published):
			// wait for either.
			ch, vch := o.servable(), o.cell.Changed()
			if nv := o.cell.Load(); nv.Epoch() > v.Epoch() { // published before we subscribed
				v = nv
				cx.use(o, v, req.RulesVersion)
				resp.Epoch = v.Epoch()
			}
			if ok = o.decideRun(&cx, cs, rs, now); ok {
				break
			}
			if deadline == nil {
				deadline = time.NewTimer(stateWait)
			}
			select {
			case <-ch:
			case <-vch:
			case <-deadline.C:
				gaveUp = true
			case <-ctx.Done():
				gaveUp = true
			}
			if !gaveUp && !o.leased() {
				// The lease was checked once, when the batch came; after a
				// wait (up to stateWait) it may have ended, and the member
				// been marked dead and its partitions served by others:
				// deciding now would answer from a partition it no longer
				// holds. Was: decided all the same (a batch sent with 5 ms
				// of lease left was decided 1.4 s later, after the dead
				// mark, and its key admitted twice its limit).
				gaveUp = true
			}
			if !gaveUp {
				if nv := o.cell.Load(); nv.Epoch() > v.Epoch() {
					v = nv
					cx.use(o, v, req.RulesVersion)
					resp.Epoch = v.Epoch()
				}
				now = o.now()
				ok = o.decideRun(&cx, cs, rs, now)
			}
		}
	}
	decided := 0
	for i := range resp.Results {
		if resp.Results[i].Status == transport.StatusOK {
			decided++
		}
	}
	n := o.decided.Add(uint64(decided))
	if o.maxKeys > 0 && decided > 0 && !o.full.Load() && n/o.refreshEvery != (n-uint64(decided))/o.refreshEvery {
		o.RefreshFull() // at most one new key a decided check: see SetMaxKeys
	}
}

// awaitsSilentOwner reports whether a check of cs is of a partition that
// awaits the hand-off of an owner known to be silent (ownerSilent):
// waiting for it would only hold the batch until its deadline. Was: each
// batch with such a check waited the router's forward timeout (250 ms)
// for the whole hand-off wait, every other check of it too (chaos
// scenario 12: 70 % of the queries between the kill and the end of the
// wait answered after 250 ms).
func (o *Owner) awaitsSilentOwner(cs []transport.Check) bool {
	for i := range cs {
		if p := cs[i].Partition; int(p) < len(o.ownerSilent) && o.ownerSilent[p].Load() && o.getState(p) == partAwaiting {
			return true
		}
	}
	return false
}

// Decided returns how many checks this owner has decided (answered OK:
// allowed or denied), whichever front door they came through.
func (o *Owner) Decided() uint64 { return o.decided.Load() }

// HandoffsReceived returns how many hand-off parts (partitions) this
// owner took from their previous owners.
func (o *Owner) HandoffsReceived() uint64 { return o.handoffsIn.Load() }

// ServedFromNothing returns how many partitions this owner began to
// serve, their hand-off wait over, with no backup copy and no state of
// their own: their keys started full (an owner and its backup both
// lost, or a hand-off lost with no copy).
func (o *Owner) ServedFromNothing() uint64 { return o.servedBare.Load() }

// Prompt reports whether HandleBatch would decide req without waiting:
// our ring and rules are as new as the sender's, we hold the lease, and no
// partition of ours awaits its hand-off. It is the data plane's cue to
// decide req on the connection's read goroutine (transport.PromptHandler).
// It reads a few atomics and changes nothing; a view published right
// after it may still make HandleBatch wait.
func (o *Owner) Prompt(req *transport.BatchRequest) bool {
	v := o.cell.Load()
	return v != nil && req.Epoch <= v.Epoch() && req.RulesVersion <= v.RulesVersion &&
		o.leased() && o.awaiting.Load() == 0
}

// decideRun decides one check, or a group of joined checks as a unit,
// into rs, and reports false when the answer is StatusUnavailable (a
// partition is on its way: the caller may wait and decide again), unless
// cx is behind the sender's rules (a wait for a partition would not
// mend that).
func (o *Owner) decideRun(cx *checkCtx, cs []transport.Check, rs []transport.Result, now int64) bool {
	if len(cs) == 1 {
		o.decide(cx, &cs[0], now, &rs[0])
		return rs[0].Status != transport.StatusUnavailable || cx.behind
	}
	st := o.decideGroup(cx, cs, rs, now)
	if st != transport.StatusOK {
		for i := range rs {
			rs[i] = transport.Result{Status: st}
		}
	}
	return st != transport.StatusUnavailable || cx.behind // behind: nothing to wait for here
}

// awaitLease waits (bounded by ctx and stateWait) for the lease: a member
// that just joined or restarted has it within one Raft heartbeat.
func (o *Owner) awaitLease(ctx context.Context) bool {
	t := time.NewTimer(leaseWait)
	defer t.Stop()
	for {
		ch := o.servable()
		if o.leased() {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// decide decides one check under cx's view into *res, or says why not.
// It writes its answer in place rather than returning it: on a batch's
// hot path the copies of a returned Result were ~5% of a check.
func (o *Owner) decide(cx *checkCtx, c *transport.Check, now int64, res *transport.Result) {
	rule, salt, st := o.resolve(cx, c)
	if st != transport.StatusOK {
		*res = transport.Result{Status: st}
		return
	}
	bucket := limiter.BucketHash(c.KeyHash, salt)
	if o.full.Load() && c.Cost > 0 && o.getState(c.Partition) == partServing && !o.table.HoldsKey(c.Partition, bucket, rule.Name) {
		o.overCapacity.Add(1)
		*res = transport.Result{Status: transport.StatusOverCapacity}
		return
	}
	var d limiter.Decision
	err := o.table.CheckInto(c.Partition, bucket, rule, now, int64(c.Cost), &d)
	switch {
	case err == limiter.ErrFenced:
		// Awaiting its state, or our view says we own it but the move in
		// has not been applied: SetView is running right now.
		*res = transport.Result{Status: transport.StatusUnavailable}
		return
	case err != nil:
		*res = transport.Result{Status: transport.StatusBadRequest}
		return
	}
	if c.Cost > 0 && d.Allowed {
		o.markDirty(c.Partition)
	}
	setResult(res, &d)
}

// setResult writes decision d as an OK result into *res, in place (see
// decide), a field at a time: a composite literal is built on the stack
// and copied in 16-byte moves, which stall reading back the 8-byte
// stores that just wrote d.
func setResult(res *transport.Result, d *limiter.Decision) {
	res.Status, res.Allowed, res.Limit, res.Remaining = transport.StatusOK, d.Allowed, d.Limit, d.Remaining
	res.ResetAfter, res.RetryAfter, res.Delay = d.ResetAfter, d.RetryAfter, d.Delay
}

// checkCtx is what the checks of one batch share under one view: this
// member's position in the view's ring, and the rule looked up last. The
// checks of a frame mostly name one rule: a comparison with the name
// before (the same string, mostly) replaces a map lookup, and comparing
// the partition's owner position with ours replaces copying the owner
// out of the ring and comparing member ids, per check.
type checkCtx struct {
	v    *view.View
	self int32 // this member's position in v.Ring (ring.Ring.Index); -1 when not a member
	// behind: the sender decided under rules newer than v's, which this
	// member has still not applied after its wait (epochWait).
	behind bool

	name string // the rule looked up last ("" none), and its answer
	rule *limiter.Rule
	salt uint64
}

// use makes cx decide under v the checks of a sender that decided under
// rulesVersion.
func (cx *checkCtx) use(o *Owner, v *view.View, rulesVersion uint64) {
	*cx = checkCtx{v: v, self: v.Ring.Index(o.self), behind: rulesVersion > v.RulesVersion}
}

// resolve checks what a check's answer depends on besides its
// partition's state (ownership, partition, rule, cost) and returns its
// rule and its buckets' salt, or the status that refuses it.
func (o *Owner) resolve(cx *checkCtx, c *transport.Check) (*limiter.Rule, uint64, transport.Status) {
	v := cx.v
	if cx.self < 0 || v.Ring.OwnerIndex(c.Partition) != cx.self || int(c.Partition) >= len(o.moving) {
		return nil, 0, transport.StatusNotOwner
	}
	if v.Ring.Partition(c.KeyHash) != c.Partition {
		return nil, 0, transport.StatusBadRequest
	}
	var rule *limiter.Rule
	var salt uint64
	switch {
	case c.Inline.Algorithm != 0: // a rule of the sender's own (Envoy RLS)
		if rule = inlineRule(c); rule == nil {
			return nil, 0, transport.StatusBadRequest
		}
		salt = v.Salt(rule)
	case cx.behind:
		// A write the sender acknowledged has not reached this member
		// (its Raft log cannot grow: a full disk, until the leader
		// marks it dead): deciding under the rules it has would answer
		// a check sent to that node under the old set, which a write
		// in force where acknowledged forbids. The sender answers by
		// the rule's failure mode, degraded. Was: decided under the old
		// rules, not degraded (an audit: a member on a full disk
		// answered its keys under the old limit for 7 s).
		return nil, 0, transport.StatusUnavailable
	case cx.rule != nil && c.Rule == cx.name:
		rule, salt = cx.rule, cx.salt
	default:
		if rule, salt = o.ruleFor(v, c.Rule); rule == nil {
			return nil, 0, transport.StatusUnknownRule
		}
		cx.name, cx.rule, cx.salt = c.Rule, rule, salt
	}
	if c.Cost > uint64(rule.Capacity()) {
		return nil, 0, transport.StatusBadRequest
	}
	return rule, salt, transport.StatusOK
}

// groupBuf is the size of the stack buffers of decideGroup; larger
// groups allocate.
const groupBuf = 8

// decideGroup decides the joined checks cs all-or-nothing
// (limiter.Table.CheckGroup) into rs, or returns the status every one of
// them gets instead, spending nothing: the first refusal in check order
// (NOT_OWNER, BAD_REQUEST, UNKNOWN_RULE), else UNAVAILABLE when a
// partition's state has not arrived (or is fenced by the time the group
// is decided), else OVER_CAPACITY at the key cap.
func (o *Owner) decideGroup(cx *checkCtx, cs []transport.Check, rs []transport.Result, now int64) transport.Status {
	var ibuf [groupBuf]limiter.Item
	items := ibuf[:0]
	for i := range cs {
		c := &cs[i]
		rule, salt, st := o.resolve(cx, c)
		if st != transport.StatusOK {
			return st
		}
		items = append(items, limiter.Item{Part: c.Partition, Bucket: limiter.BucketHash(c.KeyHash, salt), Rule: rule, Cost: int64(c.Cost)})
	}
	for i := range items {
		if o.getState(items[i].Part) != partServing {
			return transport.StatusUnavailable
		}
	}
	if o.full.Load() {
		for i := range items {
			if it := &items[i]; it.Cost > 0 && !o.table.HoldsKey(it.Part, it.Bucket, it.Rule.Name) {
				o.overCapacity.Add(1)
				return transport.StatusOverCapacity
			}
		}
	}
	var dbuf [groupBuf]limiter.Decision
	ds := dbuf[:0]
	ds = slices.Grow(ds, len(items))[:len(items)]
	spent, err := o.table.CheckGroup(items, now, ds)
	switch {
	case err == limiter.ErrFenced: // moved out since the state was read
		return transport.StatusUnavailable
	case err != nil:
		return transport.StatusBadRequest // ErrGroup: one bucket twice
	}
	for i := range ds {
		setResult(&rs[i], &ds[i])
		if spent && items[i].Cost > 0 {
			o.markDirty(items[i].Part)
		}
	}
	return transport.StatusOK
}

// Sweep drops dead bucket states of partition p in both tables.
func (o *Owner) Sweep(p uint32) {
	now := o.now()
	o.table.Sweep(p, now)
	o.backup.Sweep(p, now)
}
