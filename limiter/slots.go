package limiter

import "math/bits"

// slots is the open-addressing hash map behind the TAT and Window stores:
// bucket hash → state, with linear probing and no tombstones.
//
//   - Keys are bucket hashes, already well mixed (BucketHash), so the home
//     slot is "fastrange" on the high bits, ⌊hash × capacity / 2⁶⁴⌋: any
//     capacity works, and it can grow by 25% instead of doubling.
//   - Hash 0 marks an empty slot; a real key 0 lives on the side
//     (hasZero, zero).
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
	ents    []slot[V] // len is the capacity; key 0 marks an empty slot
	n       int       // entries in ents, without the zero key
	hasZero bool
	zero    V // the state of key 0, when hasZero
}

type slot[V slotValue] struct {
	key uint64
	val V
}

// slotValue is what the map needs of a value: whether it is the same as a
// fresh key at now, so that it may be dropped.
type slotValue interface {
	TAT | Window
	idle(now int64) bool
}

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
func (s *slots[V]) len() int {
	if s.hasZero {
		return s.n + 1
	}
	return s.n
}

// home is the slot where the probe for h starts.
func (s *slots[V]) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(s.ents)))
	return int(hi)
}

// get returns a pointer to the state of h, or nil. The pointer is valid
// until the next insert, del, sweep or resize.
func (s *slots[V]) get(h uint64) *V {
	if h == 0 {
		if s.hasZero {
			return &s.zero
		}
		return nil
	}
	ents := s.ents
	if len(ents) == 0 {
		return nil
	}
	for i := s.home(h); ; {
		e := &ents[i]
		if e.key == h {
			return &e.val
		}
		if e.key == 0 {
			return nil
		}
		if i++; i == len(ents) {
			i = 0
		}
	}
}

// insert adds h, which must be absent. When the map is full it first drops
// the states that are idle at now, then grows if that was not enough.
func (s *slots[V]) insert(h uint64, v V, now int64) {
	if h == 0 {
		s.hasZero, s.zero = true, v
		return
	}
	if overMax(s.n+1, len(s.ents)) {
		s.makeRoom(1, now)
	}
	s.place(h, v)
	s.n++
}

// makeRoom makes space for k more entries at most maxLoad.
func (s *slots[V]) makeRoom(k int, now int64) {
	if len(s.ents) == 0 {
		s.resize(sizeFor(k))
		return
	}
	s.sweepEnts(now)
	if !afterSweep(s.n+k, len(s.ents)) {
		return
	}
	// Grow to a load of 0.68: ×1.25 from a full map, less when the sweep
	// made some room, so the load never falls under 0.68 by growing.
	s.resize(max(len(s.ents)+1, (s.n+k)*25/17+1))
}

// place puts h in the first empty slot of its probe sequence.
func (s *slots[V]) place(h uint64, v V) {
	ents := s.ents
	i := s.home(h)
	for ents[i].key != 0 {
		if i++; i == len(ents) {
			i = 0
		}
	}
	ents[i] = slot[V]{h, v}
}

// del removes h and reports whether it was there. It may shrink the map.
func (s *slots[V]) del(h uint64) bool {
	if h == 0 {
		if !s.hasZero {
			return false
		}
		var zero V
		s.hasZero, s.zero = false, zero
		return true
	}
	ents := s.ents
	if len(ents) == 0 {
		return false
	}
	i := s.home(h)
	for ents[i].key != h {
		if ents[i].key == 0 {
			return false
		}
		if i++; i == len(ents) {
			i = 0
		}
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

// sweep drops every state idle at now, shrinks the map if it got sparse,
// and returns how many it dropped.
func (s *slots[V]) sweep(now int64) int {
	dropped := 0
	if s.hasZero && s.zero.idle(now) {
		s.del(0)
		dropped++
	}
	dropped += s.sweepEnts(now)
	switch {
	case s.n == 0:
		s.ents = nil
	case underMin(s.n, len(s.ents)):
		s.resize(sizeFor(s.n))
	}
	return dropped
}

// sweepEnts drops the idle states of ents in place, in one pass: deleteAt
// only pulls entries back into the hole it fills, never past the slot
// being looked at, so an entry that moves is looked at again where it
// lands (or it was looked at already, and is live).
func (s *slots[V]) sweepEnts(now int64) int {
	if s.n == 0 {
		return 0
	}
	dropped := 0
	ents := s.ents
	for i := range ents {
		for ents[i].key != 0 && ents[i].val.idle(now) {
			s.deleteAt(i)
			dropped++
		}
	}
	return dropped
}

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

// all calls f for every entry, the zero key included.
func (s *slots[V]) all(f func(h uint64, v V)) {
	if s.hasZero {
		f(0, s.zero)
	}
	for _, e := range s.ents {
		if e.key != 0 {
			f(e.key, e.val)
		}
	}
}
