package limiter

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// MaxPartitions is the most partitions a Table may have.
const MaxPartitions = 1 << 20

// ErrPartition: a partition number outside [0, Partitions()).
var ErrPartition = errors.New("limiter: partition out of range")

// ErrFenced: the partition is fenced (see Table.Fence); nothing was
// decided or spent. Check and CheckGroup return it unwrapped, so callers
// on the hot path may compare with ==.
var ErrFenced = errors.New("limiter: partition fenced")

// Table holds the bucket states of many keys, in memory, for one node.
//
// A bucket is found by its 64-bit BucketHash; the key itself is never
// stored. The table is split into a fixed number of partitions, chosen by
// the caller (key hash mod partitions, see hash.go); a partition is the
// unit of locking and of hand-off between nodes (Export, Import, Drop).
// Each partition has three stores:
//
//   - TAT states (token_bucket, gcra, leaky_bucket): 16 bytes a slot;
//   - Window states (fixed_window, sliding_window): 24 bytes a slot;
//   - Logs (sliding_log): one *Log each, in a built-in map.
//
// A state that equals a fresh key's (a full bucket, an expired window, an
// empty log) is never stored and may be dropped at any time, so memory
// tracks the keys active now, not every key ever seen; there is no TTL to
// tune. Dropping is done by Check (the state it leaves), by Sweep, and by a
// store about to grow, which sweeps itself first.
//
// Times are nanoseconds on the caller's clock. A partition's clock never
// runs backwards: a state dropped because it was dead at now is
// forgotten, so a check at an earlier now than a call that may have
// dropped states (Check, CheckGroup, Sweep, Import) is decided at that
// call's now instead (the step functions alone clamp such a clock too,
// but cannot see a state that is gone).
//
// Rules change: each state remembers the rule set it was made under, and
// a check under a newer set carries it over first (SetRules and
// rulesets.go say what callers must do; convert.go what is carried).
//
// CheckGroup decides several checks at one instant all-or-nothing (a
// request limited by several rules spends on all of them or on none).
//
// A partition may be fenced (Fence, Unfence): it then decides no checks,
// while Export, Import, Drop and Sweep work as always. An owner fences a
// partition it is moving, so a check is either decided before the move
// (and its state is in the export) or refused; the fence is read under
// the partition's lock, so it costs a check nothing beyond that lock.
//
// Table is safe for concurrent use; calls on different partitions do not
// contend, and rule sets may be registered while checks run. Methods that
// take a partition number panic if it is out of range, except Check,
// CheckGroup and Import, which return an error wrapping ErrPartition.
type Table struct {
	parts []partition
	sets  atomic.Pointer[ruleSets] // replaced whole under regMu
	regMu sync.Mutex               // serialises changes of sets
	pass  sweepPass                // guarded by regMu: the sweeps' search for sets to release (rulesets.go)
	seed  uint64                   // guarded by regMu: the salts' seed (SetSeed), for ruleSet.alts
	recs  sync.Pool                // *[]exportRec: an export's scratch (codec.go)
}

type partition struct {
	mu    sync.Mutex
	tats  slots[TAT]      // guarded by mu
	wins  slots[Window]   // guarded by mu
	logs  map[uint64]*Log // guarded by mu; by slot key; never holds an empty log after Check
	spare *Log            // guarded by mu; an empty Log for the next fresh key

	changed    []uint64 // guarded by mu; slot keys written since ExportChanges (delta.go)
	changedAll bool     // guarded by mu; too many to list: export the whole partition
	track      bool     // set before use: checks note what they write (TrackChanges)
	fenced     bool     // guarded by mu; checks are refused with ErrFenced (Fence)

	// last is the latest now any call that may drop states ran at
	// (guarded by mu): checks run at no earlier instant (see clock).
	last int64
}

// clock returns the instant a call at now runs at on p, which is now or,
// if a call that may have dropped states (Check, CheckGroup, Sweep,
// Import) ran later than that, that call's now; the caller holds p.mu.
// Was: a check carrying a clock read before a Sweep at a later instant
// found the key the Sweep dropped as dead fresh, and was admitted a
// whole new budget the step functions (which clamp a clock run back)
// would have refused. A late call's Decision is thus relative to the
// later instant: its RetryAfter is at most that much early for its own
// clock.
func (p *partition) clock(now int64) int64 {
	if now < p.last {
		return p.last
	}
	p.last = now
	return now
}

// NewTable returns an empty table of the given number of partitions,
// 1 ≤ partitions ≤ MaxPartitions. An empty partition costs 128 bytes
// (neighbours share cache lines; padding to 128 could not be shown to help,
// BENCHMARKS.md §10 round eight).
func NewTable(partitions int) (*Table, error) {
	if partitions < 1 || partitions > MaxPartitions {
		return nil, fmt.Errorf("limiter: table of %d partitions, want 1 to %d", partitions, MaxPartitions)
	}
	t := &Table{parts: make([]partition, partitions)}
	t.sets.Store(newRuleSets())
	return t, nil
}

// Partitions returns the number of partitions.
func (t *Table) Partitions() int { return len(t.parts) }

func (t *Table) part(part uint32) *partition {
	if int64(part) >= int64(len(t.parts)) {
		panic(fmt.Sprintf("limiter: partition %d out of range [0, %d)", part, len(t.parts)))
	}
	return &t.parts[part]
}

func (t *Table) checkPart(part uint32) error {
	if int64(part) >= int64(len(t.parts)) {
		return fmt.Errorf("%w: %d, table has %d", ErrPartition, part, len(t.parts))
	}
	return nil
}

// Check decides a check of cost on the bucket (a BucketHash) of partition
// part under rule r at now, and keeps the bucket's new state, unless that
// is the state of a fresh key: a query or a denied check on a fresh key
// stores nothing. A cost of 0 spends nothing: it answers whether a cost-1
// check would pass.
//
// A bucket whose state was made under another rule set than r's
// (r.Version) is first carried over to r (see SetRules). Buckets are told
// apart by 56 bits of their hash (see slotKey).
//
// The rule must be valid (Rule.Validate); Check itself only rejects an
// unknown algorithm and a limit or period ≤ 0, wrapping ErrRule. A cost
// out of [0, r.Capacity()] returns an error wrapping ErrCost, a version
// never registered with SetRules one wrapping ErrVersion, a fenced
// partition ErrFenced itself; on any error nothing is spent.
func (t *Table) Check(part uint32, bucket uint64, r *Rule, now, cost int64) (Decision, error) {
	var d Decision
	err := t.CheckInto(part, bucket, r, now, cost, &d)
	return d, err
}

// CheckInto is Check writing its decision into *d (left unspecified on
// an error) instead of returning it: a Decision is too large to be
// returned in registers, and copying it back up costs a hot path
// several percent.
func (t *Table) CheckInto(part uint32, bucket uint64, r *Rule, now, cost int64, d *Decision) error {
	// checkItem, written out: one call less on the hot path.
	if err := t.checkPart(part); err != nil {
		return err
	}
	if err := r.CheckCost(cost); err != nil {
		return err
	}
	if r.Limit <= 0 || r.Period <= 0 { // what the steps divide by
		return fmt.Errorf("%w: %q has limit %d per %v", ErrRule, r.Name, r.Limit, r.Period)
	}
	p := &t.parts[part]
	// Unlocked without defer (it costs ~10% of a check): nothing between
	// Lock and Unlock can panic once Limit and Period are positive, which
	// is all the steps divide by.
	p.mu.Lock()
	if p.fenced {
		p.mu.Unlock()
		return ErrFenced
	}
	now = p.clock(now)
	g, set := setOf(&t.sets, r.Version)
	if set == nil {
		p.mu.Unlock()
		return versionError(r)
	}
	if now >= g.life[set.tag].writable { // never for the newest set
		if set, r = late(g, r); set == nil {
			p.mu.Unlock()
			return versionError(r)
		}
	}
	switch { // decideLocked's switch, one call less on the hot path
	case r.Algorithm.tat():
		p.tatLocked(g, set, bucket, r, now, cost, true, d)
	case r.Algorithm.window():
		p.windowLocked(g, set, bucket, r, now, cost, true, d)
	case r.Algorithm == SlidingLog:
		p.logLocked(g, set, bucket, r, now, cost, true, d)
	default:
		p.mu.Unlock()
		return fmt.Errorf("%w: %q has algorithm %v", ErrRule, r.Name, r.Algorithm)
	}
	p.mu.Unlock()
	return nil
}

// checkItem validates what Check and CheckGroup validate before locking.
func (t *Table) checkItem(part uint32, r *Rule, cost int64) error {
	if err := t.checkPart(part); err != nil {
		return err
	}
	if err := r.CheckCost(cost); err != nil {
		return err
	}
	if r.Limit <= 0 || r.Period <= 0 { // what the steps divide by
		return fmt.Errorf("%w: %q has limit %d per %v", ErrRule, r.Name, r.Limit, r.Period)
	}
	if !r.Algorithm.tat() && !r.Algorithm.window() && r.Algorithm != SlidingLog {
		return fmt.Errorf("%w: %q has algorithm %v", ErrRule, r.Name, r.Algorithm)
	}
	return nil
}

func versionError(r *Rule) error {
	return fmt.Errorf("%w: rule %q has version %d", ErrVersion, r.Name, r.Version)
}

// setOf returns the rule sets and the set of version v, or nil. Checks
// call it under their partition's lock (see freeTag).
func setOf(sets *atomic.Pointer[ruleSets], v uint64) (*ruleSets, *ruleSet) {
	g := sets.Load()
	if v == g.newestV {
		return g, g.newest
	}
	return g, g.lookup(v)
}

// late returns the set and rule a check under r decides with when r's
// set was superseded more than lateWrites ago (now at or past the set's
// writable, see tagLife): the caller is later than any view lags, and
// near the point where the set's states are dropped as soon as they are
// written. Decided
// under r, every such check would meet a fresh key and pass: 30 of 30
// against a capacity of 10, in the audit that found it. It is decided
// under the newest set's rule of r's name instead, which its states are
// kept under. With none of r's name and algorithm there, it returns a
// nil set and r: the check is refused (ErrVersion), as for a released
// set.
func late(g *ruleSets, r *Rule) (*ruleSet, *Rule) {
	nr, ok := g.newest.rules[r.Name]
	if !ok || nr.Algorithm != r.Algorithm {
		return nil, r
	}
	c := *nr
	c.Version = g.newestV
	return g.newest, &c
}

// altState returns the state a key of bucket had under the algorithms
// r's name had before in set's older sets (set.alts), looked up in the
// store of each one's kind and carried over to r (carryAny: across kinds
// too), and true; or, when there is none written under a later set than
// own (nil: any), a fresh state and false. buf is the Log to fill when r
// is a sliding_log. When it has one under several, the one written under
// the newest set is carried: a copy left behind is older than the state
// that was carried from it (a late check under an older set, or a
// backup's copy the owner removed, may leave one, even under r's own
// bucket: own is the set of the state found there). With commit it
// removes them all, so that none is met again, stale, once the rule goes
// back to its algorithm (and may move the entries of the stores); without,
// it changes none (a log it carries is copied first: Log.Convert works in
// place).
func (p *partition) altState(g *ruleSets, set *ruleSet, own *ruleSet, bucket uint64, r *Rule, now int64, commit bool, buf *Log) (anyState, bool) {
	var x anyState
	var from *ruleSet
	found := false
	for _, a := range set.alts[r.Name] {
		ka := slotKey(altBucket(bucket, a.delta))
		y := anyState{kind: a.kind}
		var tag uint8
		switch a.kind {
		case lifeTAT:
			e := p.tats.find(ka)
			if e == nil {
				continue
			}
			y.tat, tag = e.val, e.tag()
			if commit {
				p.tats.del(ka)
			}
		case lifeWindow:
			e := p.wins.find(ka)
			if e == nil {
				continue
			}
			y.win, tag = e.val, e.tag()
			if commit {
				p.wins.del(ka)
			}
		default:
			l, ok := p.logs[ka]
			if !ok {
				continue
			}
			y.log, tag = l, l.tag
			if commit {
				delete(p.logs, ka)
			}
		}
		f := g.byTag[tag]
		if own != nil && (f == nil || f.version <= own.version) {
			continue // older than the state under r's bucket
		}
		if !found || (f != nil && from != nil && f.version > from.version) {
			x, from, found = y, f, true
		}
	}
	if !found {
		return anyState{kind: lifeKind(r.Algorithm), log: buf}, false
	}
	if x.kind == lifeLog && !commit {
		x.log = x.log.clone()
	}
	if x.kind != lifeLog {
		x.log = buf
	}
	return carryAny(g, from, set, r, now, x), true
}

// carryOwn returns the state e holds, found under r's own bucket in st
// and made under set own, carried over to set: or, when a copy under
// set.alts was written under a later set than own, that copy carried
// (altState). It returns the key's entry too, which altState may move.
// A check meets it once per key after a rules change, never on a hit of
// its own set: apart from tatLocked and windowLocked, so that their hot
// path stays as it was.
func carryOwn[S slotValue](p *partition, st *slots[S], g *ruleSets, set, own *ruleSet, e *slot[S], bucket uint64, r *Rule, now int64, commit bool) (S, *slot[S]) {
	s := e.val
	if set.alts != nil {
		x, newer := p.altState(g, set, own, bucket, r, now, commit, nil)
		e = st.find(slotKey(bucket))
		if newer {
			return fromAny[S](x), e
		}
	}
	return carry(g, own, set, r, now, s), e
}

// decideLocked is the one core of Check and CheckGroup: it decides a
// check of cost on slot key k under r, whose set is set, at now, into
// *d. With
// commit it keeps the new state as Check documents; without, it only
// decides and stores nothing a decision depends on (a sliding log may
// still be carried over and expired in place, which changes no decision,
// and an empty one is dropped). p.mu must be held; the algorithm is
// known (checkItem).
func (p *partition) decideLocked(g *ruleSets, set *ruleSet, bucket uint64, r *Rule, now, cost int64, commit bool, d *Decision) {
	switch {
	case r.Algorithm.tat():
		p.tatLocked(g, set, bucket, r, now, cost, commit, d)
	case r.Algorithm.window():
		p.windowLocked(g, set, bucket, r, now, cost, commit, d)
	default:
		p.logLocked(g, set, bucket, r, now, cost, commit, d)
	}
}

func (p *partition) tatLocked(g *ruleSets, set *ruleSet, bucket uint64, r *Rule, now, cost int64, commit bool, d *Decision) {
	var s TAT
	k := slotKey(bucket)
	e := p.tats.find(k)
	if e != nil {
		s = e.val
		if tag := e.tag(); tag != set.tag {
			s, e = carryOwn(p, &p.tats, g, set, g.byTag[tag], e, bucket, r, now, commit)
		}
	} else if set.alts != nil {
		x, _ := p.altState(g, set, nil, bucket, r, now, commit, nil)
		s = x.tat
	}
	s = stepTAT(s, r, now, cost, d)
	switch {
	case !commit:
	case droppable(s, set.tag, now, g):
		if e != nil {
			p.tats.del(k)
		}
	case e != nil:
		if p.track && (e.val != s || e.tag() != set.tag) {
			p.noteChanged(k)
		}
		e.val, e.key = s, k|uint64(set.tag)
	default:
		p.tats.insert(k, set.tag, s, now, g)
		if p.track {
			p.noteChanged(k)
		}
	}
}

func (p *partition) windowLocked(g *ruleSets, set *ruleSet, bucket uint64, r *Rule, now, cost int64, commit bool, d *Decision) {
	var s Window
	k := slotKey(bucket)
	e := p.wins.find(k)
	if e != nil {
		s = e.val
		if tag := e.tag(); tag != set.tag {
			s, e = carryOwn(p, &p.wins, g, set, g.byTag[tag], e, bucket, r, now, commit)
		}
	} else if set.alts != nil {
		x, _ := p.altState(g, set, nil, bucket, r, now, commit, nil)
		s = x.win
	}
	s, *d = StepWindow(s, r, now, cost)
	switch {
	case !commit:
	case droppable(s, set.tag, now, g):
		if e != nil {
			p.wins.del(k)
		}
	case e != nil:
		if p.track && (e.val != s || e.tag() != set.tag) {
			p.noteChanged(k)
		}
		e.val, e.key = s, k|uint64(set.tag)
	default:
		p.wins.insert(k, set.tag, s, now, g)
		if p.track {
			p.noteChanged(k)
		}
	}
}

func (p *partition) logLocked(g *ruleSets, set *ruleSet, bucket uint64, r *Rule, now, cost int64, commit bool, d *Decision) {
	k := slotKey(bucket)
	l, ok := p.logs[k]
	alt := false // l holds a state found under another bucket (altState)
	switch {
	case !ok:
		l = p.spare
		if l == nil {
			l = new(Log)
		}
		if set.alts != nil {
			if x, found := p.altState(g, set, nil, bucket, r, now, commit, l); found {
				if alt = x.log == l && l.n > 0; !alt {
					l.reset() // left behind, or nothing live
				}
			}
		}
	case l.tag != set.tag:
		p.carryLog(g, set, l, bucket, r, now, commit)
	}
	if p.track && (cost > 0 || alt || (ok && l.tag != set.tag)) {
		p.noteChanged(k) // a spend that is denied writes nothing, but noting it is harmless
	}
	l.tag = set.tag
	*d = l.decide(r, now, cost)
	if commit && d.Allowed && cost > 0 {
		*d = l.admit(r, now, cost, *d)
	}
	switch {
	case l.n == 0 || (alt && !commit):
		// Without commit, what altState found stays where it is.
		if ok {
			delete(p.logs, k)
		}
		l.reset()
		p.spare = l // empty again: exps is nil or at most 8 slots
	case !ok:
		if p.logs == nil {
			p.logs = make(map[uint64]*Log)
		}
		p.logs[k] = l
		p.spare = nil
	}
}

// carryLog carries l, found under r's own bucket and made under another
// set than set, over to set in place (or the copy under set.alts written
// under a later set, as carryOwn does): a check meets it once per key
// after a rules change.
func (p *partition) carryLog(g *ruleSets, set *ruleSet, l *Log, bucket uint64, r *Rule, now int64, commit bool) {
	own, newer := g.byTag[l.tag], false
	var x anyState
	if set.alts != nil {
		x, newer = p.altState(g, set, own, bucket, r, now, commit, l)
	}
	if !newer {
		x.log = carry(g, own, set, r, now, l)
	}
	if x.log == nil {
		// Left behind (its rule removed in a set in between): a fresh
		// key, as for the other states. Was: carry's nil was dropped and
		// the log kept as it was, so a sliding_log rule removed and
		// added back kept denying.
		l.reset()
	}
}

// droppableLog is droppable for a log: it may write (see Log.Dead).
func droppableLog(l *Log, now int64, g *ruleSets) bool {
	tl := &g.life[l.tag]
	return now >= tl.dropAt[lifeLog] || l.Dead(min(now, tl.until))
}

// Sweep drops every state of the partition that is dead at now and
// returns how many it dropped. Decisions do not change: a dead state
// decides like a fresh key.
//
// Sweeping every partition also releases the rule sets that no state
// carries any more (see releaseSwept in rulesets.go): a set's rules are
// held only as long as states made under them may matter.
func (t *Table) Sweep(part uint32, now int64) (dropped int) {
	p := t.part(part)
	t.regMu.Lock() // before p.mu, as SetRules and Import take them
	defer t.regMu.Unlock()
	g := t.sets.Load()
	visit := t.pass.visit(g, part, now, len(t.parts))
	p.mu.Lock()
	if visit {
		now = max(now, t.pass.at) // see sweepPass
	}
	now = p.clock(now)
	dropped = p.sweepLocked(now, g)
	if len(p.logs) == 0 {
		p.logs = nil // a map never shrinks; let it go
	}
	p.spare = nil
	if visit {
		p.tags(&t.pass.used) // what the sweep left is live
	}
	p.mu.Unlock()
	if visit {
		t.pass.left--
		if t.pass.left == 0 {
			t.releaseSwept(g)
		}
	}
	return dropped
}

// Len returns the number of states held in all partitions.
func (t *Table) Len() int {
	n := 0
	for i := range t.parts {
		n += t.parts[i].len()
	}
	return n
}

// Holds reports whether the table holds a state for bucket in partition
// part (of any algorithm). An owner at its key cap uses it to tell a key
// it already tracks from a new one.
func (t *Table) Holds(part uint32, bucket uint64) bool { return t.HoldsKey(part, bucket, "") }

// HoldsKey is Holds for a key of the rule named rule: its state may also
// lie under the buckets of the algorithms the rule had before (the
// newest set's alts), until a check carries it over. Was: Holds alone,
// so at the key cap, after a rule's algorithm changed, every key of the
// rule looked new and was refused, and so never carried over.
func (t *Table) HoldsKey(part uint32, bucket uint64, rule string) bool {
	if t.checkPart(part) != nil {
		return false
	}
	p := &t.parts[part]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holds(slotKey(bucket)) {
		return true
	}
	if rule == "" {
		return false
	}
	for _, a := range t.sets.Load().newest.alts[rule] {
		if p.holds(slotKey(altBucket(bucket, a.delta))) {
			return true
		}
	}
	return false
}

// holds reports whether any store of p has a state under slot key k.
// p.mu must be held.
func (p *partition) holds(k uint64) bool {
	_, inLogs := p.logs[k]
	return p.tats.index(k) >= 0 || p.wins.index(k) >= 0 || inLogs
}

// PartitionLen returns the number of states held in partition part.
func (t *Table) PartitionLen(part uint32) int { return t.part(part).len() }

func (p *partition) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tats.len() + p.wins.len() + len(p.logs)
}

// Fence makes partition part refuse checks (Check and CheckGroup return
// ErrFenced) until Unfence. Once Fence returns, every check of the
// partition that was decided is in its states: nothing decided before
// the fence is missed by an Export after it, and nothing is decided
// after it. Fencing a fenced partition does nothing.
func (t *Table) Fence(part uint32) { t.setFenced(part, true) }

// Unfence lets partition part decide checks again (see Fence).
func (t *Table) Unfence(part uint32) { t.setFenced(part, false) }

// Fenced reports whether partition part is fenced.
func (t *Table) Fenced(part uint32) bool {
	p := t.part(part)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fenced
}

func (t *Table) setFenced(part uint32, on bool) {
	p := t.part(part)
	p.mu.Lock()
	p.fenced = on
	p.mu.Unlock()
}

// Drop forgets every state of partition part and frees its memory, as
// after handing the partition off to another node.
func (t *Table) Drop(part uint32) {
	p := t.part(part)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tats.reset()
	p.wins.reset()
	p.logs, p.spare = nil, nil
	p.changed, p.changedAll = nil, false
}
