package limiter

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// ruleStep is one row of a rule-change table: at an offset from the
// start, either a new rule set comes into force (set != nil) or a check
// of cost is made under the rule in force, and its decision compared.
type ruleStep struct {
	at   time.Duration
	set  *Rule // the rule's new form, in force from at
	cost int64
	want Decision
}

// hour8784 is the period of the issue's examples: 366 days.
const hour8784 = 8784 * time.Hour

// ruleT0 is a start that is a whole second, in the middle of an 8784h
// window (Unix nanoseconds of 2026-07-02).
var ruleT0 = alignDown(int64(1_782_950_400*time.Second), int64(hour8784)) + int64(hour8784)/2

// runRuleSteps runs steps against a table, one key, registering each new
// form of the rule as the next rule set.
func runRuleSteps(t *testing.T, r Rule, steps []ruleStep) {
	t.Helper()
	tb := mustTable(t, 1)
	r.Version = 1
	if err := tb.SetRules(1, []Rule{r}, ruleT0); err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		now := ruleT0 + int64(s.at)
		if s.set != nil {
			nr := *s.set
			nr.Name, nr.Version = r.Name, r.Version+1
			if err := tb.SetRules(nr.Version, []Rule{nr}, now); err != nil {
				t.Fatal(err)
			}
			r = nr
			continue
		}
		d, err := tb.Check(0, 42, &r, now, s.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d != s.want {
			t.Errorf("step %d: %v %d/%v burst %d: Check(t0+%v, %d) = %+v, want %+v",
				i, r.Algorithm, r.Limit, r.Period, r.Burst, s.at, s.cost, d, s.want)
		}
	}
}

// The issue's examples, with the values API.md says are right (the wrong
// values the build gave are in each comment).
func TestRuleChangeIssueExamples(t *testing.T) {
	const ms = time.Millisecond
	long := func(a Algorithm, limit int64) Rule {
		return Rule{Name: "x", Algorithm: a, Limit: limit, Burst: limit, Period: hour8784}
	}
	short := func(a Algorithm, limit int64) *Rule {
		return &Rule{Algorithm: a, Limit: limit, Period: time.Second}
	}
	if ruleT0%int64(time.Second) != 0 {
		t.Fatal("t0 is not a whole second")
	}
	t.Run("windows loosened", func(t *testing.T) {
		// limit 2 over 8784h: spend 2, wait 2.2 s, the same with period
		// 1s, check. Was: denied for ~75 days (fixed_window), ~366 days
		// (sliding_log); sliding_window 1500 ms and then denied again.
		for _, tt := range []struct {
			a         Algorithm
			resetNext time.Duration // reset_after of the check after the change
		}{
			{FixedWindow, 800 * ms},    // the 1s window [t0+2s, t0+3s)
			{SlidingWindow, 1800 * ms}, // ... weighs until t0+4s
			{SlidingLog, 1000 * ms},    // one period after it
		} {
			t.Run(tt.a.String(), func(t *testing.T) {
				w := func(allowed bool, remaining int64, reset, retry time.Duration) Decision {
					return Decision{Allowed: allowed, Limit: 2, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
				}
				longReset := time.Duration(alignDown(ruleT0, int64(hour8784)) + int64(hour8784) - ruleT0)
				if tt.a == SlidingWindow {
					longReset += hour8784
				}
				if tt.a == SlidingLog {
					longReset = hour8784
				}
				runRuleSteps(t, long(tt.a, 2), []ruleStep{
					{at: 0, cost: 2, want: w(true, 0, longReset, 0)},
					{at: 2200 * ms, set: short(tt.a, 2)},
					{at: 2200 * ms, cost: 1, want: w(true, 1, tt.resetNext, 0)},
					{at: 2200 * ms, cost: 1, want: w(true, 0, tt.resetNext, 0)},
				})
			})
		}
	})
	t.Run("rates loosened", func(t *testing.T) {
		// limit 1 burst 1 over 8784h: spend 1, wait 1.2 s, limit 1 over
		// 1s, check. Was: denied with retry_after 31,622,398,796 ms.
		// The key had 1.2s/8784h of a token at the change and keeps it:
		// the new rule refills the rest within a second (in ns, rounded
		// up), and then the check passes.
		const left = time.Second - 37*time.Nanosecond // 1s × (1 − 1.2s/8784h), rounded up
		for _, a := range []Algorithm{TokenBucket, GCRA, LeakyBucket} {
			t.Run(a.String(), func(t *testing.T) {
				runRuleSteps(t, long(a, 1), []ruleStep{
					{at: 0, cost: 1, want: Decision{Allowed: true, Limit: 1, ResetAfter: hour8784}},
					{at: 1200 * ms, set: &Rule{Algorithm: a, Limit: 1, Burst: 1, Period: time.Second}},
					{at: 1200 * ms, cost: 1, want: Decision{Limit: 1, ResetAfter: left, RetryAfter: left}},
					{at: 1200*ms + left, cost: 1, want: Decision{Allowed: true, Limit: 1, ResetAfter: time.Second}},
				})
			})
		}
	})
	t.Run("tightened", func(t *testing.T) {
		// From 1s to 8784h right after spending: what was admitted still
		// counts. Was: a fresh budget for every algorithm.
		for _, a := range allAlgorithms {
			t.Run(a.String(), func(t *testing.T) {
				r := Rule{Name: "x", Algorithm: a, Limit: 2, Period: time.Second}
				var want Decision
				switch {
				case a.tat():
					// 2 tokens spent, 0.1s of refill (0.2 token) kept:
					// 1.8 tokens of 8784h/2 each to wait for one.
					left := time.Duration(int64(hour8784/2) * 8 / 10)
					want = Decision{Limit: 2, ResetAfter: hour8784 - hour8784/10, RetryAfter: left}
				case a == SlidingLog:
					left := hour8784 - 100*ms
					want = Decision{Limit: 2, ResetAfter: left, RetryAfter: left}
				case a == FixedWindow:
					left := time.Duration(alignDown(ruleT0, int64(hour8784)) + int64(hour8784) - ruleT0 - int64(100*ms))
					want = Decision{Limit: 2, ResetAfter: left, RetryAfter: left}
				case a == SlidingWindow:
					// Both admissions in the current 8784h window: it must
					// turn, and then weigh under one half.
					left := time.Duration(alignDown(ruleT0, int64(hour8784)) + int64(hour8784) - ruleT0 - int64(100*ms))
					want = Decision{Limit: 2, ResetAfter: left + hour8784, RetryAfter: left + hour8784/2}
				}
				runRuleSteps(t, r, []ruleStep{
					{at: 0, cost: 2, want: Decision{Allowed: true, Limit: 2, ResetAfter: resetAfter(a, time.Second)}},
					{at: 100 * ms, set: &Rule{Algorithm: a, Limit: 2, Period: hour8784}},
					{at: 100 * ms, cost: 1, want: want},
					{at: 100*ms + want.RetryAfter - 1, cost: 1, want: func() Decision {
						d := want
						d.ResetAfter -= want.RetryAfter - 1
						d.RetryAfter = 1
						if a == SlidingWindow {
							d.ResetAfter = want.ResetAfter - want.RetryAfter + 1
						}
						return d
					}()},
				})
			})
		}
	})
}

// resetAfter is the ResetAfter of spending a fresh key of limit 2 over
// period p whole at ruleT0.
func resetAfter(a Algorithm, p time.Duration) time.Duration {
	switch a {
	case FixedWindow:
		return time.Duration(alignDown(ruleT0, int64(p)) + int64(p) - ruleT0)
	case SlidingWindow:
		return time.Duration(alignDown(ruleT0, int64(p)) + 2*int64(p) - ruleT0)
	}
	return p
}

// changeAdmission is one admitted check of the property test.
type changeAdmission struct {
	key  int
	at   int64
	cost int64
}

// allowance is the most rule r lets one key admit at instants in [a, b]
// from any state it may start in (a ≤ b): the capacity and the refill of
// a rate rule, the limit of each window touched (fixed, sliding: an
// admission needs current + cost ≤ limit), the limit of each period
// (log).
func allowance(r *Rule, a, b int64) int64 {
	p := int64(r.Period)
	switch {
	case r.Algorithm.tat():
		return r.Capacity() + (b-a)/r.interval()
	case r.Algorithm.window():
		return r.Limit * ((alignDown(b, p)-alignDown(a, p))/p + 1)
	}
	return r.Limit * ((b-a)/p + 1)
}

// maxWait is the most a decision of rule r may say to wait, for reset
// and for retry.
func maxWait(r *Rule) time.Duration {
	switch r.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		return time.Duration(r.Capacity() * r.interval())
	case SlidingWindow:
		return 2 * r.Period
	}
	return r.Period
}

// logOracle is sliding_log as API.md words it, one list per key: an
// entry counts until one period of the rule in force after it; at a
// change, the entries that no longer counted under the old rule go.
type logOracle map[int][]changeAdmission

func (o logOracle) change(old *Rule, at int64) {
	for k, es := range o {
		var keep []changeAdmission
		for _, e := range es {
			if e.at+int64(old.Period) > at {
				keep = append(keep, e)
			}
		}
		o[k] = keep
	}
}

func (o logOracle) check(key int, r *Rule, now, cost int64) Decision {
	p := int64(r.Period)
	var live []changeAdmission
	sum := int64(0)
	for _, e := range o[key] {
		if e.at+p > now {
			live = append(live, e)
			sum += e.cost
		}
	}
	o[key] = live
	want := max(cost, 1)
	d := Decision{Limit: r.Limit, Allowed: sum+want <= r.Limit}
	if !d.Allowed {
		freed := int64(0)
		for _, e := range live {
			freed += e.cost
			if sum-freed+want <= r.Limit {
				d.RetryAfter = time.Duration(e.at + p - now)
				break
			}
		}
	} else if cost > 0 {
		o[key] = append(o[key], changeAdmission{key, now, cost})
		sum += cost
	}
	d.Remaining = max(r.Limit-sum, 0)
	if es := o[key]; len(es) > 0 {
		d.ResetAfter = time.Duration(es[len(es)-1].at + p - now)
	}
	return d
}

// Random rules, random traffic on a few keys, and one to three rule
// changes at random moments: after each change every decision stays
// within the new rule's bounds, waiting RetryAfter lets the same check
// pass, the admissions of any stretch of time never exceed what each rule
// allowed while it was in force, and sliding_log decides exactly as its
// oracle.
func TestRuleChangeProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.SampledFrom(allAlgorithms).Draw(t, "algorithm")
		r := drawTableRule(t, a)
		r.Version = 1
		tb := mustTable(t, 1)
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		if err := tb.SetRules(1, []Rule{*r}, now); err != nil {
			t.Fatal(err)
		}
		rules := []*Rule{r}
		changes := []int64{math.MinInt64} // when rules[i] came into force
		var adm []changeAdmission
		oracle := logOracle{}
		keys := rapid.IntRange(1, 3).Draw(t, "keys")
		left := rapid.IntRange(1, 3).Draw(t, "changes")
		var retry *changeAdmission // a check to make again after its RetryAfter
		for i := range rapid.IntRange(1, 150).Draw(t, "ops") {
			p := int64(r.Period)
			key := rapid.IntRange(0, keys-1).Draw(t, "key")
			cost := rapid.Int64Range(0, r.Capacity()).Draw(t, "cost")
			again := retry != nil && rapid.Bool().Draw(t, "retry?")
			if again {
				key, cost, now = retry.key, retry.cost, retry.at
			} else {
				now += rapid.SampledFrom([]int64{0, 1, p / 100, p / 7, p, 3 * p}).Draw(t, "gap")
			}
			retry = nil
			if !again && left > 0 && rapid.IntRange(0, 9).Draw(t, "change?") == 0 {
				left--
				nr := drawTableRule(t, a)
				nr.Version = r.Version + 1
				if err := tb.SetRules(nr.Version, []Rule{*nr}, now); err != nil {
					t.Fatal(err)
				}
				oracle.change(r, now)
				r = nr
				rules, changes = append(rules, r), append(changes, now)
				continue
			}
			d, err := tb.Check(0, uint64(key)<<8, r, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			if a == SlidingLog {
				if want := oracle.check(key, r, now, cost); d != want {
					t.Fatalf("op %d: key %d Check(%d, %d) = %+v, oracle %+v", i, key, now, cost, d, want)
				}
			}
			if again && !d.Allowed {
				t.Fatalf("op %d: denied again after waiting RetryAfter: %+v", i, d)
			}
			if w := maxWait(r); d.ResetAfter > w || d.RetryAfter > w || d.Delay > w || d.ResetAfter < 0 || d.RetryAfter < 0 {
				t.Fatalf("op %d: %v %d/%v burst %d: %+v waits over %v", i, a, r.Limit, r.Period, r.Burst, d, w)
			}
			switch {
			case d.Allowed && cost > 0:
				adm = append(adm, changeAdmission{key, now, cost})
			case !d.Allowed:
				retry = &changeAdmission{key, now + int64(d.RetryAfter), cost}
			}
		}
		changes = append(changes, math.MaxInt64)
		// Every stretch [a, b] between two admissions of one key.
		for i, x := range adm {
			sum := int64(0)
			for _, y := range adm[i:] {
				if y.key != x.key {
					continue
				}
				sum += y.cost
				bound := int64(0)
				for k, r := range rules {
					// Closed: checks at a change's instant may fall on
					// either side of it.
					lo, hi := max(x.at, changes[k]), min(y.at, changes[k+1])
					if lo <= hi {
						bound += allowance(r, lo, hi)
					}
				}
				if sum > bound {
					t.Fatalf("key %d admitted %d in [%d, %d], rules in force then allow %d", x.key, sum, x.at, y.at, bound)
				}
			}
		}
	})
}

// A partition handed off while its rules change: the importer, which
// never saw the set the states were made under, carries them over to its
// newer set exactly as the exporter would have.
func TestRuleChangeThroughHandOff(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.SampledFrom(allAlgorithms).Draw(t, "algorithm")
		r1, r2 := drawTableRule(t, a), drawTableRule(t, a)
		r1.Version, r2.Version = 1, 2
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		const offset = int64(5 * time.Hour) // the importer's clock: windows stay aligned
		src := mustTable(t, 1)
		if err := src.SetRules(1, []Rule{*r1}, now); err != nil {
			t.Fatal(err)
		}
		for range rapid.IntRange(0, 40).Draw(t, "before") {
			now += rapid.SampledFrom([]int64{0, 1, int64(r1.Period) / 7, int64(r1.Period)}).Draw(t, "gap")
			key := rapid.Uint64Range(0, 3).Draw(t, "key") << 8
			src.Check(0, key, r1, now, rapid.Int64Range(0, r1.Capacity()).Draw(t, "cost"))
		}
		now += rapid.Int64Range(0, int64(r1.Period)).Draw(t, "change")
		stream := src.Export(nil, 0, now)
		// ref converts locally; imp learns of set 1 from the stream only.
		ref, imp := mustTable(t, 1), mustTable(t, 1)
		if _, err := ref.Import(0, stream, now); err != nil {
			t.Fatal(err)
		}
		if err := ref.SetRules(2, []Rule{*r2}, now); err != nil {
			t.Fatal(err)
		}
		if err := imp.SetRules(2, []Rule{*r2}, now+offset); err != nil {
			t.Fatal(err)
		}
		if _, err := imp.Import(0, stream, now+offset); err != nil {
			t.Fatal(err)
		}
		for i := range rapid.IntRange(1, 40).Draw(t, "after") {
			now += rapid.SampledFrom([]int64{0, 1, int64(r2.Period) / 7, int64(r2.Period)}).Draw(t, "gap")
			key := rapid.Uint64Range(0, 3).Draw(t, "key") << 8
			cost := rapid.Int64Range(0, r2.Capacity()).Draw(t, "cost")
			dr, err := ref.Check(0, key, r2, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			di, err := imp.Check(0, key, r2, now+offset, cost)
			if err != nil {
				t.Fatal(err)
			}
			if dr != di {
				t.Fatalf("op %d: key %#x cost %d: converted in place %+v, after hand-off %+v", i, key, cost, dr, di)
			}
		}
	})
}

// Checks on every partition while rule sets change under them: no race,
// no error, and the stores stay sound.
func TestRuleChangeUnderLoad(t *testing.T) {
	tb := mustTable(t, 4)
	base := Rule{Name: "x", Algorithm: TokenBucket, Limit: 10, Period: time.Second}
	rule := func(v uint64) Rule {
		r := base
		r.Version, r.Limit = v, 1+int64(v%7)
		return r
	}
	r1 := rule(1)
	if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	var latest atomic.Uint64
	latest.Store(1)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := range 20_000 {
				v := latest.Load()
				r := rule(v)
				now := int64(i) * int64(time.Millisecond)
				if _, err := tb.Check(uint32(w), uint64(i%97)<<8, &r, now, 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for v := uint64(2); v <= 600; v++ {
		if err := tb.SetRules(v, []Rule{rule(v)}, int64(v)*int64(time.Millisecond)*30); err != nil {
			t.Fatal(err)
		}
		latest.Store(v)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// A worker may check under a version released by the time it
		// gets there; anything else is a bug.
		if !errors.Is(err, ErrVersion) {
			t.Fatal(err)
		}
	}
	checkInvariants(t, tb)
	if n := len(tb.RuleVersions()); n > 600 {
		t.Fatalf("%d versions kept", n)
	}
}

// More rule changes than there are tags, while a state of the first set
// is still live: it is adopted by the newest rule (capped to it), not
// lost and not re-read as something else.
func TestRuleSetTagsRunOut(t *testing.T) {
	tb := mustTable(t, 1)
	long := Rule{Name: "x", Algorithm: SlidingLog, Limit: 5, Period: time.Hour, Version: 1}
	if err := tb.SetRules(1, []Rule{long}, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := tb.Check(0, 7<<8, &long, 0, 5); !d.Allowed {
		t.Fatal("first spend denied")
	}
	var r Rule
	for v := uint64(2); v < 2+2*maxTags; v++ {
		r = long
		r.Version, r.Limit = v, 5+int64(v%2) // every set differs from the one before
		if err := tb.SetRules(v, []Rule{r}, int64(v)); err != nil {
			t.Fatal(err)
		}
		// Keep some other key live under each set.
		tb.Check(0, v<<8, &r, int64(v), 1)
	}
	if n := len(tb.RuleVersions()); n > maxTags {
		t.Fatalf("%d versions held, more than the tags", n)
	}
	d, err := tb.Check(0, 7<<8, &r, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The five admissions of t=0 still count: at most one more passes.
	if d.Remaining > 1 || d.ResetAfter > time.Hour || d.RetryAfter > time.Hour {
		t.Fatalf("after the tags ran out: %+v", d)
	}
	if _, err := tb.Check(0, 1<<8, &long, 1000, 1); !errors.Is(err, ErrVersion) {
		t.Fatalf("a check under a released version: %v, want ErrVersion", err)
	}
	checkInvariants(t, tb)
}

func TestSetRulesRejects(t *testing.T) {
	tb := mustTable(t, 1)
	ok := Rule{Name: "a", Algorithm: GCRA, Limit: 1, Period: time.Second}
	for _, tt := range []struct {
		name    string
		version uint64
		rules   []Rule
	}{
		{"version 0", 0, []Rule{ok}},
		{"invalid rule", 3, []Rule{{Name: "b", Algorithm: GCRA, Period: time.Second}}},
		{"duplicate", 3, []Rule{ok, ok}},
	} {
		if err := tb.SetRules(tt.version, tt.rules, 0); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
	if got := tb.RuleVersions(); len(got) != 1 {
		t.Fatalf("versions %v after rejected sets, want [0]", got)
	}
	r := ok
	r.Version = 3
	if _, err := tb.Check(0, 1, &r, 0, 1); !errors.Is(err, ErrVersion) {
		t.Fatalf("check under an unregistered version: %v, want ErrVersion", err)
	}
	// The same rules again share the set: nothing to convert, no tag.
	for v := uint64(1); v <= 3; v++ {
		if err := tb.SetRules(v, []Rule{ok}, int64(v)); err != nil {
			t.Fatal(err)
		}
	}
	g := tb.sets.Load()
	if g.lookup(1) != g.lookup(3) || len(g.sets) != 2 {
		t.Fatalf("three writes of the same rules made %d sets", len(g.sets)-1)
	}
}

// A state of an older rule set that still counted at the change is kept
// by Sweep, though the old rule alone would call it dead: the new rule
// may still count it. One that was dead at the change goes.
func TestRuleChangeSweep(t *testing.T) {
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			tb := mustTable(t, 1)
			r := Rule{Name: "x", Algorithm: a, Limit: 2, Period: time.Second, Version: 1}
			if err := tb.SetRules(1, []Rule{r}, ruleT0); err != nil {
				t.Fatal(err)
			}
			tb.Check(0, 2<<8, &r, ruleT0-int64(3*time.Second), 2) // dead by then
			tb.Check(0, 1<<8, &r, ruleT0, 2)                      // counts at the change
			nr := r
			nr.Version, nr.Period = 2, hour8784
			if err := tb.SetRules(2, []Rule{nr}, ruleT0+int64(100*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			if n := tb.Sweep(0, ruleT0+int64(5*time.Second)); n != 1 || tb.Len() != 1 {
				t.Fatalf("Sweep dropped %d, kept %d; want 1 and 1", n, tb.Len())
			}
			if d, _ := tb.Check(0, 1<<8, &nr, ruleT0+int64(5*time.Second), 1); d.Allowed {
				t.Fatalf("after the sweep: %+v, want denied", d)
			}
			// Once every state of set 1 would be dead under set 2 too,
			// Sweep drops them unseen.
			tb.Check(0, 3<<8, &r, ruleT0, 1)
			if n := tb.Sweep(0, ruleT0+4*int64(hour8784)); n != 2 || tb.Len() != 0 {
				t.Fatalf("long after: Sweep dropped %d, kept %d; want 2 and 0", n, tb.Len())
			}
		})
	}
}

// A token bucket's tokens at a change of capacity are kept, capped at the
// new capacity, whatever the debt: with the capacity lowered below what
// had been spent, a spent bucket stays spent. Was: the debt was capped at
// the new capacity before the difference of capacities was taken off, so
// burst 200 → 100 after spending 200 left the bucket full.
func TestRuleChangeLowerCapacityKeepsTokens(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		for _, tt := range []struct {
			spent, burst, want int64 // of burst 200, then burst, remaining after
		}{
			{200, 100, 0}, // all spent: debt 200 ≥ the new capacity
			{200, 150, 0},
			{120, 100, 80}, // 80 left: kept
			{150, 100, 50},
			{50, 100, 100}, // 150 left: capped at 100
			{0, 100, 100},
		} {
			from := Rule{Name: "x", Algorithm: a, Limit: 100, Period: time.Hour, Burst: 200, Version: 1}
			to := from
			to.Burst, to.Version = tt.burst, 2
			tb := mustTable(t, 1)
			if err := tb.SetRules(1, []Rule{from}, ruleT0); err != nil {
				t.Fatal(err)
			}
			if tt.spent > 0 {
				if d, err := tb.Check(0, 42, &from, ruleT0, tt.spent); err != nil || !d.Allowed {
					t.Fatalf("spending %d: %+v, %v", tt.spent, d, err)
				}
			}
			if err := tb.SetRules(2, []Rule{to}, ruleT0); err != nil {
				t.Fatal(err)
			}
			d, err := tb.Check(0, 42, &to, ruleT0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Remaining != tt.want {
				t.Errorf("%v: %d of burst 200 spent, burst lowered to %d: remaining %d, want %d", a, tt.spent, tt.burst, d.Remaining, tt.want)
			}
		}
	}
}

// A rule removed and added back starts its keys afresh, whatever its
// algorithm: its states were left behind by the set in between. Was:
// sliding_log kept its entries (carry's fresh answer was dropped for a
// log), so a login-style rule removed and written again kept denying,
// while every other algorithm started afresh.
func TestRuleRemovedAndAddedBackStartsFresh(t *testing.T) {
	def := Rule{Name: "default", Algorithm: TokenBucket, Limit: 100, Period: time.Second, Burst: 200}
	for _, alg := range []Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			tb, err := NewTable(4)
			if err != nil {
				t.Fatal(err)
			}
			r := Rule{Name: "login", Algorithm: alg, Limit: 3, Period: time.Hour}
			now := int64(1e12)
			check := func(version uint64, at int64) Decision {
				t.Helper()
				c := r
				c.Version = version
				d, err := tb.Check(0, 42, &c, at, 1)
				if err != nil {
					t.Fatalf("Check under version %d: %v", version, err)
				}
				return d
			}
			if err := tb.SetRules(10, []Rule{def, r}, now); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				check(10, now+int64(i))
			}
			if d := check(10, now+3); d.Allowed {
				t.Fatalf("the fourth check of 3 per hour: %+v, want denied", d)
			}
			if err := tb.SetRules(11, []Rule{def}, now+1e6); err != nil {
				t.Fatal(err)
			}
			if err := tb.SetRules(12, []Rule{def, r}, now+2e6); err != nil {
				t.Fatal(err)
			}
			if d := check(12, now+3e6); !d.Allowed || d.Remaining != 2 {
				t.Fatalf("after the rule was removed and added back: %+v, want allowed with 2 remaining (a fresh key)", d)
			}
		})
	}
}

// A rule whose algorithm changes to another of its kind keeps its keys'
// states, converted as for a change of limit (API.md: "a key's state
// carries over"), and back again: each key is found under the bucket of
// the algorithm it was last written under (altBucket), and that copy is
// dropped once carried, so going back does not meet it stale. A table
// without the seed starts afresh (another kind of state: see
// TestAlgorithmChangedAcrossKindsKeepsTheState). Was: every algorithm
// change started afresh (the algorithm is in the salt).
func TestAlgorithmChangedWithinItsKindKeepsTheState(t *testing.T) {
	const seed, kh = uint64(7), uint64(0x1234_5678_9abc)
	type step struct {
		alg       Algorithm // the rule's algorithm from this step on (a new set when it changes)
		cost      int64
		allowed   bool
		remaining int64
	}
	for _, tc := range []struct {
		name   string
		seeded bool
		limit  int64
		steps  []step
	}{
		{"rate kind", true, 10, []step{
			{TokenBucket, 8, true, 2},
			{GCRA, 0, true, 2},
			{GCRA, 1, true, 1},
			{LeakyBucket, 0, true, 1},
			{TokenBucket, 0, true, 1}, // not the token bucket's stale 2
			{TokenBucket, 1, true, 0},
			{GCRA, 1, false, 0},
		}},
		{"window kind", true, 5, []step{
			{FixedWindow, 4, true, 1},
			{SlidingWindow, 1, true, 0},
			{SlidingWindow, 1, false, 0},
			{FixedWindow, 1, false, 0},
		}},
		{"another kind too", true, 5, []step{
			{TokenBucket, 4, true, 1},
			{FixedWindow, 0, true, 1},
		}},
		{"no seed", false, 10, []step{
			{TokenBucket, 8, true, 2},
			{GCRA, 0, true, 10},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := mustTable(t, 1)
			if tc.seeded {
				tb.SetSeed(seed)
			}
			var r Rule
			for i, s := range tc.steps {
				if i == 0 || s.alg != r.Algorithm {
					r = Rule{Name: "x", Algorithm: s.alg, Limit: tc.limit, Period: time.Hour, Version: r.Version + 1}
					if err := tb.SetRules(r.Version, []Rule{r}, ruleT0); err != nil {
						t.Fatal(err)
					}
				}
				d, err := tb.Check(0, BucketHash(kh, RuleSalt(seed, "x", s.alg)), &r, ruleT0, s.cost)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d.Allowed != s.allowed || d.Remaining != s.remaining {
					t.Fatalf("step %d: %v, cost %d: allowed %v, remaining %d; want %v, %d", i, s.alg, s.cost, d.Allowed, d.Remaining, s.allowed, s.remaining)
				}
			}
		})
	}
}

// altBucket finds a key's bucket under another salt from its bucket
// alone: unmix64 inverts mix64.
func TestAltBucket(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := rapid.Uint64().Draw(t, "x")
		if got := unmix64(mix64(x)); got != x {
			t.Fatalf("unmix64(mix64(%#x)) = %#x", x, got)
		}
		kh, s1, s2 := rapid.Uint64().Draw(t, "kh"), rapid.Uint64().Draw(t, "s1"), rapid.Uint64().Draw(t, "s2")
		if got, want := altBucket(BucketHash(kh, s1), s1^s2), BucketHash(kh, s2); got != want {
			t.Fatalf("altBucket = %#x, want %#x", got, want)
		}
	})
}

// A spent token bucket or gcra key stays spent when its burst is lowered
// and raised back: what the lowering cut off comes back with the raise.
// (A leaky_bucket keeps its queue capped at the new burst, as API.md
// says, so a full queue cut by a lowering is forgiven and a raise leaves
// that room free: a spent key of 10 an hour admitted 7 more at every
// lowering to 3 and raise back in an adversarial run; README says so.)
func TestBurstLoweredAndRaisedBackForgivesNothing(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			tb := mustTable(t, 1)
			r := Rule{Name: "x", Algorithm: a, Limit: 10, Burst: 10, Period: time.Hour, Version: 1}
			now := ruleT0
			if err := tb.SetRules(1, []Rule{r}, now); err != nil {
				t.Fatal(err)
			}
			check := func() bool {
				t.Helper()
				now += int64(time.Millisecond)
				d, err := tb.Check(0, 42, &r, now, 1)
				if err != nil {
					t.Fatal(err)
				}
				return d.Allowed
			}
			for i := range 10 {
				if !check() {
					t.Fatalf("check %d of a fresh key denied", i+1)
				}
			}
			for cycle := range 5 {
				for _, burst := range []int64{3, 10} {
					now += int64(time.Millisecond)
					r.Burst, r.Version = burst, r.Version+1
					if err := tb.SetRules(r.Version, []Rule{r}, now); err != nil {
						t.Fatal(err)
					}
				}
				if check() {
					t.Fatalf("cycle %d: a spent key admitted after its burst went 10 → 3 → 10 (6 minutes a token, %v since it was spent)", cycle, time.Duration(now-ruleT0))
				}
			}
		})
	}
}
