package limiter

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// crossSeed and crossKey are the seed and key hash of the cross-kind
// tests: a key's bucket under each algorithm is BucketHash(crossKey,
// RuleSalt(crossSeed, name, algorithm)), as a node computes it.
const crossSeed, crossKey = uint64(7), uint64(0x1234_5678_9abc)

// crossTable is a seeded table and the rule of one name as its sets
// change: set registers the next version with the rule of algorithm a,
// check checks a key under the rule in force.
type crossTable struct {
	t  *testing.T
	tb *Table
	r  Rule
}

func newCrossTable(t *testing.T, seeded bool) *crossTable {
	c := &crossTable{t: t, tb: mustTable(t, 1)}
	if seeded {
		c.tb.SetSeed(crossSeed)
	}
	return c
}

func (c *crossTable) set(r Rule, at int64) {
	c.t.Helper()
	r.Name, r.Version = "x", c.r.Version+1
	if err := c.tb.SetRules(r.Version, []Rule{r}, at); err != nil {
		c.t.Fatal(err)
	}
	c.r = r
}

func (c *crossTable) bucket(key uint64) uint64 {
	return BucketHash(key, RuleSalt(crossSeed, c.r.Name, c.r.Algorithm))
}

func (c *crossTable) check(key uint64, at, cost int64) Decision {
	c.t.Helper()
	d, err := c.tb.Check(0, c.bucket(key), &c.r, at, cost)
	if err != nil {
		c.t.Fatalf("%v: Check(%d, %d): %v", c.r.Algorithm, at, cost, err)
	}
	return d
}

// crossPairs is every ordered pair of algorithms of different kinds of
// state (22 of them).
func crossPairs() [][2]Algorithm {
	var out [][2]Algorithm
	for _, a := range allAlgorithms {
		for _, b := range allAlgorithms {
			if lifeKind(a) != lifeKind(b) {
				out = append(out, [2]Algorithm{a, b})
			}
		}
	}
	return out
}

// A rule whose algorithm changes to another kind of state keeps what its
// keys spent (API.md: "a key's state carries over … a tightened rule
// still counts what was admitted before it"), for every pair of kinds in
// both directions: a key that used 8 of 10 has 2 left after the change,
// the third is denied for no longer than the new rule can say, and
// waiting that long lets it pass. The old copy is gone once carried.
// Was: a change to another kind started every key afresh (10 left).
func TestAlgorithmChangedAcrossKindsKeepsTheState(t *testing.T) {
	const ms = int64(time.Millisecond)
	for _, pair := range crossPairs() {
		t.Run(fmt.Sprintf("%v→%v", pair[0], pair[1]), func(t *testing.T) {
			c := newCrossTable(t, true)
			c.set(Rule{Algorithm: pair[0], Limit: 10, Period: time.Hour}, ruleT0)
			if d := c.check(crossKey, ruleT0, 8); !d.Allowed || d.Remaining != 2 {
				t.Fatalf("spending 8 of 10: %+v", d)
			}
			c.set(Rule{Algorithm: pair[1], Limit: 10, Period: time.Hour}, ruleT0+ms)
			now := ruleT0 + 2*ms
			if d := c.check(crossKey, now, 0); !d.Allowed || d.Remaining != 2 {
				t.Fatalf("after the change: %+v, want 2 left", d)
			}
			if d := c.check(crossKey, now, 2); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("spending the 2 left: %+v", d)
			}
			d := c.check(crossKey, now, 1)
			if w := maxWait(&c.r); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > w || d.ResetAfter > w {
				t.Fatalf("one more: %+v, want denied and waits within %v", d, w)
			}
			if d := c.check(crossKey, now+int64(d.RetryAfter), 1); !d.Allowed {
				t.Fatalf("after waiting RetryAfter: %+v", d)
			}
			if n := c.tb.Len(); n != 1 {
				t.Fatalf("%d states held, want the converted one only", n)
			}
			checkInvariants(t, c.tb)
		})
	}
}

// Without the seed the table cannot find a key's state under another
// algorithm's bucket: a change of kind starts afresh, as before.
func TestAlgorithmChangedAcrossKindsWithoutSeed(t *testing.T) {
	c := newCrossTable(t, false)
	c.set(Rule{Algorithm: TokenBucket, Limit: 10, Period: time.Hour}, ruleT0)
	c.check(crossKey, ruleT0, 8)
	c.set(Rule{Algorithm: SlidingLog, Limit: 10, Period: time.Hour}, ruleT0)
	if d := c.check(crossKey, ruleT0, 0); d.Remaining != 10 {
		t.Fatalf("without the seed: %+v, want a fresh key", d)
	}
}

// token_bucket → sliding_window → sliding_log → token_bucket: a key
// checked under each keeps everything spent so far (found under the
// previous algorithm's bucket each time); a key not checked in between
// is carried through every kind from its own bucket when the rule comes
// back to its algorithm; and going back never meets a stale copy. Was:
// each change started the keys afresh.
func TestAlgorithmChangeAcrossKindsChain(t *testing.T) {
	const ms = int64(time.Millisecond)
	const busy, quiet = crossKey, crossKey + 1
	c := newCrossTable(t, true)
	steps := []struct {
		alg             Algorithm
		spend, busyLeft int64 // spent by busy, then left
	}{
		{TokenBucket, 3, 7},
		{SlidingWindow, 2, 5},
		{SlidingLog, 1, 4},
		{TokenBucket, 1, 3},
		{SlidingLog, 1, 2},
	}
	for i, s := range steps {
		now := ruleT0 + int64(i)*ms
		c.set(Rule{Algorithm: s.alg, Limit: 10, Period: time.Hour}, now)
		if i == 0 {
			c.check(quiet, now, 3)
		}
		if d := c.check(busy, now, 0); d.Remaining != s.busyLeft+s.spend {
			t.Fatalf("step %d (%v): busy key has %d left, want %d", i, s.alg, d.Remaining, s.busyLeft+s.spend)
		}
		if d := c.check(busy, now, s.spend); !d.Allowed || d.Remaining != s.busyLeft {
			t.Fatalf("step %d (%v): spending %d: %+v, want %d left", i, s.alg, s.spend, d, s.busyLeft)
		}
		if i == 3 {
			// Back at token_bucket: the quiet key's own bucket holds its
			// state of step 0, carried through the window and the log.
			if d := c.check(quiet, now, 0); d.Remaining != 7 {
				t.Fatalf("quiet key back at %v: %d left, want 7", s.alg, d.Remaining)
			}
		}
	}
	if n := c.tb.Len(); n != 2 {
		t.Fatalf("%d states held, want one per key", n)
	}
}

// A state of a set whose rule then changed kind is kept by Sweep as long
// as the new rule may count it, though no rule of its own kind is left
// to (ruleSet.reach): a quiet key keeps its budget. Was (with a state's
// life bounded by the later sets' rules of its kind alone): a token
// bucket's state was dropped lateWrites after its rule became a
// day-long fixed window, and the key came back with a full budget.
func TestAlgorithmChangeAcrossKindsSweepKeepsQuietKeys(t *testing.T) {
	c := newCrossTable(t, true)
	c.set(Rule{Algorithm: TokenBucket, Limit: 10, Period: time.Hour}, ruleT0)
	c.check(crossKey, ruleT0, 8)
	c.set(Rule{Algorithm: FixedWindow, Limit: 10, Period: 24 * time.Hour}, ruleT0)
	later := ruleT0 + int64(time.Minute)
	if n := c.tb.Sweep(0, later); n != 0 {
		t.Fatalf("Sweep a minute after the change dropped %d states", n)
	}
	if d := c.check(crossKey, later, 0); d.Remaining != 2 {
		t.Fatalf("after the sweep: %+v, want 2 left", d)
	}
	// Once the window it was carried into is over, it goes.
	if n := c.tb.Sweep(0, ruleT0+int64(4*24*time.Hour)); n != 1 || c.tb.Len() != 0 {
		t.Fatalf("days later Sweep dropped %d, kept %d; want 1 and 0", n, c.tb.Len())
	}
}

// A group that fails decides its items without writing: a key's state
// found under another kind's bucket stays there, and nothing is stored
// under the new bucket, so the next check carries it once (no copy left
// behind to be met stale later).
func TestAlgorithmChangeAcrossKindsGroupDenied(t *testing.T) {
	for _, to := range []Algorithm{SlidingLog, FixedWindow, GCRA} {
		t.Run(to.String(), func(t *testing.T) {
			c := newCrossTable(t, true)
			from := TokenBucket
			if lifeKind(to) == lifeTAT {
				from = SlidingLog
			}
			c.set(Rule{Algorithm: from, Limit: 10, Period: time.Hour}, ruleT0)
			const spent = crossKey + 1 // every unit spent: denied after the change too
			c.check(crossKey, ruleT0, 8)
			c.check(spent, ruleT0, 10)
			c.set(Rule{Algorithm: to, Limit: 10, Period: time.Hour}, ruleT0)
			items := []Item{
				{Part: 0, Bucket: c.bucket(crossKey), Rule: &c.r, Cost: 1},
				{Part: 0, Bucket: c.bucket(spent), Rule: &c.r, Cost: 1},
			}
			out := make([]Decision, len(items))
			ok, err := c.tb.CheckGroup(items, ruleT0, out)
			if err != nil || ok {
				t.Fatalf("group: %v, %v; want denied", ok, err)
			}
			if out[0].Remaining != 2 || out[1].Allowed {
				t.Fatalf("group decisions %+v", out)
			}
			if c.tb.Holds(0, c.bucket(crossKey)) || c.tb.Holds(0, c.bucket(spent)) || c.tb.Len() != 2 {
				t.Fatalf("a denied group wrote: %d states", c.tb.Len())
			}
			if d := c.check(crossKey, ruleT0, 2); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("after the group: %+v, want the 2 left spent", d)
			}
			if c.tb.Len() != 2 {
				t.Fatalf("%d states held, want 2", c.tb.Len())
			}
		})
	}
}

// A group that fails leaves a log found under the old bucket as it was,
// though carrying it converts it in place first (its period changed
// before its algorithm did): decided twice and then checked, the key
// converts once. (Carried without altState's copy, the log was converted
// in place at each decision, its admissions an hour later each time: 2
// left instead of 7.)
func TestAlgorithmChangeAcrossKindsGroupLeavesOldLogAlone(t *testing.T) {
	const half = int64(30 * time.Minute)
	c := newCrossTable(t, true)
	c.set(Rule{Algorithm: SlidingLog, Limit: 10, Period: time.Hour}, ruleT0)
	c.check(crossKey, ruleT0, 8)
	c.check(crossKey+1, ruleT0+half, 10) // none left after the changes: the group fails
	c.set(Rule{Algorithm: SlidingLog, Limit: 10, Period: 2 * time.Hour}, ruleT0+half)
	c.set(Rule{Algorithm: GCRA, Limit: 10, Period: time.Hour}, ruleT0+half)
	items := []Item{
		{Part: 0, Bucket: c.bucket(crossKey), Rule: &c.r, Cost: 1},
		{Part: 0, Bucket: c.bucket(crossKey + 1), Rule: &c.r, Cost: 1},
	}
	out := make([]Decision, len(items))
	if ok, err := c.tb.CheckGroup(items, ruleT0+half, out); ok || err != nil {
		t.Fatalf("group: %v, %v; want denied", ok, err)
	}
	// 8 admitted at t0, 6 minutes each under GCRA: 18 minutes owed at
	// t0+30m, 7 tokens left.
	if d := c.check(crossKey, ruleT0+half, 0); d.Remaining != 7 {
		t.Fatalf("after the group: %+v, want 7 left", d)
	}
}

// A bucket read as admissions at the latest instants its debt allows and
// replayed into a bucket of the same rate comes back as it was: nothing
// is lost or added on the way through another kind but the rounding of
// whole units, which the instant of the oldest takes up.
func TestTATAdmissionsRoundTrip(t *testing.T) {
	r := Rule{Name: "x", Algorithm: GCRA, Limit: 10, Period: time.Second}
	iv := r.interval()
	for _, debt := range []int64{1, iv - 1, iv, iv + 1, 5*iv - 7, 10 * iv} {
		at := ruleT0
		g := tatAdmissions(TAT(at+debt), iv, at)
		if n := g[0].n + g[1].n; n != (debt+iv-1)/iv {
			t.Errorf("debt %d: %d units, want ⌈debt/interval⌉", debt, n)
		}
		if got := replayTAT(g[:], &r, at); got != TAT(at+debt) {
			t.Errorf("debt %d: replayed to a debt of %d", debt, int64(got)-at)
		}
	}
}

// trimLog keeps the latest MaxLogLimit units, so that a converted log
// still travels (a stream holds no more), and no log rule decides
// differently.
func TestTrimLog(t *testing.T) {
	var l Log
	l.push(logEntry{exp: 10, cost: 3}, MaxLogLimit)
	l.push(logEntry{exp: 20, cost: MaxLogLimit - 1}, MaxLogLimit)
	l.push(logEntry{exp: 30, cost: 2}, MaxLogLimit)
	l.trimLog()
	if l.sum != MaxLogLimit || l.n != 2 || l.at(0) != (logEntry{20, MaxLogLimit - 2}) || l.at(1) != (logEntry{30, 2}) {
		t.Fatalf("trimmed to sum %d: %+v %+v (%d entries)", l.sum, l.at(0), l.at(1), l.n)
	}
}

// admOracle is a rule as API.md words it, deciding from a list of
// admissions (times and costs, in time order) instead of a state: a key
// of the rule that saw them. A rate rule's debt from the admissions up to
// capAt is capped at its capacity there (what a key of it can owe), as a
// converted state's is at the change; the later ones are added as they
// come, whether or not they would pass (forced).
type admOracle struct {
	r     *Rule
	adms  []changeAdmission
	capAt int64
}

func (o *admOracle) add(at, cost int64) {
	o.adms = append(o.adms, changeAdmission{at: at, cost: cost})
}

func (o *admOracle) allowed(now, cost int64) bool {
	r, p, want := o.r, int64(o.r.Period), max(cost, 1)
	switch {
	case r.Algorithm.tat():
		t, tau := r.interval(), r.Capacity()*r.interval()
		tat, capped := int64(math.MinInt64), false
		for _, a := range o.adms {
			if !capped && a.at > o.capAt {
				tat, capped = min(tat, o.capAt+tau), true
			}
			tat = max(tat, a.at) + a.cost*t
		}
		if !capped {
			tat = min(tat, o.capAt+tau)
		}
		return max(tat, now)-now+want*t <= tau
	case r.Algorithm == SlidingLog:
		sum := int64(0)
		for _, a := range o.adms {
			if a.at+p > now {
				sum += a.cost
			}
		}
		return sum+want <= r.Limit
	}
	start := alignDown(now, p)
	prev, cur := int64(0), int64(0)
	for _, a := range o.adms {
		switch w := alignDown(a.at, p); {
		case w == start:
			cur += a.cost
		case w == start-p:
			prev += a.cost
		}
	}
	if r.Algorithm == FixedWindow {
		return cur+want <= r.Limit
	}
	return prev*(p-(now-start))+(cur+want)*p <= r.Limit*p
}

// counted returns the admissions of adms (one key's, in time order) that
// the state of rule r still holds at at, as API.md words them: a log's of
// the last period, a fixed window's of its current window, a sliding
// window's of its current and previous windows, and for a bucket the
// latest ⌈debt/interval⌉ units of cost (the debt computed from adms
// alone), at the instants they were admitted.
func counted(r *Rule, adms []changeAdmission, at int64) []changeAdmission {
	p := int64(r.Period)
	var out []changeAdmission
	if r.Algorithm.tat() {
		t := r.interval()
		tat := int64(math.MinInt64)
		for _, a := range adms {
			tat = max(tat, a.at) + a.cost*t
		}
		d := tat - at
		if d <= 0 {
			return nil
		}
		u := (d + t - 1) / t
		for i := len(adms) - 1; i >= 0 && u > 0; i-- {
			a := adms[i]
			a.cost = min(a.cost, u)
			u -= a.cost
			out = append([]changeAdmission{a}, out...)
		}
		return out
	}
	for _, a := range adms {
		keep := false
		switch r.Algorithm {
		case SlidingLog:
			keep = a.at+p > at
		case FixedWindow:
			keep = alignDown(a.at, p) == alignDown(at, p)
		default:
			keep = alignDown(a.at, p) >= alignDown(at, p)-p
		}
		if keep {
			out = append(out, a)
		}
	}
	return out
}

// Random rules of two kinds of state, random traffic on a key, and a
// change from one to the other at a random moment. After it, every check
// the table admits is one the new rule admits to a key that saw the
// admissions the old state still counted (at the instants they were
// made) and then those the table admitted since (lo): the table never
// admits more than the new rule alone would. And every check that a key
// would pass which saw all those counted admissions at the change itself
// (hi) passes: the conversion is conservative by no more than that (a
// window's admissions are placed at its latest, a bucket's debt is read
// as whole units at the latest instants it allows). From a log the
// admissions' instants are known and the table decides exactly as lo.
// Decisions never wait longer than the new rule can say, and waiting
// RetryAfter lets the same check pass.
func TestAlgorithmChangeAcrossKindsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pair := rapid.SampledFrom(crossPairs()).Draw(t, "pair")
		r1, r2 := drawTableRule(t, pair[0]), drawTableRule(t, pair[1])
		r1.Name, r1.Version, r2.Name, r2.Version = "x", 1, "x", 2
		tb := mustTable(t, 1)
		tb.SetSeed(crossSeed)
		bucket := func(r *Rule) uint64 { return BucketHash(crossKey, RuleSalt(crossSeed, r.Name, r.Algorithm)) }
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		if err := tb.SetRules(1, []Rule{*r1}, now); err != nil {
			t.Fatal(err)
		}
		var before []changeAdmission
		for range rapid.IntRange(0, 30).Draw(t, "before") {
			p := int64(r1.Period)
			now += rapid.SampledFrom([]int64{0, 1, p / 100, p / 7, p, 3 * p}).Draw(t, "gap")
			cost := rapid.Int64Range(0, r1.Capacity()).Draw(t, "cost")
			d, err := tb.Check(0, bucket(r1), r1, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed && cost > 0 {
				before = append(before, changeAdmission{at: now, cost: cost})
			}
		}
		at := now + rapid.Int64Range(0, int64(r1.Period)).Draw(t, "change")
		if err := tb.SetRules(2, []Rule{*r2}, at); err != nil {
			t.Fatal(err)
		}
		lo := &admOracle{r: r2, adms: counted(r1, before, at), capAt: at}
		hi := &admOracle{r: r2, capAt: at}
		for _, a := range lo.adms {
			if r1.Algorithm != SlidingLog {
				a.at = at
			}
			hi.adms = append(hi.adms, a)
		}
		now = at
		var retry *changeAdmission
		for i := range rapid.IntRange(1, 40).Draw(t, "after") {
			p := int64(r2.Period)
			cost := rapid.Int64Range(0, r2.Capacity()).Draw(t, "cost")
			again := retry != nil && rapid.Bool().Draw(t, "retry?")
			if again {
				now, cost = retry.at, retry.cost
			} else {
				now += rapid.SampledFrom([]int64{0, 1, p / 100, p / 7, p, 3 * p}).Draw(t, "gap")
			}
			retry = nil
			d, err := tb.Check(0, bucket(r2), r2, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			okLo, okHi := lo.allowed(now, cost), hi.allowed(now, cost)
			switch {
			case d.Allowed && !okLo:
				t.Fatalf("op %d: %v→%v: Check(%d, %d) admitted what the new rule denies a key that saw %v", i, r1.Algorithm, r2.Algorithm, now, cost, lo.adms)
			case !d.Allowed && okHi:
				t.Fatalf("op %d: %v→%v: Check(%d, %d) denied what the new rule admits to a key that saw all at the change: %v", i, r1.Algorithm, r2.Algorithm, now, cost, hi.adms)
			case r1.Algorithm == SlidingLog && d.Allowed != okLo:
				t.Fatalf("op %d: from a log, Check(%d, %d) = %+v, exactly %v", i, now, cost, d, okLo)
			case again && !d.Allowed:
				t.Fatalf("op %d: denied again after waiting RetryAfter: %+v", i, d)
			}
			if w := maxWait(r2); d.ResetAfter > w || d.RetryAfter > w || d.Delay > w || d.ResetAfter < 0 || d.RetryAfter < 0 {
				t.Fatalf("op %d: %v %d/%v burst %d: %+v waits over %v", i, r2.Algorithm, r2.Limit, r2.Period, r2.Burst, d, w)
			}
			switch {
			case d.Allowed && cost > 0:
				lo.add(now, cost)
				hi.add(now, cost)
			case !d.Allowed:
				retry = &changeAdmission{at: now + int64(d.RetryAfter), cost: cost}
			}
		}
		checkInvariants(t, tb)
	})
}

// A backup keeps the copy of a key's state the owner carried to another
// algorithm and removed (deltas do not remove), beside the carried one.
// A member that takes the key over after a crash, once the rule is back
// at its first algorithm, finds that stale copy under the rule's own
// bucket: the newer state under the other bucket wins, as it does on the
// owner. Was: the copy under the own bucket was carried, and the 4
// admitted under sliding_window were forgotten (7 left instead of 3).
func TestAlgorithmChangeBackAfterTakeOverCarriesTheNewestCopy(t *testing.T) {
	const ms = int64(time.Millisecond)
	rules := []Rule{
		{Name: "x", Version: 1, Algorithm: TokenBucket, Limit: 10, Period: time.Hour},
		{Name: "x", Version: 2, Algorithm: SlidingWindow, Limit: 10, Period: time.Hour},
		{Name: "x", Version: 3, Algorithm: TokenBucket, Limit: 10, Period: time.Hour},
	}
	bucket := func(r *Rule) uint64 { return BucketHash(crossKey, RuleSalt(crossSeed, r.Name, r.Algorithm)) }
	owner, backup, heir := mustTable(t, 1), mustTable(t, 1), mustTable(t, 1)
	for _, tb := range []*Table{owner, heir} {
		tb.SetSeed(crossSeed)
	}
	for i, r := range rules {
		at := ruleT0 + int64(i)*ms
		for _, tb := range []*Table{owner, heir} {
			if err := tb.SetRules(r.Version, []Rule{r}, at); err != nil {
				t.Fatal(err)
			}
		}
		if i == 2 {
			break // the owner crashes before the key is checked again
		}
		if d, err := owner.Check(0, bucket(&rules[i]), &rules[i], at, 3+int64(i)); err != nil || !d.Allowed {
			t.Fatalf("spending under %v: %+v, %v", r.Algorithm, d, err)
		}
		if _, err := backup.Import(0, owner.Export(nil, 0, at), at); err != nil {
			t.Fatal(err)
		}
	}
	now := ruleT0 + 2*ms
	if _, err := heir.Import(0, backup.Export(nil, 0, now), now); err != nil {
		t.Fatal(err)
	}
	if heir.Len() != 2 {
		t.Fatalf("the heir holds %d states, want the stale copy and the carried one", heir.Len())
	}
	d, err := heir.Check(0, bucket(&rules[2]), &rules[2], now, 0)
	if err != nil || d.Remaining != 3 {
		t.Fatalf("back at token_bucket on the heir: %+v, %v; want 3 left", d, err)
	}
	if heir.Len() != 1 {
		t.Fatalf("the heir holds %d states after the check, want 1", heir.Len())
	}
}

// A member that registered only the newest rule set (it started after
// the change) and then imports the states of a partition, whose stream
// brings the older set they were made under, looks for them under the
// buckets of that set's algorithms: the sets after an imported one are
// derived again (rederive). Was: the newest set's alts were those of its
// registration, none, and the key came back with a full budget.
func TestAlgorithmChangeFoundAfterImportOfAnOlderSet(t *testing.T) {
	for _, to := range []Algorithm{GCRA, SlidingWindow, SlidingLog} {
		t.Run(to.String(), func(t *testing.T) {
			old := Rule{Name: "x", Version: 1, Algorithm: TokenBucket, Limit: 10, Period: time.Hour}
			nr := Rule{Name: "x", Version: 2, Algorithm: to, Limit: 10, Period: time.Hour}
			bucket := func(r *Rule) uint64 { return BucketHash(crossKey, RuleSalt(crossSeed, r.Name, r.Algorithm)) }
			src, dst := mustTable(t, 1), mustTable(t, 1)
			src.SetSeed(crossSeed)
			dst.SetSeed(crossSeed)
			if err := src.SetRules(1, []Rule{old}, ruleT0); err != nil {
				t.Fatal(err)
			}
			src.Check(0, bucket(&old), &old, ruleT0, 8)
			if err := dst.SetRules(2, []Rule{nr}, ruleT0); err != nil {
				t.Fatal(err)
			}
			if _, err := dst.Import(0, src.Export(nil, 0, ruleT0), ruleT0); err != nil {
				t.Fatal(err)
			}
			if d, err := dst.Check(0, bucket(&nr), &nr, ruleT0, 0); err != nil || d.Remaining != 2 {
				t.Fatalf("after the import: %+v, %v; want 2 left", d, err)
			}
		})
	}
}

// A key whose state lies under the bucket of its rule's former algorithm
// is one the table holds (HoldsKey), within a kind and across: an owner
// at its key cap refuses only keys it does not hold, and such a key must
// reach the check that carries its state over. Was: Holds looked under
// the rule's own bucket alone, so at the cap every key of a rule whose
// algorithm had changed was refused as new.
func TestHoldsKeyFindsStatesUnderFormerAlgorithms(t *testing.T) {
	for _, to := range []Algorithm{GCRA, SlidingWindow, SlidingLog} {
		t.Run(to.String(), func(t *testing.T) {
			c := newCrossTable(t, true)
			c.set(Rule{Algorithm: TokenBucket, Limit: 10, Period: time.Hour}, ruleT0)
			c.check(crossKey, ruleT0, 8)
			c.set(Rule{Algorithm: to, Limit: 10, Period: time.Hour}, ruleT0)
			b := c.bucket(crossKey)
			if c.tb.Holds(0, b) {
				t.Fatal("Holds found the state under the new algorithm's bucket before any check")
			}
			if !c.tb.HoldsKey(0, b, c.r.Name) {
				t.Fatal("HoldsKey: the state under the former algorithm's bucket not found")
			}
			if c.tb.HoldsKey(0, c.bucket(crossKey+1), c.r.Name) {
				t.Fatal("HoldsKey: a key never checked is held")
			}
			if d := c.check(crossKey, ruleT0, 0); d.Remaining != 2 {
				t.Fatalf("after the change: %d left, want 2", d.Remaining)
			}
		})
	}
}
