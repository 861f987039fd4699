package limiter

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var allAlgorithms = []Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog}

// tablePeriods all divide five hours, so that windows aligned on one
// clock stay aligned on a clock five hours ahead (see the import tests).
var tablePeriods = []time.Duration{
	time.Millisecond, 250 * time.Millisecond, time.Second, 5 * time.Second, time.Minute, time.Hour,
}

// drawTableRule draws a valid rule of algorithm a with small limits, so
// that checks land on both sides of them.
func drawTableRule(t *rapid.T, a Algorithm) *Rule {
	r := Rule{
		Name:      "r-" + a.String(),
		Algorithm: a,
		Limit:     rapid.Int64Range(1, 12).Draw(t, "limit"),
		Period:    rapid.SampledFrom(tablePeriods).Draw(t, "period"),
	}
	if a.tat() {
		r.Burst = rapid.Int64Range(0, 15).Draw(t, "burst")
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("drawn rule %+v: %v", r, err)
	}
	return &r
}

// drawHash draws bucket hashes that stress the map: 0, hashes whose home
// slots pile up at the start or wrap around the end of the array (a low
// byte of 0 keeps them their own slot key), and plain random ones.
func drawHash(t *rapid.T, label string) uint64 {
	return rapid.OneOf(
		rapid.Just(uint64(0)),
		rapid.Map(rapid.Uint64Range(1, 1<<48), func(x uint64) uint64 { return x << 8 }),                       // homes at slot 0
		rapid.Map(rapid.Uint64Range(0, 1<<48), func(x uint64) uint64 { return (math.MaxUint64>>8 - x) << 8 }), // homes at the last slot
		rapid.Uint64(),
	).Draw(t, label)
}

// kindOf is the store an algorithm's state lives in.
func kindOf(a Algorithm) byte {
	switch {
	case a.tat():
		return kindTAT
	case a.window():
		return kindWindow
	}
	return kindLog
}

// oracleKey is a bucket as the table's stores see it.
type oracleKey struct {
	kind byte
	h    uint64
}

// oracle keeps every state in a built-in map, never drops one, and calls
// the step functions directly: the table must decide exactly like it.
type oracle struct {
	tats map[uint64]TAT
	wins map[uint64]Window
	logs map[uint64]*Log
}

func newOracle() *oracle {
	return &oracle{tats: map[uint64]TAT{}, wins: map[uint64]Window{}, logs: map[uint64]*Log{}}
}

func (o *oracle) check(h uint64, r *Rule, now, cost int64) Decision {
	var d Decision
	switch {
	case r.Algorithm.tat():
		o.tats[h], d = StepTAT(o.tats[h], r, now, cost)
	case r.Algorithm.window():
		o.wins[h], d = StepWindow(o.wins[h], r, now, cost)
	default:
		l := o.logs[h]
		if l == nil {
			l = new(Log)
			o.logs[h] = l
		}
		d = l.Step(r, now, cost)
	}
	return d
}

// live counts the states that are not the same as a fresh key at now.
func (o *oracle) live(now int64) int {
	n := 0
	for _, s := range o.tats {
		if !s.idle(now) {
			n++
		}
	}
	for _, s := range o.wins {
		if !s.idle(now) {
			n++
		}
	}
	for _, l := range o.logs {
		if !l.Dead(now) {
			n++
		}
	}
	return n
}

// tableKey is one client bucket: its hash, partition and rule.
type tableKey struct {
	h    uint64
	part uint32
	r    *Rule
}

// keyPicker picks the bucket of each check: half the time the next one
// in turn, so that every bucket gets used and the stores grow, and half
// the time any one (rapid favours the first few, which then see many
// checks).
type keyPicker struct {
	keys []tableKey
	next int
}

func (p *keyPicker) draw(t *rapid.T) tableKey {
	if rapid.Bool().Draw(t, "next key?") {
		p.next = (p.next + 1) % len(p.keys)
		return p.keys[p.next]
	}
	return rapid.SampledFrom(p.keys).Draw(t, "key")
}

// drawKeys draws maxKeys/2 to maxKeys buckets of distinct (kind, hash),
// under one rule drawn per algorithm.
func drawKeys(t *rapid.T, parts int, algos []Algorithm, maxKeys int) *keyPicker {
	rules := make([]*Rule, len(algos))
	for i, a := range algos {
		rules[i] = drawTableRule(t, a)
	}
	n := rapid.IntRange(max(maxKeys/2, 1), maxKeys).Draw(t, "keys")
	seen := map[oracleKey]bool{}
	var keys []tableKey
	for range n {
		h := drawHash(t, "hash")
		r := rapid.SampledFrom(rules).Draw(t, "rule")
		k := oracleKey{kindOf(r.Algorithm), h}
		if seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, tableKey{h: h, part: uint32(h % uint64(parts)), r: r})
	}
	return &keyPicker{keys: keys}
}

// drawGap draws how far the clock moves before the next call: mostly a
// little, so that states pile up and the stores grow, and now and then a
// lot, so that they die and the stores shrink.
func drawGap(t *rapid.T) int64 {
	return rapid.SampledFrom(gaps).Draw(t, "gap")
}

// gaps holds one long gap for every 1500 short ones or so; the long ones
// come last, as rapid favours the first elements.
var gaps = func() []int64 {
	var g []int64
	for i := range 6000 {
		g = append(g, []int64{0, 0, 1, 1000, int64(time.Millisecond), int64(7 * time.Millisecond)}[i%6])
	}
	return append(g, int64(time.Second), int64(10*time.Second), int64(5*time.Minute), int64(2*time.Hour))
}()

// drawSize draws a size of one of three magnitudes, so that the small
// sizes rapid prefers do not hide the growth of the stores.
func drawSize(t *rapid.T, label string, small, medium, large int) int {
	return rapid.SampledFrom([]int{small, medium, large}).Draw(t, label)
}

// failer is what the helpers need of a *testing.T, *testing.B or *rapid.T.
type failer interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
}

// testSets are the rule sets of a table that never had versions: every
// state is unversioned and dropped when it is dead.
var testSets = newRuleSets()

// get returns the state of bucket hash h, or nil.
func (s *slots[V]) get(h uint64) *V {
	if e := s.find(slotKey(h)); e != nil {
		return &e.val
	}
	return nil
}

func mustTable(t failer, parts int) *Table {
	t.Helper()
	tb, err := NewTable(parts)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// checkInvariants checks the map structure of every store: each entry is
// reachable from its home without crossing an empty slot, the counts are
// right, the load is at most 0.85.
func checkInvariants(t failer, tb *Table) {
	t.Helper()
	for i := range tb.parts {
		p := &tb.parts[i]
		p.mu.Lock()
		err := errors.Join(p.tats.check(), p.wins.check())
		for h, l := range p.logs {
			if l.n == 0 {
				err = errors.Join(err, fmt.Errorf("empty log stored under %#x", h))
			}
		}
		p.mu.Unlock()
		if err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
	}
}

func (s *slots[V]) check() error {
	c, n := len(s.ents), 0
	for i, e := range s.ents {
		if e.key == 0 {
			continue
		}
		n++
		for j := s.home(e.key); j != i; j = (j + 1) % c {
			if s.ents[j].key == 0 {
				return fmt.Errorf("key %#x at slot %d of %d: empty slot %d on its probe path", e.key, i, c, j)
			}
		}
		if e.tag() == 0 {
			return fmt.Errorf("key word %#x at slot %d has no tag", e.key, i)
		}
		if got := s.find(e.key &^ tagMask); got != &s.ents[i] {
			return fmt.Errorf("get(%#x) does not find slot %d", e.key, i)
		}
	}
	switch {
	case n != s.n:
		return fmt.Errorf("%d entries, n = %d", n, s.n)
	case c > 0 && overMax(n, c):
		return fmt.Errorf("%d entries in %d slots: load over 0.85", n, c)
	case c == 0 && n != 0:
		return fmt.Errorf("n = %d without slots", n)
	}
	return nil
}

// Random checks through a Table decide exactly like the step functions on
// a map that never forgets, with sweeps, growth and shrinking on the way.
func TestTableMatchesSteps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := rapid.IntRange(1, 3).Draw(t, "partitions")
		tb := mustTable(t, parts)
		o := newOracle()
		keys := drawKeys(t, parts, allAlgorithms, drawSize(t, "max keys", 10, 100, 1500))
		now := rapid.Int64Range(0, 1<<60).Draw(t, "start")
		for i := range drawSize(t, "ops", 50, 500, 5000) {
			now += drawGap(t)
			if rapid.IntRange(0, 50).Draw(t, "sweep?") == 0 {
				tb.Sweep(uint32(rapid.IntRange(0, parts-1).Draw(t, "sweep part")), now)
				continue
			}
			k := keys.draw(t)
			cost := rapid.Int64Range(0, k.r.Capacity()).Draw(t, "cost")
			got, err := tb.Check(k.part, k.h, k.r, now, cost)
			if err != nil {
				t.Fatalf("op %d: Check: %v", i, err)
			}
			if want := o.check(k.h, k.r, now, cost); got != want {
				t.Fatalf("op %d: %v Check(%#x, %d, %d) = %+v, want %+v", i, k.r.Algorithm, k.h, now, cost, got, want)
			}
			if i%50 == 0 {
				if live := o.live(now); tb.Len() < live {
					t.Fatalf("op %d: table holds %d states, %d are live", i, tb.Len(), live)
				}
			}
			if i%1000 == 0 {
				checkInvariants(t, tb)
			}
		}
		checkInvariants(t, tb)
		for p := range parts {
			tb.Sweep(uint32(p), now)
		}
		checkInvariants(t, tb)
		if got, want := tb.Len(), o.live(now); got != want {
			t.Fatalf("after sweeping: %d states, want the %d live ones", got, want)
		}
	})
}

// The map alone against a built-in map: inserts, deletes and sweeps on
// hashes that cluster at both ends of the array.
func TestSlotsAgainstMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var s slots[TAT]
		m := map[uint64]TAT{}
		var hashes []uint64
		for range drawSize(t, "hashes", 5, 40, 300) {
			hashes = append(hashes, drawHash(t, "hash"))
		}
		now := int64(1000)
		for i := range drawSize(t, "ops", 50, 500, 3000) {
			h := rapid.SampledFrom(hashes).Draw(t, "h")
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 6: // set: a TAT before now is dead, after now live
				v := TAT(now + rapid.Int64Range(-5, 100).Draw(t, "ahead"))
				if ps := s.get(h); ps != nil {
					*ps = v
				} else {
					s.insert(slotKey(h), legacyTag, v, now, testSets) // may sweep: mirror it below
				}
				m[h] = v
			case op < 9:
				_, had := m[h]
				if got := s.del(slotKey(h)); got != had {
					t.Fatalf("op %d: del(%#x) = %v, want %v", i, h, got, had)
				}
				delete(m, h)
			default:
				now += rapid.Int64Range(0, 50).Draw(t, "advance")
				s.sweep(now, testSets)
			}
			// The map may drop dead entries at any time; live ones stay.
			for h, v := range m {
				ps := s.get(h)
				switch {
				case ps != nil && *ps != v:
					t.Fatalf("op %d: get(%#x) = %d, want %d", i, h, *ps, v)
				case ps == nil && !v.idle(now):
					t.Fatalf("op %d: live %#x lost", i, h)
				case ps == nil:
					delete(m, h)
				}
			}
			if s.len() != len(m) {
				t.Fatalf("op %d: len %d, want %d", i, s.len(), len(m))
			}
			if err := s.check(); err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
		}
	})
}

func TestSlotsGrowAndShrink(t *testing.T) {
	var s slots[TAT]
	const n = 10_000
	for i := uint64(1); i <= n; i++ {
		s.insert(slotKey(mix64(i)), legacyTag, TAT(100), 0, testSets)
		if load := float64(s.n) / float64(len(s.ents)); load > 0.85 {
			t.Fatalf("after %d inserts: load %.3f", i, load)
		}
	}
	if load := float64(s.n) / float64(len(s.ents)); load < 0.6 {
		t.Errorf("after %d inserts: load %.3f, want ≥ 0.6", n, load)
	}
	for i := uint64(1); i <= n-10; i++ {
		if !s.del(slotKey(mix64(i))) {
			t.Fatalf("del(%d) = false", i)
		}
	}
	if len(s.ents) > 64 {
		t.Errorf("10 entries left in %d slots: no shrink", len(s.ents))
	}
	if err := s.check(); err != nil {
		t.Fatal(err)
	}
	// A full map of dead states sweeps instead of growing.
	c := len(s.ents)
	for i := uint64(n + 1); !overMax(s.n+1, c); i++ {
		s.insert(slotKey(mix64(i)), legacyTag, TAT(100), 0, testSets)
	}
	if len(s.ents) != c {
		t.Fatalf("capacity %d → %d before the map was full", c, len(s.ents))
	}
	for i := uint64(2 * n); i < 2*n+uint64(c/2); i++ {
		s.insert(slotKey(mix64(i)), legacyTag, TAT(500), 200, testSets) // at 200, every TAT of 100 is dead
	}
	if len(s.ents) != c {
		t.Errorf("capacity %d → %d: grew although a sweep made room", c, len(s.ents))
	}
	if err := s.check(); err != nil {
		t.Fatal(err)
	}
}

// States equal to a fresh key are never stored.
func TestDeadStatesNotStored(t *testing.T) {
	const now = int64(1_000_000) * int64(time.Second)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			r := &Rule{Name: "d", Algorithm: a, Limit: 5, Period: time.Second}
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			tb := mustTable(t, 4)
			for h := range uint64(50) {
				if d, err := tb.Check(uint32(h%4), h, r, now, 0); err != nil || !d.Allowed {
					t.Fatalf("query on a fresh key: %+v, %v", d, err)
				}
			}
			if _, err := tb.Check(1, 1, r, now, 6); !errors.Is(err, ErrCost) {
				t.Fatalf("cost 6 of 5: err %v, want ErrCost", err)
			}
			if n := tb.Len(); n != 0 {
				t.Fatalf("queries and a bad cost stored %d states", n)
			}
			// Spend on 50 keys and deny one more, then wait until all is
			// full again: a query drops the first key, Sweep the rest.
			for h := range uint64(50) {
				for range 5 {
					tb.Check(uint32(h%4), h, r, now, 1)
				}
				if d, _ := tb.Check(uint32(h%4), h, r, now, 1); d.Allowed {
					t.Fatalf("key %d: a 6th check passed", h)
				}
			}
			if n := tb.Len(); n != 50 {
				t.Fatalf("%d states, want 50", n)
			}
			later := now + 3*int64(time.Second)
			if d, _ := tb.Check(0, 0, r, later, 0); !d.Allowed || d.Remaining != 5 {
				t.Fatalf("query after refill: %+v", d)
			}
			if n := tb.Len(); n != 49 {
				t.Fatalf("after a query on a refilled key: %d states, want 49", n)
			}
			dropped := 0
			for p := range uint32(4) {
				dropped += tb.Sweep(p, later)
			}
			if n := tb.Len(); n != 0 || dropped != 49 {
				t.Fatalf("after Sweep: %d states, %d dropped; want 0 and 49", n, dropped)
			}
		})
	}
}

func TestTableErrors(t *testing.T) {
	for _, n := range []int{-1, 0, MaxPartitions + 1} {
		if _, err := NewTable(n); err == nil {
			t.Errorf("NewTable(%d) succeeded", n)
		}
	}
	tb := mustTable(t, 3)
	r := &Rule{Name: "e", Algorithm: GCRA, Limit: 3, Period: time.Second}
	if _, err := tb.Check(3, 1, r, 0, 1); !errors.Is(err, ErrPartition) {
		t.Errorf("Check on partition 3 of 3: %v, want ErrPartition", err)
	}
	if _, err := tb.Check(0, 1, r, 0, -1); !errors.Is(err, ErrCost) {
		t.Errorf("cost -1: %v, want ErrCost", err)
	}
	bad := &Rule{Name: "e", Limit: 3, Period: time.Second}
	if _, err := tb.Check(0, 1, bad, 0, 1); !errors.Is(err, ErrRule) {
		t.Errorf("no algorithm: %v, want ErrRule", err)
	}
	if _, err := tb.Import(7, nil, 0); !errors.Is(err, ErrPartition) {
		t.Errorf("Import into partition 7 of 3: %v, want ErrPartition", err)
	}
	if tb.Len() != 0 {
		t.Errorf("failed calls stored %d states", tb.Len())
	}
	defer func() {
		if recover() == nil {
			t.Error("Sweep on partition 3 of 3 did not panic")
		}
	}()
	tb.Sweep(3, 0)
}

// Many goroutines on a few hot keys at one instant: every bucket admits
// exactly its capacity, whoever asks.
func TestTableConcurrent(t *testing.T) {
	const (
		parts, keys, workers, tries = 8, 64, 8, 400
		now                         = int64(1 << 50)
	)
	tb, other := mustTable(t, parts), mustTable(t, parts)
	rules := []*Rule{
		{Name: "tb", Algorithm: TokenBucket, Limit: 10, Burst: 50, Period: time.Hour},
		{Name: "fw", Algorithm: FixedWindow, Limit: 50, Period: time.Hour},
		{Name: "sl", Algorithm: SlidingLog, Limit: 50, Period: time.Hour},
	}
	var mu sync.Mutex
	admitted := map[oracleKey]int64{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			local := map[oracleKey]int64{}
			for i := range tries * keys / 8 {
				k := uint64((i*7 + w) % keys)
				r := rules[(i+w)%len(rules)]
				h := mix64(k)
				d, err := tb.Check(uint32(k%parts), h, r, now, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					local[oracleKey{kindOf(r.Algorithm), h}]++
				}
				if i%97 == 0 {
					tb.Sweep(uint32(i%parts), now)
					_ = tb.Len()
				}
				if i%211 == 0 { // hand a partition to another table meanwhile
					p := uint32(i % parts)
					if _, err := other.Import(p, tb.Export(nil, p, now), now); err != nil {
						t.Error(err)
						return
					}
				}
			}
			mu.Lock()
			for k, n := range local {
				admitted[k] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for k, n := range admitted {
		if n != 50 {
			t.Errorf("bucket %+v admitted %d, want 50", k, n)
		}
	}
	if len(admitted) != keys*len(rules) {
		t.Errorf("%d buckets admitted something, want %d", len(admitted), keys*len(rules))
	}
	checkInvariants(t, tb)
	checkInvariants(t, other)
}

func TestHoldsTellsTrackedKeysFromNewOnes(t *testing.T) {
	tab, err := NewTable(4)
	if err != nil {
		t.Fatal(err)
	}
	rules := []Rule{
		{Name: "tb", Algorithm: TokenBucket, Limit: 10, Period: time.Second},
		{Name: "fw", Algorithm: FixedWindow, Limit: 10, Period: time.Second},
		{Name: "log", Algorithm: SlidingLog, Limit: 10, Period: time.Second},
	}
	for i := range rules {
		r := &rules[i]
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		bucket := uint64(1000 + i)
		if tab.Holds(1, bucket) {
			t.Fatalf("%s: holds a key never checked", r.Name)
		}
		if _, err := tab.Check(1, bucket, r, 1e9, 1); err != nil {
			t.Fatal(err)
		}
		if !tab.Holds(1, bucket) || tab.Holds(2, bucket) {
			t.Fatalf("%s: Holds after a check = %v (partition 2: %v)", r.Name, tab.Holds(1, bucket), tab.Holds(2, bucket))
		}
	}
	if tab.Holds(99, 1000) {
		t.Fatal("a partition out of range holds something")
	}
}

// A fenced partition decides nothing, alone or in a group, while its
// states can still be exported, imported, swept and dropped; unfenced,
// it decides again.
func TestFenceRefusesChecks(t *testing.T) {
	tb := mustTable(t, 4)
	r := &Rule{Name: "tb", Algorithm: TokenBucket, Limit: 10, Period: time.Second}
	if _, err := tb.Check(1, 7, r, 1e9, 1); err != nil {
		t.Fatal(err)
	}
	tb.Fence(1)
	tb.Fence(1) // twice is once
	if !tb.Fenced(1) || tb.Fenced(2) {
		t.Fatalf("Fenced(1) %v, Fenced(2) %v after fencing 1", tb.Fenced(1), tb.Fenced(2))
	}
	if _, err := tb.Check(1, 8, r, 1e9, 1); err != ErrFenced {
		t.Fatalf("Check on a fenced partition: %v, want ErrFenced itself", err)
	}
	items := []Item{{Part: 2, Bucket: 9, Rule: r, Cost: 1}, {Part: 1, Bucket: 10, Rule: r, Cost: 1}}
	if _, err := tb.CheckGroup(items, 1e9, make([]Decision, 2)); err != ErrFenced {
		t.Fatalf("CheckGroup over a fenced partition: %v, want ErrFenced itself", err)
	}
	if tb.Len() != 1 {
		t.Fatalf("refused checks stored states: %d held, want 1", tb.Len())
	}
	other := mustTable(t, 4)
	if n, err := other.Import(1, tb.Export(nil, 1, 1e9), 1e9); err != nil || n != 1 {
		t.Fatalf("export of a fenced partition: %d states, %v; want 1", n, err)
	}
	tb.Drop(1)
	tb.Unfence(1)
	if d, err := tb.Check(1, 7, r, 1e9, 1); err != nil || d.Remaining != 9 {
		t.Fatalf("unfenced, dropped: %+v %v, want a fresh bucket's answer", d, err)
	}
}

// Checks racing a fence: every check admitted before the fence is in the
// export taken after it, and none is admitted after it.
func TestFenceLosesNoDecision(t *testing.T) {
	const workers, tries = 4, 300
	tb := mustTable(t, 2)
	r := &Rule{Name: "tb", Algorithm: TokenBucket, Limit: 1, Burst: workers * tries, Period: time.Hour}
	const now = int64(1 << 50)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range tries {
				d, err := tb.Check(0, 42, r, now, 1)
				if err == ErrFenced {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	tb.Fence(0)
	stream := tb.Export(nil, 0, now)
	wg.Wait()
	other := mustTable(t, 2)
	if _, err := other.Import(0, stream, now); err != nil {
		t.Fatal(err)
	}
	d, err := other.Check(0, 42, r, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if spent := int64(workers*tries) - d.Remaining; spent != admitted.Load() {
		t.Fatalf("export holds %d spent, %d were admitted", spent, admitted.Load())
	}
}

// States of the unversioned set (rules checked as they are, such as the
// inline rules of Envoy descriptors) live by their own times, however
// many versioned sets come and go. Was: the unversioned set ended at the
// first versioned one, so once the newest set had been in force for its
// longest life, every such state was dropped as soon as it was written
// and each check met a fresh key.
func TestUnversionedStatesOutliveRuleSets(t *testing.T) {
	const s = int64(time.Second)
	t0 := int64(1 << 50)
	for _, a := range allAlgorithms {
		tb := mustTable(t, 1)
		written := Rule{Name: "w", Algorithm: TokenBucket, Limit: 10, Period: time.Second, Version: 1}
		if err := tb.SetRules(1, []Rule{written}, t0); err != nil {
			t.Fatal(err)
		}
		inline := &Rule{Name: "rls:x", Algorithm: a, Limit: 3, Burst: 3, Period: time.Hour}
		at := t0 + 10*s // set 1 has been in force longer than its rules live
		for i := range 3 {
			if d, err := tb.Check(0, 42, inline, at, 1); err != nil || !d.Allowed {
				t.Fatalf("%v: check %d: %+v, %v", a, i, d, err)
			}
		}
		written.Version, written.Limit = 2, 20
		if err := tb.SetRules(2, []Rule{written}, at+s); err != nil {
			t.Fatal(err)
		}
		for _, later := range []int64{2 * s, 30 * s} {
			d, err := tb.Check(0, 42, inline, at+later, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.Remaining != 0 {
				t.Errorf("%v: %v after spending 3 of 3 per hour: %+v, want denied", a, time.Duration(later), d)
			}
		}
	}
}

// A check whose clock was read before a Sweep at a later instant is not
// admitted more than it would have been without the Sweep: the Sweep
// forgot a state as dead at its own instant, so the late check is
// decided at that instant too (Sweep promises decisions do not change).
// Was: the key the Sweep dropped was fresh to the late check, which got
// a whole new budget inside the period already spent.
func TestSweepDoesNotAdmitALateCheckAgain(t *testing.T) {
	const t0 = int64(1_000_000) * int64(time.Second)
	p := int64(time.Second)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			r := &Rule{Name: "late", Algorithm: a, Limit: 4, Period: time.Second}
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			spend := func(tb *Table, now int64) (n int) {
				for range 20 {
					if d, err := tb.Check(0, 7, r, now, 1); err != nil {
						t.Fatal(err)
					} else if d.Allowed {
						n++
					}
				}
				return n
			}
			run := func(sweep bool) (admitted []int) {
				tb := mustTable(t, 1)
				admitted = append(admitted, spend(tb, t0))
				if sweep {
					tb.Sweep(0, t0+p+1)
				}
				admitted = append(admitted, spend(tb, t0+p/2)) // read before the Sweep
				admitted = append(admitted, spend(tb, t0+p+1))
				admitted = append(admitted, spend(tb, t0+p+p/2+1))
				return admitted
			}
			with, without := run(true), run(false)
			sum := func(xs []int) (s int) {
				for _, x := range xs {
					s += x
				}
				return s
			}
			if sum(with) > sum(without) {
				t.Fatalf("admitted %v with the Sweep, %v without", with, without)
			}
		})
	}
}

// CheckGroup runs at the latest clock of its partitions, as Check does.
func TestGroupRunsAtTheLatestClock(t *testing.T) {
	const t0 = int64(1_000_000) * int64(time.Second)
	r := &Rule{Name: "g", Algorithm: FixedWindow, Limit: 2, Period: time.Second}
	tb := mustTable(t, 2)
	for range 2 {
		if d, _ := tb.Check(1, 9, r, t0, 1); !d.Allowed {
			t.Fatal("first window: a check was denied")
		}
	}
	tb.Sweep(1, t0+int64(time.Second)) // the window is over: dropped
	items := []Item{{Part: 0, Bucket: 1, Rule: r, Cost: 1}, {Part: 1, Bucket: 9, Rule: r, Cost: 2}}
	out := make([]Decision, 2)
	if pass, err := tb.CheckGroup(items, t0+int64(time.Second)/2, out); err != nil || !pass {
		t.Fatalf("group read before the Sweep: %v %v, want a pass in the next window", pass, err)
	}
	// It spent partition 1's next window, not the one already spent.
	if d, _ := tb.Check(1, 9, r, t0+int64(time.Second), 1); d.Allowed {
		t.Fatalf("next window after the group spent it: %+v, want denied", d)
	}
}
