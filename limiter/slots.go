package limiter

import "math/bits"

// slots is the open-addressing hash map behind the TAT and Window stores:
// slot key → (tag, state), with linear probing and no tombstones.
//
//   - A slot's key word holds the bucket's slot key (slotKey: 56 bits of
//     the bucket hash, in the high bits) and, in its low byte, the tag of
//     the rule set the state was made under (see rulesets.go). Tags are
//     never 0, so key word 0 marks an empty slot and every bucket hash,
//     0 included, fits in the array. The tag costs no memory: a slot is
//     still 16 bytes for a TAT.
//   - Bucket hashes are already well mixed (BucketHash), so the home slot
//     is "fastrange" on the high bits, ⌊key × capacity / 2⁶⁴⌋: any
//     capacity works, and it can grow by 25% instead of doubling.
//   - Deletion shifts the rest of the cluster back (backward-shift
//     deletion), so a probe stops at the first empty slot, always.
//   - The load stays at most maxLoad; before growing, the map drops its
//     dead states (often enough to make room), and it shrinks when the
//     load falls under minLoad. A slot of (key, TAT) is 16 bytes, so at a
//     load between 0.68 and 0.85 an active token bucket costs 19 to 23.5
//     bytes.
//
// Entries are (key, value) pairs in one array rather than parallel key and
// value arrays: a hit then costs one cache miss, not two.
//
// slots is not safe for concurrent use; its partition's mutex guards it.
type slots[V slotValue] struct {
	ents []slot[V] // len is the capacity; key 0 marks an empty slot
	n    int       // entries in ents
}

type slot[V slotValue] struct {
	key uint64 // slotKey | tag; 0 when empty
	val V
}

// tagMask is the low byte of a slot's key word, which holds the tag.
const tagMask = 0xff

// slotKey maps a bucket hash to the key the stores use: the hash xor its
// low byte times an odd constant, with the low byte cleared for the tag.
// Two bucket hashes share a slot key only when they agree on those 56
// bits: for BucketHash values (uniform), a 2⁻⁵⁶ chance per pair; two
// hashes that differ only in their low byte, never. A hash whose low byte
// is 0 is its own slot key.
func slotKey(h uint64) uint64 { return (h ^ uint64(uint8(h))*0x9e3779b97f4a7c15) &^ tagMask }

func (e *slot[V]) tag() uint8 { return uint8(e.key) }

// slotValue is what the map needs of a value: whether it is the same as a
// fresh key at now, so that it may be dropped.
type slotValue interface {
	TAT | Window
	idle(now int64) bool
	lifeKind() int
}

// droppable reports whether a state of tag tag may be dropped at now,
// given the rule sets g (see tagLife).
func droppable[V slotValue](v V, tag uint8, now int64, g *ruleSets) bool {
	l := &g.life[tag]
	return now >= l.dropAt[v.lifeKind()] || v.idle(min(now, l.until))
}

func (TAT) lifeKind() int    { return lifeTAT }
func (Window) lifeKind() int { return lifeWindow }

// idle reports whether the TAT is a full bucket at now.
func (s TAT) idle(now int64) bool { return s.Dead(now) }

// idle reports whether the window state is the same as a fresh key at
// now: expired, or holding no count (a fixed window answers a query on a
// fresh key with a state that has a DeadAt but a zero count).
func (s Window) idle(now int64) bool { return s.Counts == 0 || s.Dead(now) }

// Load bounds, checked in integers: grow when an insert would take the
// load over 0.85, unless a sweep brings it under 0.765, and grow to 0.68;
// shrink under 0.25, to 0.70. A map that holds anything has at least
// minSlots slots.
const minSlots = 8

// overMax reports whether n entries are too many for c slots (> 0.85).
func overMax(n, c int) bool { return n*20 > c*17 }

// afterSweep reports whether n entries left after a sweep still call for
// growth (> 0.765): a sweep that frees less than ~10% of the slots is not
// worth repeating on the next insert.
func afterSweep(n, c int) bool { return n*200 > c*153 }

// underMin reports whether n entries are few enough in c slots to shrink
// (< 0.25).
func underMin(n, c int) bool { return c > minSlots && n*4 < c }

// sizeFor is the capacity that holds n entries at a load of about 0.70.
func sizeFor(n int) int { return max(minSlots, n*10/7+1) }

// len is the number of states held.
func (s *slots[V]) len() int { return s.n }

// home is the slot where the probe for key word k starts; the tag does
// not move it.
func (s *slots[V]) home(k uint64) int {
	hi, _ := bits.Mul64(k&^tagMask, uint64(len(s.ents)))
	return int(hi)
}

// find returns the slot of slot key k (low byte 0), or nil. The pointer
// is valid until the next insert, del, sweep or resize; the caller may
// change the slot's value and tag, not its slot key.
func (s *slots[V]) find(k uint64) *slot[V] {
	if i := s.index(k); i >= 0 {
		return &s.ents[i]
	}
	return nil
}

// index returns the index of slot key k in ents, or -1.
func (s *slots[V]) index(k uint64) int {
	ents := s.ents
	if len(ents) == 0 {
		return -1
	}
	for i := s.home(k); ; {
		key := ents[i].key
		if key == 0 {
			return -1
		}
		if key&^tagMask == k {
			return i
		}
		if i++; i == len(ents) {
			i = 0
		}
	}
}

// insert adds slot key k (low byte 0), which must be absent, with a tag
// ≥ 1. When the map is full it first drops the states that g allows to
// drop at now, then grows if that was not enough.
func (s *slots[V]) insert(k uint64, tag uint8, v V, now int64, g *ruleSets) {
	if overMax(s.n+1, len(s.ents)) {
		s.makeRoom(1, now, g)
	}
	s.place(k|uint64(tag), v)
	s.n++
}

// makeRoom makes space for k more entries at most maxLoad.
func (s *slots[V]) makeRoom(k int, now int64, g *ruleSets) {
	if len(s.ents) == 0 {
		s.resize(sizeFor(k))
		return
	}
	s.sweepEnts(now, g)
	if !afterSweep(s.n+k, len(s.ents)) {
		return
	}
	// Grow to a load of 0.68: ×1.25 from a full map, less when the sweep
	// made some room, so the load never falls under 0.68 by growing.
	s.resize(max(len(s.ents)+1, (s.n+k)*25/17+1))
}

// place puts key word k in the first empty slot of its probe sequence.
func (s *slots[V]) place(k uint64, v V) {
	ents := s.ents
	i := s.home(k)
	for ents[i].key != 0 {
		if i++; i == len(ents) {
			i = 0
		}
	}
	ents[i] = slot[V]{k, v}
}

// del removes slot key k (low byte 0) and reports whether it was there.
// It may shrink the map.
func (s *slots[V]) del(k uint64) bool {
	i := s.index(k)
	if i < 0 {
		return false
	}
	s.deleteAt(i)
	if underMin(s.n, len(s.ents)) {
		s.resize(sizeFor(s.n))
	}
	return true
}

// deleteAt empties slot i and shifts back the entries after it that
// probed past it, so that no probe ever crosses an empty slot in vain.
func (s *slots[V]) deleteAt(i int) {
	ents := s.ents
	c := len(ents)
	for j := i; ; {
		if j++; j == c {
			j = 0
		}
		k := ents[j].key
		if k == 0 {
			break
		}
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j]: then it would land before its home.
		if h := s.home(k); (j-h+c)%c >= (j-i+c)%c {
			ents[i] = ents[j]
			i = j
		}
	}
	ents[i] = slot[V]{}
	s.n--
}

// sweep drops every state g allows to drop at now, shrinks the map if it
// got sparse, and returns how many it dropped.
func (s *slots[V]) sweep(now int64, g *ruleSets) int {
	dropped := s.sweepEnts(now, g)
	switch {
	case s.n == 0:
		s.ents = nil
	case underMin(s.n, len(s.ents)):
		s.resize(sizeFor(s.n))
	}
	return dropped
}

// sweepEnts drops the idle states of ents and returns how many it
// dropped. It first counts them. A few go one by one, in place: deleteAt
// only pulls entries back into the hole it fills, never past the slot
// being looked at, so an entry that moves is looked at again where it
// lands (or it was looked at already, and is live). When many are idle —
// the usual case for short-lived states, whose map fills with dead ones
// between sweeps — each deleteAt would walk a long cluster, so the live
// entries are set aside and placed again in the cleared array instead:
// one pass over the array, not one walk per dead entry.
func (s *slots[V]) sweepEnts(now int64, g *ruleSets) int {
	if s.n == 0 {
		return 0
	}
	ents := s.ents
	dead := 0
	for i := range ents {
		if ents[i].key != 0 && droppable(ents[i].val, ents[i].tag(), now, g) {
			dead++
		}
	}
	switch {
	case dead == 0:
		return 0
	case dead*rebuildAbove < s.n:
		dropped := 0
		for i := range ents {
			for ents[i].key != 0 && droppable(ents[i].val, ents[i].tag(), now, g) {
				s.deleteAt(i)
				dropped++
			}
		}
		return dropped
	}
	live := make([]slot[V], 0, s.n-dead)
	for _, e := range ents {
		if e.key != 0 && !droppable(e.val, e.tag(), now, g) {
			live = append(live, e)
		}
	}
	clear(ents)
	for _, e := range live {
		s.place(e.key, e.val)
	}
	dropped := s.n - len(live)
	s.n = len(live)
	return dropped
}

// rebuildAbove: sweepEnts rebuilds the map when more than 1/rebuildAbove
// of its entries are idle.
const rebuildAbove = 8

// resize moves the entries to c slots.
func (s *slots[V]) resize(c int) {
	old := s.ents
	s.ents = make([]slot[V], c)
	for _, e := range old {
		if e.key != 0 {
			s.place(e.key, e.val)
		}
	}
}

// reset forgets every entry and frees the memory.
func (s *slots[V]) reset() { *s = slots[V]{} }

// all calls f for every entry: its slot key (low byte 0), tag and state.
func (s *slots[V]) all(f func(k uint64, tag uint8, v V)) {
	for _, e := range s.ents {
		if e.key != 0 {
			f(e.key&^tagMask, e.tag(), e.val)
		}
	}
}

// tags marks in used the tag of every entry.
func (s *slots[V]) tags(used *[maxTags]bool) {
	for i := range s.ents {
		if e := &s.ents[i]; e.key != 0 {
			used[e.tag()] = true
		}
	}
}

// retag calls f for every entry's tag and stores what it returns.
func (s *slots[V]) retag(f func(tag uint8) uint8) {
	for i := range s.ents {
		if e := &s.ents[i]; e.key != 0 {
			e.key = e.key&^tagMask | uint64(f(e.tag()))
		}
	}
}
