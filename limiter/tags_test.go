package limiter

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// An import into a table whose tags are all taken registers the stream's
// sets one by one, and registering a later one frees tags: the sets it
// registered a moment before, which no state carries yet, are kept.
// Was: released (and handed on), and the merge panicked on a tag naming
// no set. Found by an audit of the bucket table.
func TestImportKeepsTheTagsOfItsOwnSets(t *testing.T) {
	rule := func(v uint64, limit int64) Rule {
		return Rule{Name: "r", Algorithm: TokenBucket, Limit: limit, Period: time.Second, Version: v}
	}
	const b1, b2 = 0x1111 << 8, 0x2222 << 8

	// The exporter: a state under set 1 and one under set 2.
	ex, _ := NewTable(1)
	r1, r2 := rule(1, 10), rule(2, 20)
	if err := ex.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := ex.SetRules(2, []Rule{r2}, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b uint64
		r *Rule
	}{{b1, &r1}, {b2, &r2}} {
		if d, err := ex.Check(0, c.b, c.r, 0, 1); err != nil || !d.Allowed {
			t.Fatalf("exporter check: %+v %v", d, err)
		}
	}
	stream := ex.Export(nil, 0, 0)

	// The importer: 253 sets of its own (one tag left), and a state on b1.
	im, _ := NewTable(1)
	var last Rule
	for v := uint64(100); v < 100+253; v++ {
		last = rule(v, 100+int64(v))
		if err := im.SetRules(v, []Rule{last}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := im.Check(0, b1, &last, 0, 1); err != nil || !d.Allowed {
		t.Fatalf("importer check: %+v %v", d, err)
	}

	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Import of a valid stream panicked: %v", p)
		}
	}()
	if _, err := im.Import(0, stream, 0); err != nil {
		t.Fatalf("Import: %v", err)
	}
}

// The same without a state on b1: every imported state carries a tag
// that names a set. Was: b1's named none, and would have been read as
// the state of whichever set got the tag next.
func TestImportedStatesNameTheirSet(t *testing.T) {
	rule := func(v uint64, limit int64) Rule {
		return Rule{Name: "r", Algorithm: TokenBucket, Limit: limit, Period: time.Second, Version: v}
	}
	const b1, b2 = 0x1111 << 8, 0x2222 << 8
	ex, _ := NewTable(1)
	r1, r2 := rule(1, 10), rule(2, 20)
	_ = ex.SetRules(1, []Rule{r1}, 0)
	_ = ex.SetRules(2, []Rule{r2}, 0)
	_, _ = ex.Check(0, b1, &r1, 0, 1)
	_, _ = ex.Check(0, b2, &r2, 0, 1)
	stream := ex.Export(nil, 0, 0)

	im, _ := NewTable(1)
	for v := uint64(100); v < 100+253; v++ {
		_ = im.SetRules(v, []Rule{rule(v, 100+int64(v))}, 0)
	}
	if _, err := im.Import(0, stream, 0); err != nil {
		t.Fatalf("Import: %v", err)
	}
	g := im.sets.Load()
	p := &im.parts[0]
	p.tats.all(func(k uint64, tag uint8, v TAT) {
		if g.byTag[tag] == nil {
			t.Errorf("imported state %#x carries tag %d, which names no rule set (versions now %v)", k, tag, im.RuleVersions())
		}
	})
}

// A state droppable only because its set's dropAt passed (not idle by
// its own times: an hour-long rule superseded by short ones) goes with
// its tag when freeTag releases it. Was: left in the table, the tag given
// to the new set, and the old state read as the new set's: the key
// denied for 59 minutes under rules of 1000 per second.
func TestReleasedTagsStatesAreDropped(t *testing.T) {
	sec := int64(time.Second)
	for _, tc := range []struct {
		exhaust bool
		at      int64 // when the last set comes and the key is checked
	}{
		{false, 10 * sec},
		{true, 10 * sec}, // set 1 superseded 9s before: every partition locked (freeTag)
		{true, 30 * sec}, // 29s before: settled, one partition at a time (free, not held)
	} {
		exhaust := tc.exhaust
		tb, _ := NewTable(1)
		r1 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 1, Period: time.Hour}
		if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
			t.Fatal(err)
		}
		r1.Version = 1
		if d, err := tb.Check(0, 42, &r1, 0, 1); err != nil || !d.Allowed {
			t.Fatalf("first check: %+v %v", d, err)
		}
		last := uint64(254)
		if exhaust {
			last = 255
		}
		var rl Rule
		for v := uint64(2); v <= last; v++ {
			rl = Rule{Name: "r", Algorithm: TokenBucket, Limit: 1000 + int64(v), Period: time.Second}
			at := sec
			if v == 255 {
				at = tc.at
			}
			if err := tb.SetRules(v, []Rule{rl}, at); err != nil {
				t.Fatal(err)
			}
		}
		rl.Version = last
		// At 10s, every rule since 1s refills in about a second: the key
		// is as good as fresh, its hour-long debt gone with rule 1.
		d, err := tb.Check(0, 42, &rl, tc.at, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			t.Errorf("exhausted tags=%v at %v: check of a key idle under the current rules denied, retry after %v (the stale state of rule set 1 was read under the set that reused its tag)", exhaust, time.Duration(tc.at), d.RetryAfter)
		}
	}
}

// A check under an older registered set (a caller that has not seen the
// newer set yet) that comes lateWrites after the newer set came into
// force (near where its states are dropped as soon as written) is
// decided under the newest set's rule, and its state kept. Was: decided
// under the old rule, the state dropped at once, so every such check
// met a fresh key: 30 of 30 admitted against a capacity of 10. Within
// lateWrites it is decided under its own set, its state kept as long.
func TestLateCheckDecidesUnderTheNewestSet(t *testing.T) {
	tb, _ := NewTable(1)
	r1 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Second}
	r2 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 11, Period: time.Second}
	sec := int64(time.Second)
	if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := tb.SetRules(2, []Rule{r2}, sec); err != nil {
		t.Fatal(err)
	}
	r1.Version = 1
	for _, c := range []struct {
		bucket uint64
		now    int64
		want   int64
	}{
		{7 << 8, 5 * sec, 10},                // set 2 in force for 4s, within lateWrites: set 1's capacity
		{8 << 8, sec + lateWrites + sec, 11}, // past lateWrites: the newest rule's capacity
	} {
		allowed := int64(0)
		for range 30 {
			d, err := tb.Check(0, c.bucket, &r1, c.now, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
			}
		}
		if allowed != c.want || !tb.Holds(0, c.bucket) {
			t.Errorf("30 checks at %v under the older set: %d allowed, want %d; state kept: %v", time.Duration(c.now), allowed, c.want, tb.Holds(0, c.bucket))
		}
	}
}

// A state alive when its rules changed is dropped once every later set
// has been in force for the longest life of a rule of its kind, not of
// any rule: a sliding log of 5s under a set that also holds a fixed
// window of a day, still live at a change of the window's limit, is
// dropped once 5s of the new set have passed. Was: kept for three days
// (three periods of the window), and every change pushed that further
// out (a soak: 1.3M keys and 147 MB held 12s after 40 such changes,
// with a 5s rule's traffic). The window's own state, live at the change,
// is kept as long as its rule says.
func TestStatesOfAnOldSetAreDroppedByTheLifeOfTheirKind(t *testing.T) {
	sec := int64(time.Second)
	tb, _ := NewTable(1)
	logRule := Rule{Name: "sl", Algorithm: SlidingLog, Limit: 5, Period: 5 * time.Second}
	tatRule := Rule{Name: "tb", Algorithm: TokenBucket, Limit: 5, Period: time.Second}
	day := Rule{Name: "day", Algorithm: FixedWindow, Limit: 10, Period: 24 * time.Hour}
	if err := tb.SetRules(1, []Rule{logRule, tatRule, day}, 0); err != nil {
		t.Fatal(err)
	}
	logRule.Version, tatRule.Version, day.Version = 1, 1, 1
	for i, c := range []struct {
		b uint64
		r *Rule
	}{{1 << 8, &logRule}, {2 << 8, &tatRule}, {3 << 8, &day}} {
		if d, err := tb.Check(0, c.b, c.r, 0, 1); err != nil || !d.Allowed {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
	}
	day.Limit = 11
	if err := tb.SetRules(2, []Rule{{Name: "sl", Algorithm: SlidingLog, Limit: 5, Period: 5 * time.Second}, {Name: "tb", Algorithm: TokenBucket, Limit: 5, Period: time.Second}, {Name: "day", Algorithm: FixedWindow, Limit: 11, Period: 24 * time.Hour}}, sec/2); err != nil {
		t.Fatal(err)
	}
	if n := tb.Len(); n != 3 {
		t.Fatalf("%d states after the change, want 3", n)
	}
	tb.Sweep(0, sec/2+5*sec+lateWrites)
	if n := tb.Len(); n != 1 {
		t.Errorf("%d states 5s + lateWrites after the change (the log's 5s and the bucket's 1s past), want 1: the day window's", n)
	}
}

// With rules written every 8 s (a pipeline that writes them often), a
// 5 s log live at a change is dropped once it is dead under the sets
// that followed, not held while writes keep coming. Was: every older
// set's states lived until the newest set's since plus its life, so
// with a write every 8 s none was ever dropped (1.4M keys and 160 MB,
// against 0.5M without the writes).
func TestStatesOfOldSetsDieWhileRulesKeepChanging(t *testing.T) {
	sec := int64(time.Second)
	tb, _ := NewTable(1)
	for v := uint64(1); v <= 6; v++ {
		at := int64(v-1) * 8 * sec
		set := []Rule{
			{Name: "sl", Algorithm: SlidingLog, Limit: 5, Period: 5 * time.Second},
			{Name: "day", Algorithm: FixedWindow, Limit: 10 + int64(v), Period: 24 * time.Hour},
		}
		if err := tb.SetRules(v, set, at); err != nil {
			t.Fatal(err)
		}
		sl := set[0]
		sl.Version = v
		if d, err := tb.Check(0, v<<8, &sl, at+7*sec, 1); err != nil || !d.Allowed { // alive at the next change
			t.Fatalf("check under set %d: %+v %v", v, d, err)
		}
	}
	tb.Sweep(0, 48*sec)
	for v := uint64(1); v <= 6; v++ {
		if want := v >= 5; tb.Holds(0, v<<8) != want {
			t.Errorf("the log of set %d held at 48s: %v, want %v (sets 1-4 dead by their change + lateWrites + 5s)", v, !want, want)
		}
	}
}

// Once every tag is taken, a rules write frees tags of settled sets (no
// check writes their tags any more) one partition at a time: checks of
// the partitions it has visited go on while it waits for another. Was:
// every partition locked for the whole scan, 39 ms of stalled checks a
// write at 1M states (BenchmarkSetRulesAllTagsTaken). The states of the
// sets it adopts keep their spends.
func TestSettledTagsAreFreedOnePartitionAtATime(t *testing.T) {
	const parts = 8
	tb, err := NewTable(parts)
	if err != nil {
		t.Fatal(err)
	}
	sec := int64(time.Second)
	rule := func(v uint64) Rule {
		return Rule{Name: "r", Algorithm: TokenBucket, Limit: 10 + int64(v%2), Period: 24 * time.Hour, Version: v}
	}
	// 254 sets 11 s apart, each with a live state in every partition:
	// every tag taken, every set but the newest settled.
	const spent = 7 << 8 // partition 0's key, spent whole under set 1
	var at int64
	for v := uint64(1); v < maxTags-1; v++ {
		at = int64(v) * 11 * sec
		r := rule(v)
		if err := tb.SetRules(v, []Rule{r}, at); err != nil {
			t.Fatal(err)
		}
		for p := range uint64(parts) {
			if _, err := tb.Check(uint32(p), (v<<16|p)<<8, &r, at, 1); err != nil {
				t.Fatal(err)
			}
		}
		if v == 1 {
			if d, _ := tb.Check(0, spent, &r, at, 11); !d.Allowed {
				t.Fatalf("spending key 7 whole: %+v", d)
			}
		}
	}
	next := at + 11*sec
	tb.parts[5].mu.Lock() // the write waits here
	done := make(chan error, 1)
	go func() { done <- tb.SetRules(maxTags-1, []Rule{rule(maxTags - 1)}, next) }()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		p0 := &tb.parts[0]
		if p0.mu.TryLock() {
			visited := p0.last == next
			p0.mu.Unlock()
			if visited {
				break
			}
		}
		if time.Now().After(deadline) {
			tb.parts[5].mu.Unlock()
			t.Fatal("partition 0 stayed locked or unvisited while the rules write waited for partition 5: every partition held")
		}
	}
	tb.parts[5].mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A quarter of the 253 settled sets adopted (63), the new one added.
	if got, want := len(tb.RuleVersions()), 1+(maxTags-2)-(maxTags-3)/adoptShare+1; got != want {
		t.Fatalf("%d versions held after the write, want %d", got, want)
	}
	r := rule(maxTags - 1)
	d, err := tb.Check(0, spent, &r, next, 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Fatalf("key 7, spent under set 1 and adopted: %+v, want denied (47 minutes refill well under 1 of 11 a day)", d)
	}
	checkInvariants(t, tb)
}

// Rules written past the tags while checks run on every partition,
// late ones among them (behind by a set or two, and by up to 12 s of
// clock): after each write every stored state's tag names a set the
// table holds (a state left with a freed tag would be read as the next
// set's). Run with -race: free lets checks run between its
// visits.
func TestTagsFreedUnderChecksNameHeldSets(t *testing.T) {
	rulesWrittenUnderChecks(t, 16, maxTags+96, false, func(v uint64) Rule {
		algs := []Algorithm{TokenBucket, FixedWindow, SlidingLog}
		return Rule{Name: "r", Algorithm: algs[(v/64)%3], Limit: 5 + int64(v%3), Period: time.Hour, Version: v}
	})
}

// rulesWrittenUnderChecks writes rule(v) for v = 1 to writes into a table
// of parts partitions, 3 s of clock apart (a set settles four writes
// later), while two checkers check under the newest set before each
// write or one or two behind it, up to 12 s of clock late, and, when
// sweep is set, every partition is swept at the write's time. After each
// write every stored state's tag must name a set the table holds; it
// returns the table.
func rulesWrittenUnderChecks(t *testing.T, parts int, writes uint64, sweep bool, rule func(v uint64) Rule) *Table {
	t.Helper()
	const checkers, perWrite = 2, 64
	tb, err := NewTable(parts)
	if err != nil {
		t.Fatal(err)
	}
	sec := int64(time.Second)
	r1 := rule(1)
	if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	var n uint64 // checks so far, for keys and lags
	for v := uint64(2); v <= writes; v++ {
		at := int64(v) * 3 * sec
		var wg sync.WaitGroup
		for c := range uint64(checkers) {
			first := n + c*perWrite
			wg.Go(func() {
				for i := first; i < first+perWrite; i++ {
					r := rule(max(v-1-i%3, 1)) // the newest before this write, or behind it
					k := (i*7919 + c) % 4096
					now := at - int64(i%4)*4*sec
					if _, err := tb.Check(uint32(k%uint64(parts)), (k+1)<<8, &r, now, 1); err != nil && !errors.Is(err, ErrVersion) {
						t.Error(err)
						return
					}
				}
			})
		}
		if sweep {
			wg.Go(func() {
				for p := range parts {
					tb.Sweep(uint32((int(v)*5+p)%parts), at)
				}
			})
		}
		if err := tb.SetRules(v, []Rule{rule(v)}, at); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		n += checkers * perWrite
		if p, tag := orphanTag(tb); p >= 0 {
			t.Fatalf("after write %d: partition %d holds a state of tag %d, which names no set", v, p, tag)
		}
	}
	checkInvariants(t, tb)
	return tb
}
