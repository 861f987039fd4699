package limiter

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Rule sets, versions and tags.
//
// A Table keeps, besides its states, the rule sets they were made under.
// The caller registers each rule set it checks with (Table.SetRules) under
// a version, and every Rule it passes to Check carries that version
// (Rule.Version). Every stored state carries a one-byte tag naming the set
// it was last changed under; the tag lives in bits the stores had spare
// (the low byte of a slot's key word, a byte of padding in Log), so it
// costs no memory.
//
// When Check finds a state whose tag names another set than the rule's,
// it carries the state over (convert.go) through every registered set in
// between, in version order, each at the instant that set came into force
// on this table (the now of its SetRules): exactly as if every state had
// been converted the moment its rule changed. Sets whose rules are all
// equal to the previous set's share its tag, so rewriting the same rules
// converts nothing and uses no tag.
//
// Version 0 is the unversioned set: the rules of callers that never call
// SetRules (their states are never converted, as before versions
// existed), and the states of streams from before versions (format 1).
// Such a state, met under a versioned rule, is adopted: kept, but capped
// to what the new rule can answer (AdoptTAT, AdoptWindow, Log.Adopt).
// The unversioned set is never superseded: its states live by their own
// times, whatever sets are registered after it (the node checks the
// inline rules of Envoy descriptors, which no set holds, as unversioned).
//
// A state may be dropped when it is the same as a fresh key. For a state
// of the newest set, that is when it is dead at now. For one of an older
// set it is when it was dead at the moment the next set came into force
// (it then converts to a fresh key), or once it is dead under the sets
// that followed, followed through its conversions (tagLife.dropAt,
// deadBy), since a converted state lives no longer than that. The bound is per
// kind of state (a bucket's TAT, a window's counters, a log: lifeKind):
// a state converts to a rule of its own kind, or to one of another kind
// only where a rule's algorithm changed kind (ruleSet.reach; the state is
// found by altState), so a set holding a fixed window of a day does not
// keep the 5s logs of its other rules for three days after each change.
//
// A check under an older set than the newest (a caller that has not seen
// the newer one yet) is decided under it, and its state kept under its
// tag, for lateWrites after the next set came into force (tagLife.
// writable); later, the check is decided under the newest set's rule of
// its name instead (late), or refused with ErrVersion when that set has
// none of its algorithm. dropAt allows for those late writes: a state
// written lateWrites after the change lives as long past it.
//
// A superseded set is released, with its tag, once no state carries it:
// found by the sweeps (Sweep, sweepPass), so memory follows the live
// keys, not the rules writes. There are 254 tags for versioned sets.
// Registering a set when all are taken first frees the tags that no live state carries (a scan of the
// table, which drops the states of the tags it frees); if none is free, the states of the oldest
// quarter of the sets are adopted instead of converted (they are
// retagged as unversioned), so that the next writes find tags free.

// ErrVersion: a check under a rule whose Version was never registered
// with SetRules (or whose set was released: see SetRules).
var ErrVersion = errors.New("limiter: rule set version not registered")

const (
	// adoptShare: when every tag is live, registering a set adopts
	// the oldest 1/adoptShare of the versioned sets (see freeTag).
	adoptShare = 4
	// legacyTag names the unversioned set, version 0.
	legacyTag = 1
	// maxTags bounds the tags; 0 is never a tag (it marks empty slots).
	maxTags = 256
)

// ruleSet is one registered set of rules, immutable once published.
type ruleSet struct {
	version uint64           // the first version with these rules
	tag     uint8            // what its states carry
	since   int64            // when it came into force on this table
	rules   map[string]*Rule // by name, Version cleared; nil for version 0
	names   []string         // rules' keys, sorted: a stream lists them in this order (set wherever rules is)
	// life is, per kind of state, the longest a state of these rules
	// lives (0: no rule of that kind).
	life [lifeKinds]int64
	// others are, by rule name, the other algorithms (a bit per
	// Algorithm) that a rule of its name had in the sets before this
	// one, back to the last set without it; alts are the salt deltas
	// (altBucket) of those algorithms, and the kind of state each keeps:
	// a key with no state under its rule's bucket is looked up under
	// them (altState). Both nil when no rule changed algorithm; alts nil
	// too when the table has no seed.
	others map[string]uint8
	alts   map[string][]altSalt
	// reach is, per kind of state, the other kinds (a bit per kind) that
	// a state of it made under an earlier set may become under this one:
	// the kinds of the rules whose others hold an algorithm of it. deadBy
	// follows a state's life into them.
	reach [lifeKinds]uint8
}

// altSalt is one entry of ruleSet.alts: the salt delta of an algorithm
// the rule had before, and the kind of state (store) it keeps.
type altSalt struct {
	delta uint64
	kind  int
}

// The kinds of state, by what holds them: a rate algorithm's TAT, a
// window algorithm's counters, a sliding log.
const (
	lifeTAT = iota
	lifeWindow
	lifeLog
	lifeKinds
)

// lifeKind is the kind of the states of algorithm a.
func lifeKind(a Algorithm) int {
	switch {
	case a.tat():
		return lifeTAT
	case a.window():
		return lifeWindow
	}
	return lifeLog
}

// tagLife is what checking and dropping a state need to know of its
// tag: until, when the set after the tag's came into force; writable,
// until when a check under the tag's set is decided under it (late);
// and dropAt, per kind of state, when a state of it may be dropped
// whatever it holds. All MaxInt64 for the newest set.
type tagLife struct {
	until, writable int64
	dropAt          [lifeKinds]int64
}

// forever is the tagLife of a set no later set follows.
var forever = tagLife{math.MaxInt64, math.MaxInt64, [lifeKinds]int64{math.MaxInt64, math.MaxInt64, math.MaxInt64}}

// lateWrites is how long after the next set came into force a check
// under a set is still decided under it (see late): longer than a
// caller's view of the rules lags (a member's, by a Raft commit; a Ring
// client's, by its refresh period, 1s by default).
const lateWrites = int64(10 * time.Second)

// ruleSets is an immutable snapshot of a table's sets; a change publishes
// a new one (Table.sets).
type ruleSets struct {
	sets     []*ruleSet // ascending versions; sets[0] is version 0
	versions []uint64   // every registered version, ascending
	setOf    []*ruleSet // the set of each of versions
	newestV  uint64     // versions[len-1]: the fast path of Check
	newest   *ruleSet   // setOf[len-1]
	byTag    [maxTags]*ruleSet
	pos      [maxTags]int // index of the tag's set in sets
	// life says, per tag, until when the tag's set was in force and when
	// a state of it may be dropped whatever it holds (see the comment at
	// the top); one cache line serves a check.
	life [maxTags]tagLife
}

func newRuleSets() *ruleSets {
	legacy := &ruleSet{tag: legacyTag, since: math.MinInt64}
	g := &ruleSets{sets: []*ruleSet{legacy}, versions: []uint64{0}, setOf: []*ruleSet{legacy}}
	g.index()
	return g
}

// index fills the derived fields from sets, versions and setOf.
func (g *ruleSets) index() {
	g.newestV, g.newest = g.versions[len(g.versions)-1], g.setOf[len(g.setOf)-1]
	g.byTag = [maxTags]*ruleSet{}
	for i := range maxTags {
		g.life[i] = forever
	}
	for i := len(g.sets) - 1; i >= 0; i-- {
		s := g.sets[i]
		g.byTag[s.tag], g.pos[s.tag] = s, i
		// The unversioned set is never followed: its rules (a caller's
		// that never registers sets, the inline rules of Envoy
		// descriptors) are checked as they are, never converted, so its
		// states live by their own times. Ended at the first versioned
		// set, every inline state was dropped as soon as it was written
		// once the newest set had been in force for its longest life.
		if i < len(g.sets)-1 && s.tag != legacyTag {
			until := g.sets[i+1].since
			l := tagLife{until: until, writable: satAdd(until, lateWrites)}
			for k := range l.dropAt {
				l.dropAt[k] = g.deadBy(i, k, l.writable)
			}
			g.life[s.tag] = l
		}
	}
}

// deadBy bounds when a state of kind k of set i, written at writable at
// the latest, is dead: converted to set i+1 it lives at most that set's
// longest life of kind k past its writing; alive when a later set came
// into force, it is converted to it there and lives at most that set's
// life past that; dead before, it converts to a fresh key and later
// sets do not matter. Was: the latest of every later set's since + life,
// so with rules written every few seconds the newest set's since kept
// every state of every older set alive (a re-verification: 1.4M keys
// and 160 MB with a PUT every 8 s, against 0.5M without). A set where
// a rule's algorithm changed kind may make the state one of another
// kind (reach): from there on the lives of those kinds bound it too.
func (g *ruleSets) deadBy(i, k int, writable int64) int64 {
	kinds := g.sets[i+1].reachOf(1 << k)
	b := satAdd(writable, g.sets[i+1].lifeOf(kinds))
	for _, s := range g.sets[i+2:] {
		if b <= s.since {
			continue // dead before it (since grows with versions, but an import may register an old one late)
		}
		kinds = s.reachOf(kinds)
		b = max(b, satAdd(s.since, s.lifeOf(kinds)))
	}
	return b
}

// reachOf returns the kinds (a bit each) a state of one of kinds may be
// under s (see reach).
func (s *ruleSet) reachOf(kinds uint8) uint8 {
	out := kinds
	for k := range lifeKinds {
		if kinds&(1<<k) != 0 {
			out |= s.reach[k]
		}
	}
	return out
}

// lifeOf is the longest life of s's rules of the kinds (a bit each).
func (s *ruleSet) lifeOf(kinds uint8) int64 {
	l := int64(0)
	for k := range lifeKinds {
		if kinds&(1<<k) != 0 {
			l = max(l, s.life[k])
		}
	}
	return l
}

// lookup returns the set of version v, or nil.
func (g *ruleSets) lookup(v uint64) *ruleSet {
	if v == g.newestV {
		return g.newest
	}
	if i, ok := slices.BinarySearch(g.versions, v); ok {
		return g.setOf[i]
	}
	return nil
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// lifeOf bounds how long after its last change a state of rule r can
// matter: the tolerance of a rate rule, three periods of a window (a
// sliding window's DeadAt is up to three periods after the start of its
// current window), one of a log.
func lifeOf(r *Rule) int64 {
	switch {
	case r.Algorithm.tat():
		return r.Capacity() * r.interval()
	case r.Algorithm.window():
		return 3 * int64(r.Period)
	}
	return int64(r.Period)
}

// sameRule reports whether two rules decide alike.
func sameRule(a, b *Rule) bool {
	return a.Algorithm == b.Algorithm && a.Limit == b.Limit && a.Period == b.Period && a.Capacity() == b.Capacity()
}

func sameRules(a, b map[string]*Rule) bool {
	return maps.EqualFunc(a, b, sameRule)
}

// SetRules registers the rule set of version version, which came into
// force at now (nanoseconds on the table's clock), so that Check accepts
// rules carrying Version == version and carries states made under other
// sets over to it (see the comment at the top of rulesets.go).
//
// What a caller must do: register each set before it checks with it —
// ringlimit calls SetRules with the Raft index of the rules write and
// the whole effective set when a node's view changes, before publishing
// the view —, pass rules whose Version is that index and whose other
// fields are the registered ones, and register versions in increasing
// order (a version older than the newest is accepted, as on import, but
// comes into force at now). Registering a version again changes nothing.
// Each rule must be valid (Rule.Validate); names must be unique.
//
// Versions are released with their tag when no state carries it (see
// the comment at the top); checking under a released version returns
// ErrVersion. It returns an error when version is 0, a rule is invalid,
// or a name repeats; the table then changes nothing.
func (t *Table) SetRules(version uint64, rules []Rule, now int64) error {
	if version == 0 {
		return fmt.Errorf("limiter: SetRules: version 0 is the unversioned set")
	}
	m := make(map[string]*Rule, len(rules))
	for i := range rules {
		r := rules[i]
		if err := r.Validate(); err != nil {
			return fmt.Errorf("limiter: SetRules version %d: %w", version, err)
		}
		if _, dup := m[r.Name]; dup {
			return fmt.Errorf("limiter: SetRules version %d: rule %q twice", version, r.Name)
		}
		r.Version = 0
		m[r.Name] = &r
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	t.register(version, m, now, true, nil)
	return nil
}

// register adds version with rules m, in force since since, unless it is
// known, and returns its set. With alias, a version whose rules are those
// of the version before it shares its set. A set whose tag is in pinned
// (nil: none) is not released to make room (an import pins the sets it
// registered a moment before, which no state carries yet); when every
// tag is live or pinned, register returns nil and registers nothing.
// t.regMu must be held.
func (t *Table) register(version uint64, m map[string]*Rule, since int64, alias bool, pinned *[maxTags]bool) *ruleSet {
	g := t.sets.Load()
	if s := g.lookup(version); s != nil {
		return s
	}
	i, _ := slices.BinarySearch(g.versions, version)
	if prev := g.setOf[i-1]; alias && prev.version != 0 && sameRules(prev.rules, m) {
		// The same rules again: an alias, nothing converts.
		n := g.clone()
		n.versions = slices.Insert(n.versions, i, version)
		n.setOf = slices.Insert(n.setOf, i, prev)
		n.index()
		t.sets.Store(n)
		return prev
	}
	tag, g, ok := t.freeTag(g, since, pinned)
	if !ok {
		return nil
	}
	i, _ = slices.BinarySearch(g.versions, version) // freeTag may release versions
	s := &ruleSet{version: version, tag: tag, since: since, rules: m, names: slices.Sorted(maps.Keys(m))}
	for _, r := range m {
		k := lifeKind(r.Algorithm)
		s.life[k] = max(s.life[k], lifeOf(r))
	}
	s.others, s.alts, s.reach = t.othersOf(g.setOf[i-1], m)
	n := g.clone()
	n.versions = slices.Insert(n.versions, i, version)
	n.setOf = slices.Insert(n.setOf, i, s)
	j, _ := slices.BinarySearchFunc(n.sets, version, func(s *ruleSet, v uint64) int {
		return cmpU64(s.version, v)
	})
	n.sets = slices.Insert(n.sets, j, s)
	t.rederive(n, i+1)
	n.index()
	t.sets.Store(n)
	return s
}

// rederive recomputes others, alts and reach of the sets of n.setOf from
// index from on, each from the set before it, and puts a copy in the
// place of each that changes (a published set never changes; a check
// holding the old one decides as it would have a moment before). For a
// set registered after the sets it precedes, as an import registers the
// set of the states it brings: a member that started with the newest
// set alone and then took over the partitions of a crashed one did not
// look under the buckets of the algorithms the imported sets had, and
// their keys started afresh. O(rules) per later set, on that path only.
// t.regMu must be held.
func (t *Table) rederive(n *ruleSets, from int) {
	for j := from; j < len(n.setOf); j++ {
		cur, prev := n.setOf[j], n.setOf[j-1]
		if cur == prev {
			continue // an alias
		}
		others, alts, reach := t.othersOf(prev, cur.rules)
		if reach == cur.reach && maps.Equal(others, cur.others) && maps.EqualFunc(alts, cur.alts, slices.Equal) {
			continue
		}
		c := *cur
		c.others, c.alts, c.reach = others, alts, reach
		for k, x := range n.setOf {
			if x == cur {
				n.setOf[k] = &c
			}
		}
		if k := slices.Index(n.sets, cur); k >= 0 {
			n.sets[k] = &c
		}
	}
}

// SetSeed gives the table the seed of its buckets' salts (RuleSalt):
// with it, a rule whose algorithm changes keeps its keys' states,
// converted (convertAny: within a kind as a change of its limit does,
// across kinds as the admissions they imply); without it such keys start
// afresh. Sets registered before keep what they had.
func (t *Table) SetSeed(seed uint64) {
	t.regMu.Lock()
	t.seed = seed
	t.regMu.Unlock()
}

// othersOf returns ruleSet.others, alts and reach for the rules m of a
// set registered after prev, from prev's: O(len(m)) map lookups. An
// algorithm of a set since released stays in others (a lookup on a
// miss finds nothing there). t.regMu must be held.
func (t *Table) othersOf(prev *ruleSet, m map[string]*Rule) (others map[string]uint8, alts map[string][]altSalt, reach [lifeKinds]uint8) {
	if prev == nil || prev.rules == nil {
		return nil, nil, reach
	}
	for name, r := range m {
		p, ok := prev.rules[name]
		if !ok {
			continue // new, or back after a set without it: afresh
		}
		mask := (prev.others[name] | 1<<p.Algorithm) &^ (1 << r.Algorithm)
		if mask == 0 {
			continue
		}
		if others == nil {
			others = make(map[string]uint8)
		}
		others[name] = mask
		k := lifeKind(r.Algorithm)
		for a := Algorithm(1); a < 8; a++ {
			if ka := lifeKind(a); mask&(1<<a) != 0 && ka != k {
				reach[ka] |= 1 << k
			}
		}
		if t.seed == 0 {
			continue
		}
		if alts == nil {
			alts = make(map[string][]altSalt)
		}
		salt := RuleSalt(t.seed, name, r.Algorithm)
		for a := Algorithm(1); a < 8; a++ {
			if mask&(1<<a) != 0 {
				alts[name] = append(alts[name], altSalt{salt ^ RuleSalt(t.seed, name, a), lifeKind(a)})
			}
		}
	}
	return others, alts, reach
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (g *ruleSets) clone() *ruleSets {
	n := *g
	n.sets = slices.Clone(g.sets)
	n.versions = slices.Clone(g.versions)
	n.setOf = slices.Clone(g.setOf)
	return &n
}

// freeTag returns a tag no set holds, and the sets then current: it
// releases the sets no live state refers to (dropping those states,
// which are all the same as fresh keys at now), and if that frees
// nothing, adopts the states of the oldest versioned sets (a quarter of
// them, adoptShare) as unversioned. Sets
// whose tag is in pinned are kept, and never adopted; ok is false when
// no tag could be freed. t.regMu must be held.
//
// It first frees among the settled sets — superseded lateWrites or more
// before now, so that a check under one is decided under the newest set
// (late) and never writes its tag again — visiting the partitions one
// at a time, each under its own lock, so checks wait for one
// partition's scan at most. Only when no set is settled (sets written
// faster than that) does it hold every partition's lock from its scan
// until the new sets are published; Check reads the sets under its
// partition's lock, so no check can then store the tag of a set
// released under it.
func (t *Table) freeTag(g *ruleSets, now int64, pinned *[maxTags]bool) (tag uint8, _ *ruleSets, ok bool) {
	if tag, ok := g.unusedTag(); ok {
		return tag, g, true
	}
	var pins [maxTags]bool
	if pinned != nil {
		pins = *pinned
	}
	// Versioned, not the newest, not pinned: what may be freed.
	freeable := func(i int, s *ruleSet) bool { return s.version != 0 && i < len(g.sets)-1 && !pins[s.tag] }
	n := t.free(g, now, func(i int, s *ruleSet) bool { return freeable(i, s) && g.life[s.tag].writable <= now }, false)
	if n == nil {
		for i := range t.parts {
			t.parts[i].mu.Lock()
		}
		defer func() {
			for i := range t.parts {
				t.parts[i].mu.Unlock()
			}
		}()
		if n = t.free(g, now, freeable, true); n == nil {
			return 0, g, false
		}
	}
	tag, _ = n.unusedTag()
	return tag, n, true
}

// free releases the sets that candidate accepts (by their place in
// g.sets) and no live state refers to, dropping those states; if there
// are none, it adopts the states of the oldest share of the candidates
// as unversioned (oldestShare). It publishes and returns the new sets,
// or returns nil when candidate accepts no set. With held, the caller
// holds every partition's lock; without, free takes each in turn and
// moves its clock to now.
//
// Why one partition at a time is enough for settled candidates: after
// free, the tags of the sets it releases or adopts must be carried by
// no state. Checks write only the tag of their rule's set while it is
// writable, else the newest's; each partition's clock is moved to now
// as it is visited, so its later checks find every settled set past its
// writable. Imports, the only other writers of tags, hold t.regMu, as
// free's caller does. A settled set's live states stay live and its
// dead ones dead (its life's bounds are fixed times), so a scan of each
// partition in turn sees what one scan of all would.
func (t *Table) free(g *ruleSets, now int64, candidate func(i int, s *ruleSet) bool, held bool) *ruleSets {
	var cand [maxTags]bool
	found := false
	for i, s := range g.sets {
		if candidate(i, s) {
			cand[s.tag], found = true, true
		}
	}
	if !found {
		return nil
	}
	visit := func(f func(p *partition)) {
		for i := range t.parts {
			p := &t.parts[i]
			if !held {
				p.mu.Lock()
			}
			f(p)
			if !held {
				p.mu.Unlock()
			}
		}
	}
	var used [maxTags]bool
	visit(func(p *partition) {
		if !held {
			p.last = max(p.last, now)
		}
		p.usedTags(g, now, &used)
	})
	var gone [maxTags]bool
	released := false
	for tag := range cand {
		if cand[tag] && !used[tag] {
			gone[tag], released = true, true
		}
	}
	if released {
		// A released tag's states are droppable at now, but left in
		// place they would carry the tag into the set it is given to
		// next and be read as that set's states: a key spent under an
		// old hour-long rule denied for an hour under the new rules.
		// Was: left in place.
		visit(func(p *partition) { p.sweepLocked(now, g) })
	} else {
		// Every candidate is live: the oldest of them lose their rule
		// and are adopted from now on. A share of the sets at once, not
		// one: with one set adopted a write, a scan of the whole table
		// came at every rules write once the tags ran out (with every
		// partition locked, before settled sets were freed apart: 39 ms
		// a write at 1M states, BenchmarkSetRulesAllTagsTaken); now once
		// in adoptShare's worth of writes.
		gone, _ = oldestShare(g.sets, func(s *ruleSet) bool { return cand[s.tag] })
		visit(func(p *partition) { p.retag(&gone, legacyTag) })
	}
	n := g.without(slices.DeleteFunc(slices.Clone(g.sets), func(s *ruleSet) bool { return gone[s.tag] }))
	t.sets.Store(n)
	return n
}

// without returns g holding the sets keep alone (a subsequence of
// g.sets), and the versions of those sets.
func (g *ruleSets) without(keep []*ruleSet) *ruleSets {
	n := g.clone()
	n.sets = keep
	vs, ss := n.versions[:0], n.setOf[:0]
	for k, s := range g.setOf {
		if slices.Contains(keep, s) {
			vs, ss = append(vs, g.versions[k]), append(ss, s)
		}
	}
	n.versions, n.setOf = vs, ss
	n.index()
	return n
}

// oldestShare marks the tags of the oldest 1/adoptShare (at least one)
// of the sets (in version order) that eligible accepts, and returns how
// many it marked.
func oldestShare(sets []*ruleSet, eligible func(*ruleSet) bool) (tags [maxTags]bool, n int) {
	want := 0
	for _, s := range sets {
		if eligible(s) {
			want++
		}
	}
	want = max(1, want/adoptShare)
	for _, s := range sets {
		if n < want && eligible(s) {
			tags[s.tag], n = true, n+1
		}
	}
	return tags, n
}

func (g *ruleSets) unusedTag() (uint8, bool) {
	for tag := legacyTag + 1; tag < maxTags; tag++ {
		if g.byTag[tag] == nil {
			return uint8(tag), true
		}
	}
	return 0, false
}

// usedTags marks in used the tags of the partition's states it may not
// drop at now. p.mu must be held.
func (p *partition) usedTags(g *ruleSets, now int64, used *[maxTags]bool) {
	p.tats.all(func(_ uint64, tag uint8, v TAT) {
		if !droppable(v, tag, now, g) {
			used[tag] = true
		}
	})
	p.wins.all(func(_ uint64, tag uint8, v Window) {
		if !droppable(v, tag, now, g) {
			used[tag] = true
		}
	})
	for _, l := range p.logs {
		used[l.tag] = true
	}
}

// retag gives every state of the partition whose tag is in from the tag
// to. p.mu must be held.
func (p *partition) retag(from *[maxTags]bool, to uint8) {
	f := func(tag uint8) uint8 {
		if from[tag] {
			return to
		}
		return tag
	}
	p.tats.retag(f)
	p.wins.retag(f)
	for _, l := range p.logs {
		l.tag = f(l.tag)
	}
}

// sweepLocked drops every state of the partition that g allows to drop
// at now and returns how many it dropped. p.mu must be held.
func (p *partition) sweepLocked(now int64, g *ruleSets) (dropped int) {
	dropped = p.tats.sweep(now, g) + p.wins.sweep(now, g)
	for h, l := range p.logs {
		if droppableLog(l, now, g) {
			delete(p.logs, h)
			dropped++
		}
	}
	return dropped
}

// sweepPass is a round of Sweeps that looks for the rule sets no state
// carries any more, so that their rules are let go without waiting for
// the tags to run out (freeTag): a set of 5,000 rules holds ~0.8 MB,
// and with no key live a member held every set written since its start,
// up to 254 (~200 MB; an audit writing 100 sets saw 80 MB a member).
//
// A round starts at a Sweep that finds settled sets besides the newest
// (superseded lateWrites or more before its now, at): its candidates.
// Each partition's first Sweep of the round runs at at or later, and
// notes the tags of the states it leaves, all live (used); Import notes
// the tags it writes. Once every partition has been swept, the
// candidates still settled whose tag nobody noted are released. That is
// free's scan spread over the sweeps, and safe for the same reasons:
// after its sweep a partition's checks run at at or later, past every
// candidate's writable, so they write the newest set's tag (late); the
// other writers of tags hold t.regMu, as Sweep does; and a settled set's
// live states stay live and its dead ones dead. A released tag's states
// are gone already: each sweep dropped the dead ones.
//
// It costs a sweep a walk over the tags of what it keeps, during rounds
// only: there are none while no old set is held.
type sweepPass struct {
	cands []*ruleSet // the round's candidates; nil: no round under way
	at    int64      // when the round started
	seen  []uint64   // bit per partition: swept in this round
	left  int        // partitions not swept yet in this round
	used  [maxTags]bool
}

// visit reports whether the Sweep of part at now is the partition's
// first of a round, starting a round when none is under way and g holds
// candidates. t.regMu must be held.
func (r *sweepPass) visit(g *ruleSets, part uint32, now int64, parts int) bool {
	if r.cands == nil {
		for i, s := range g.sets[:len(g.sets)-1] {
			if i > 0 && g.life[s.tag].writable <= now {
				r.cands = append(r.cands, s)
			}
		}
		if r.cands == nil {
			return false
		}
		r.at, r.left, r.used = now, parts, [maxTags]bool{}
		if r.seen == nil {
			r.seen = make([]uint64, (parts+63)/64)
		} else {
			clear(r.seen)
		}
	}
	w, b := part/64, uint64(1)<<(part%64)
	if r.seen[w]&b != 0 {
		return false
	}
	r.seen[w] |= b
	return true
}

// note marks tags as carried by states (an import's). t.regMu must be
// held.
func (r *sweepPass) note(tags []uint8) {
	if r.cands != nil {
		for _, tag := range tags {
			r.used[tag] = true
		}
	}
}

// releaseSwept ends the round: it releases the candidates that are
// still held and settled and whose tag no swept state carries. g is
// the current sets; t.regMu must be held.
func (t *Table) releaseSwept(g *ruleSets) {
	r := &t.pass
	gone := make(map[*ruleSet]bool, len(r.cands))
	for _, c := range r.cands {
		// Still settled: an import may register a set in between,
		// which moves the end of c's writes (rare, and then c waits).
		if i := slices.Index(g.sets, c); i > 0 && i < len(g.sets)-1 && g.life[c.tag].writable <= r.at && !r.used[c.tag] {
			gone[c] = true
		}
	}
	r.cands = nil
	if len(gone) > 0 {
		t.sets.Store(g.without(slices.DeleteFunc(slices.Clone(g.sets), func(s *ruleSet) bool { return gone[s] })))
	}
}

// tags marks in used the tags of every state of the partition. p.mu
// must be held.
func (p *partition) tags(used *[maxTags]bool) {
	p.tats.tags(used)
	p.wins.tags(used)
	for _, l := range p.logs {
		used[l.tag] = true
	}
}

// RuleVersions returns the rule set versions the table holds, ascending,
// 0 (unversioned) first: what it can check with and convert from.
func (t *Table) RuleVersions() []uint64 {
	return slices.Clone(t.sets.Load().versions)
}

// carry brings a state of S's store made under set from over to set to
// for the rule r (of to) at now, through the sets in between (carryAny):
// a rule missing from a set in between means the key's state was left
// behind, and it starts fresh; where the rule's algorithm changes kind
// the state is converted to it and back. (A state reaches a rule of
// another algorithm under another bucket only by altState.)
func carry[S any](g *ruleSets, from, to *ruleSet, r *Rule, now int64, s S) S {
	return fromAny[S](carryAny(g, from, to, r, now, toAny(s)))
}

// carryAny is carry for a state of any kind, whose kind changes where
// the rule's does (convertAny). The state it returns is of r's kind: one
// that ends of another (a set from that holds it under r's own rule, as
// a late write may leave) is adopted.
func carryAny(g *ruleSets, from, to *ruleSet, r *Rule, now int64, x anyState) anyState {
	k := lifeKind(r.Algorithm)
	fresh := anyState{kind: k}
	switch {
	case from == nil || from.version == 0:
		return adoptAny(x, r, now)
	case from.version > to.version: // see carry
		old, ok := from.rules[r.Name]
		if !ok {
			return fresh
		}
		if x.kind == k && sameRule(old, r) {
			return x
		}
		return convertAny(x, old, r, now)
	}
	prev := from
	for _, next := range g.sets[g.pos[from.tag]+1 : g.pos[to.tag]+1] {
		old, ok := prev.rules[r.Name]
		nr, ok2 := next.rules[r.Name]
		if next == to {
			nr, ok2 = r, true
		}
		switch {
		case !ok:
			x = adoptAny(x, nr, min(next.since, now))
		case !ok2:
			return fresh
		case x.kind != lifeKind(old.Algorithm) || !sameRule(old, nr):
			x = convertAny(x, old, nr, min(next.since, now))
		}
		prev = next
	}
	if x.kind != k {
		return adoptAny(x, r, now)
	}
	return x
}

// toAny wraps a state of a store as anyState.
func toAny[S any](s S) anyState {
	switch v := any(s).(type) {
	case TAT:
		return anyState{kind: lifeTAT, tat: v}
	case Window:
		return anyState{kind: lifeWindow, win: v}
	case *Log:
		return anyState{kind: lifeLog, log: v}
	}
	panic("limiter: toAny of an unknown state") // unreachable: S is one of the three
}

// fromAny unwraps anyState as the state of S's store (a fresh one when x
// is of another kind).
func fromAny[S any](x anyState) S {
	var s S
	switch p := any(&s).(type) {
	case *TAT:
		if x.kind == lifeTAT {
			*p = x.tat
		}
	case *Window:
		if x.kind == lifeWindow {
			*p = x.win
		}
	case **Log:
		if x.kind == lifeLog {
			*p = x.log
		}
	}
	return s
}
