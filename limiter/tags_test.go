package limiter

import (
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
	for _, exhaust := range []bool{false, true} {
		tb, _ := NewTable(1)
		r1 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 1, Period: time.Hour}
		if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
			t.Fatal(err)
		}
		r1.Version = 1
		if d, err := tb.Check(0, 42, &r1, 0, 1); err != nil || !d.Allowed {
			t.Fatalf("first check: %+v %v", d, err)
		}
		sec := int64(time.Second)
		last := uint64(254)
		if exhaust {
			last = 255
		}
		var rl Rule
		for v := uint64(2); v <= last; v++ {
			rl = Rule{Name: "r", Algorithm: TokenBucket, Limit: 1000 + int64(v), Period: time.Second}
			at := sec
			if v == 255 {
				at = 10 * sec
			}
			if err := tb.SetRules(v, []Rule{rl}, at); err != nil {
				t.Fatal(err)
			}
		}
		rl.Version = last
		// At 10s, every rule since 1s refills in about a second: the key
		// is as good as fresh, its hour-long debt gone with rule 1.
		d, err := tb.Check(0, 42, &rl, 10*sec, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			t.Errorf("exhausted tags=%v: check of a key idle under the current rules denied, retry after %v (the stale state of rule set 1 was read under the set that reused its tag)", exhaust, d.RetryAfter)
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
