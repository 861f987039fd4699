package node

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
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
// partition at any moment. Each partition has a gate: checks hold it
// shared, moving a partition in or out holds it alone, so no decision is
// lost between an export and the drop that follows it.
//
// An Owner is safe for concurrent use.
type Owner struct {
	self   string
	now    func() int64 // bucket clock, Unix ns
	log    *slog.Logger
	cell   view.Cell
	table  *limiter.Table // partitions we own (or are handing off)
	backup *limiter.Table // copies of the partitions we back up

	gates []sync.RWMutex // per partition: shared by checks, exclusive for moves
	state []atomic.Uint32
	dirty []atomic.Bool // changed since the last backup push
	whole []atomic.Bool // the next backup push sends the whole partition (see markWhole)
	based []atomic.Bool // backup copies: a whole copy arrived, so deltas may follow

	mu      sync.Mutex    // guards changed
	changed chan struct{} // closed when a partition becomes servable

	// leaseUntil is the monotonic instant (ns since start) until which this
	// member may answer: refreshed while Raft hears from a quorum. 0 = no
	// lease needed (a single member, or tests).
	leaseUntil atomic.Int64
	leaseOn    atomic.Bool
	start      time.Time

	awaiting atomic.Int64 // partitions in partAwaiting

	rules atomic.Pointer[versionedRules] // the view's rules, each carrying its set's version

	maxKeys      int         // the most bucket states tracked; 0 = no cap
	full         atomic.Bool // the table holds maxKeys states or more (refreshed by the sweep)
	overCapacity atomic.Int64
}

// SetMaxKeys caps the bucket states this owner tracks (0: no cap). At the
// cap a check of a key it already tracks is decided as always; a check of
// a new key is answered OVER_CAPACITY, which the router answers by the
// rule's failure mode (degraded), and counted. Idle states are dropped
// by the sweep, so the cap frees up as keys go quiet.
func (o *Owner) SetMaxKeys(n int) { o.maxKeys = n }

// RefreshFull recomputes whether the table is at its key cap.
func (o *Owner) RefreshFull() {
	o.full.Store(o.maxKeys > 0 && o.table.Len() >= o.maxKeys)
}

// OverCapacity is how many checks of new keys were refused at the cap.
func (o *Owner) OverCapacity() int64 { return o.overCapacity.Load() }

// versionedRules are a view's rules with Version set, as the table needs
// them to carry states over a rule change (limiter.Table.SetRules).
type versionedRules struct {
	version uint64
	byName  map[string]*limiter.Rule
	older   *versionedRules // the set before, for checks still deciding under the previous view
}

// ruleFor returns the rule the table decides name with under view v.
func (o *Owner) ruleFor(v *view.View, name string) *limiter.Rule {
	if rs := o.rules.Load(); rs != nil {
		if rs.version == v.RulesVersion {
			return rs.byName[name]
		}
		if rs.older != nil && rs.older.version == v.RulesVersion {
			return rs.older.byName[name]
		}
	}
	return v.Rules[name] // unversioned (no rules written yet)
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
	if err := o.table.SetRules(next.RulesVersion, next.List, o.now()); err != nil {
		o.log.Error("registering the rule set; its keys start fresh", "version", next.RulesVersion, "err", err)
		return
	}
	rs := &versionedRules{version: next.RulesVersion, byName: make(map[string]*limiter.Rule, len(next.List))}
	if prev := o.rules.Load(); prev != nil {
		rs.older = &versionedRules{version: prev.version, byName: prev.byName}
	}
	for i := range next.List {
		r := next.List[i]
		r.Version = next.RulesVersion
		rs.byName[r.Name] = &r
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
	return &Owner{self: self, now: now, log: log, table: t, backup: b,
		gates: make([]sync.RWMutex, partitions), state: make([]atomic.Uint32, partitions),
		dirty: make([]atomic.Bool, partitions), whole: make([]atomic.Bool, partitions), based: make([]atomic.Bool, partitions),
		changed: make(chan struct{}), start: time.Now()}, nil
}

// Partitions is the table's partition count.
func (o *Owner) Partitions() int { return len(o.gates) }

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

func (o *Owner) leased() bool {
	return !o.leaseOn.Load() || int64(time.Since(o.start)) < o.leaseUntil.Load()
}

func (o *Owner) getState(p uint32) partState { return partState(o.state[p].Load()) }

func (o *Owner) setState(p uint32, s partState) {
	old := partState(o.state[p].Swap(uint32(s)))
	if old == partAwaiting && s != partAwaiting {
		o.awaiting.Add(-1)
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
	if !o.leased() && !o.awaitLease(ctx) {
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
	for i := range req.Checks {
		c := &req.Checks[i]
		res := o.decide(v, c, now)
		for res.Status == transport.StatusUnavailable && !gaveUp {
			// The partition's state is on its way (hand-off), or it is
			// moving out right now (its new view is being published):
			// wait for either.
			ch, vch := o.servable(), o.cell.Changed()
			if nv := o.cell.Load(); nv.Epoch() > v.Epoch() { // published before we subscribed
				v = nv
				resp.Epoch = v.Epoch()
			}
			if res = o.decide(v, c, now); res.Status != transport.StatusUnavailable {
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
			if !gaveUp {
				if nv := o.cell.Load(); nv.Epoch() > v.Epoch() {
					v = nv
					resp.Epoch = v.Epoch()
				}
				now = o.now()
				res = o.decide(v, c, now)
			}
		}
		resp.Results[i] = res
	}
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

// decide decides one check under view v, or says why not.
func (o *Owner) decide(v *view.View, c *transport.Check, now int64) transport.Result {
	owner, ok := v.Ring.Owner(c.Partition)
	if !ok || owner.ID != o.self || int(c.Partition) >= len(o.gates) {
		return transport.Result{Status: transport.StatusNotOwner}
	}
	if v.Ring.Partition(c.KeyHash) != c.Partition {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	rule := o.ruleFor(v, c.Rule)
	if c.Inline.Algorithm != 0 { // a rule of the sender's own (Envoy RLS)
		if rule = inlineRule(c); rule == nil {
			return transport.Result{Status: transport.StatusBadRequest}
		}
	}
	if rule == nil {
		return transport.Result{Status: transport.StatusUnknownRule}
	}
	if c.Cost > uint64(rule.Capacity()) {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	g := &o.gates[c.Partition]
	g.RLock()
	defer g.RUnlock()
	switch o.getState(c.Partition) {
	case partServing:
	case partAwaiting:
		return transport.Result{Status: transport.StatusUnavailable}
	default:
		// Our view says we own it but the move in has not been applied:
		// SetView is running right now.
		return transport.Result{Status: transport.StatusUnavailable}
	}
	bucket := limiter.BucketHash(c.KeyHash, v.Salt(rule))
	if o.full.Load() && c.Cost > 0 && !o.table.Holds(c.Partition, bucket) {
		o.overCapacity.Add(1)
		return transport.Result{Status: transport.StatusOverCapacity}
	}
	d, err := o.table.Check(c.Partition, bucket, rule, now, int64(c.Cost))
	if err != nil {
		return transport.Result{Status: transport.StatusBadRequest}
	}
	if c.Cost > 0 && d.Allowed {
		o.dirty[c.Partition].Store(true)
	}
	return transport.Result{Status: transport.StatusOK, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter, Delay: d.Delay}
}

// Sweep drops dead bucket states of partition p in both tables.
func (o *Owner) Sweep(p uint32) {
	now := o.now()
	o.table.Sweep(p, now)
	o.backup.Sweep(p, now)
}
