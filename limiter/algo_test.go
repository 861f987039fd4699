package limiter

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

const sec = int64(time.Second)

func mustRule(t testing.TB, r Rule) *Rule {
	t.Helper()
	if err := r.Validate(); err != nil {
		t.Fatalf("rule %+v: %v", r, err)
	}
	return &r
}

// stepper runs one algorithm on one key with whatever state it needs.
type stepper struct {
	r   *Rule
	tat TAT
	win Window
	log Log
}

func (s *stepper) step(now, cost int64) Decision {
	var d Decision
	switch {
	case s.r.Algorithm.tat():
		s.tat, d = StepTAT(s.tat, s.r, now, cost)
	case s.r.Algorithm.window():
		s.win, d = StepWindow(s.win, s.r, now, cost)
	default:
		d = s.log.Step(s.r, now, cost)
	}
	return d
}

// clone copies the stepper so a probe does not disturb the original.
func (s *stepper) clone() *stepper {
	c := *s
	c.log.exps = append([]int64(nil), s.log.exps...)
	if s.log.costs != nil {
		c.log.costs = append([]uint16(nil), s.log.costs...)
	}
	return &c
}

type row struct {
	at      time.Duration
	cost    int64
	allowed bool
	remain  int64
	retry   time.Duration
}

func runRows(t *testing.T, r Rule, start int64, rows []row) {
	t.Helper()
	s := &stepper{r: mustRule(t, r)}
	for i, w := range rows {
		d := s.step(start+int64(w.at), w.cost)
		if d.Allowed != w.allowed || d.Remaining != w.remain || d.RetryAfter != w.retry {
			t.Errorf("%s row %d: step(%v, %d) = allowed %v remaining %d retry %v, want %v %d %v",
				r.Algorithm, i, w.at, w.cost, d.Allowed, d.Remaining, d.RetryAfter, w.allowed, w.remain, w.retry)
		}
	}
}

func TestTokenBucketSteps(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		runRows(t, Rule{Name: "r", Algorithm: a, Limit: 10, Period: time.Second, Burst: 3}, 1000*sec, []row{
			{0, 1, true, 2, 0},
			{0, 2, true, 0, 0},
			{0, 1, false, 0, 100 * time.Millisecond},
			{0, 0, false, 0, 100 * time.Millisecond}, // a query spends nothing
			{100 * time.Millisecond, 1, true, 0, 0},
			{150 * time.Millisecond, 3, false, 0, 250 * time.Millisecond},
			{400 * time.Millisecond, 3, true, 0, 0},
			{10 * time.Second, 0, true, 3, 0},
			{10 * time.Second, 4 - 1, true, 0, 0},
			{9 * time.Second, 1, false, 0, 1100 * time.Millisecond}, // time went back: clamped, never more
		})
	}
}

func TestFixedWindowSteps(t *testing.T) {
	runRows(t, Rule{Name: "r", Algorithm: FixedWindow, Limit: 3, Period: time.Minute}, 60*sec, []row{
		{0, 2, true, 1, 0},
		{30 * time.Second, 2, false, 1, 30 * time.Second},
		{30 * time.Second, 1, true, 0, 0},
		{59 * time.Second, 0, false, 0, time.Second},
		{60 * time.Second, 3, true, 0, 0},
	})
}

func TestSlidingLogSteps(t *testing.T) {
	runRows(t, Rule{Name: "r", Algorithm: SlidingLog, Limit: 3, Period: time.Minute}, 0, []row{
		{0, 1, true, 2, 0},
		{10 * time.Second, 2, true, 0, 0},
		{20 * time.Second, 1, false, 0, 40 * time.Second},
		{59 * time.Second, 2, false, 0, 11 * time.Second},
		{60 * time.Second, 1, true, 0, 0},
		{70 * time.Second, 3, false, 2, 50 * time.Second}, // the 10s entry left at 70s
	})
}

// The worked example of the background article: capacity 100, refill
// 10/s, a full bucket; 150 requests at once, then 20 requests/s.
func TestWorkedTokenBucketExample(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			s := &stepper{r: mustRule(t, Rule{Name: "w", Algorithm: a, Limit: 10, Period: time.Second, Burst: 100})}
			now := 1_700_000_000 * sec
			admitted, denied := 0, 0
			var firstDenial Decision
			for range 150 {
				d := s.step(now, 1)
				if d.Allowed {
					admitted++
				} else {
					if denied == 0 {
						firstDenial = d
					}
					denied++
				}
			}
			if admitted != 100 || denied != 50 {
				t.Fatalf("burst of 150: admitted %d denied %d, want 100 and 50", admitted, denied)
			}
			if firstDenial.RetryAfter != 100*time.Millisecond {
				t.Fatalf("first denial RetryAfter = %v, want 100ms", firstDenial.RetryAfter)
			}
			// Then 20 requests per second for 10 seconds: 10 admitted each second.
			for second := range 10 {
				ok := 0
				for i := range 20 {
					at := now + int64(second)*sec + int64(i+1)*sec/20
					if s.step(at, 1).Allowed {
						ok++
					}
				}
				if ok != 10 {
					t.Fatalf("second %d at 20 req/s: admitted %d, want 10", second, ok)
				}
			}
		})
	}
}

// The boundary burst: 100/min, 100 requests at 0:59 and 100 at 1:01.
func TestBoundaryBurst(t *testing.T) {
	count := func(a Algorithm) int {
		s := &stepper{r: mustRule(t, Rule{Name: "b", Algorithm: a, Limit: 100, Period: time.Minute})}
		n := 0
		for _, at := range []int64{59 * sec, 61 * sec} {
			for range 100 {
				if s.step(at, 1).Allowed {
					n++
				}
			}
		}
		return n
	}
	if got := count(FixedWindow); got != 200 {
		t.Errorf("fixed_window admitted %d in 2s, want 200 (the boundary burst)", got)
	}
	// At 1:01 the estimate is 100 × 59/60 + current = 98.33 + current, so
	// exactly one more request fits: 101.
	if got := count(SlidingWindow); got != 101 {
		t.Errorf("sliding_window admitted %d in 2s, want exactly 101", got)
	}
	if got := count(SlidingLog); got != 100 {
		t.Errorf("sliding_log admitted %d in 2s, want 100", got)
	}
}

func TestValidate(t *testing.T) {
	ok := Rule{Name: "ok", Algorithm: TokenBucket, Limit: 10, Period: time.Second}
	tests := []struct {
		edit  func(*Rule)
		field string
	}{
		{func(r *Rule) { r.Name = "" }, "name"},
		{func(r *Rule) { r.Name = "a b" }, "name"},
		{func(r *Rule) { r.Algorithm = 0 }, "algorithm"},
		{func(r *Rule) { r.Limit = 0 }, "limit"},
		{func(r *Rule) { r.Limit = MaxLimit + 1 }, "limit"},
		{func(r *Rule) { r.Period = 0 }, "period"},
		{func(r *Rule) { r.Period = -time.Second }, "period"},
		{func(r *Rule) { r.Burst = -1 }, "burst"},
		{func(r *Rule) { r.Limit, r.Period = 2_000_000, time.Second }, "limit"},
		{func(r *Rule) { r.Limit, r.Burst, r.Period = 1, MaxLimit, MaxPeriod }, "burst"},
		{func(r *Rule) { r.Algorithm, r.Burst = FixedWindow, 20 }, "burst"},
		{func(r *Rule) { r.Algorithm, r.Limit = SlidingLog, MaxLogLimit+1 }, "limit"},
		{func(r *Rule) { r.FailureMode = 7 }, "failure_mode"},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid rule: %v", err)
	}
	for i, tt := range tests {
		r := ok
		tt.edit(&r)
		err := r.Validate()
		fe, isField := err.(*FieldError)
		if !isField || fe.Field != tt.field {
			t.Errorf("case %d: Validate() = %v, want a FieldError on %q", i, err, tt.field)
		}
	}
	r := ok
	r.Algorithm, r.Limit = SlidingLog, MaxLogLimit+1
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "sliding_window") {
		t.Errorf("oversized sliding_log: %v, want a pointer to sliding_window", err)
	}
}

// genRule draws a valid rule of algorithm a with small numbers, so that
// random arrivals hit both sides of the limit.
func genRule(t *rapid.T, a Algorithm) *Rule {
	r := Rule{Name: "p", Algorithm: a,
		Limit:  rapid.Int64Range(1, 20).Draw(t, "limit"),
		Period: time.Duration(rapid.Int64Range(1, 5000).Draw(t, "periodMs")) * time.Millisecond,
	}
	if a.tat() {
		r.Burst = rapid.Int64Range(0, 30).Draw(t, "burst")
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("generated rule %+v: %v", r, err)
	}
	return &r
}

type arrival struct{ at, cost int64 }

// genArrivals draws non-decreasing arrival times with costs in [0, capacity].
func genArrivals(t *rapid.T, r *Rule) []arrival {
	n := rapid.IntRange(1, 200).Draw(t, "n")
	now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
	out := make([]arrival, n)
	for i := range out {
		now += rapid.SampledFrom([]int64{0, 0, 1, int64(r.Period) / 100, int64(r.Period) / 7, int64(r.Period)}).Draw(t, "gap")
		out[i] = arrival{now, rapid.Int64Range(0, r.Capacity()).Draw(t, "cost")}
	}
	return out
}

// oracleBucket is a token bucket written the textbook way: tokens kept in
// units of 1/T (nanoseconds of refill), refilled lazily.
type oracleBucket struct {
	level, last int64
	fresh       bool
}

func (o *oracleBucket) allow(r *Rule, now, cost int64) bool {
	t := r.interval()
	capacity := r.Capacity() * t
	if !o.fresh {
		o.level, o.last, o.fresh = capacity, now, true
	}
	if now > o.last {
		o.level = min(capacity, o.level+(now-o.last))
		o.last = now
	}
	want := max(cost, 1) * t
	if o.level < want {
		return false
	}
	o.level -= cost * t
	return true
}

func TestTokenBucketAgreesWithGCRAAndOracle(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tb := genRule(t, TokenBucket)
		g := *tb
		g.Algorithm = GCRA
		a, b := &stepper{r: tb}, &stepper{r: &g}
		var o oracleBucket
		for i, x := range genArrivals(t, tb) {
			da, db := a.step(x.at, x.cost), b.step(x.at, x.cost)
			if da != db {
				t.Fatalf("arrival %d: token_bucket %+v, gcra %+v", i, da, db)
			}
			if want := o.allow(tb, x.at, x.cost); da.Allowed != want {
				t.Fatalf("arrival %d (%+v): allowed %v, textbook bucket says %v", i, x, da.Allowed, want)
			}
		}
	})
}

// admittedWithin checks every interval [t_i, t_j] of admitted arrivals.
func checkIntervals(t *rapid.T, r *Rule, adm []arrival, bound func(span int64, sum int64) bool) {
	for i := range adm {
		sum := int64(0)
		for j := i; j < len(adm); j++ {
			sum += adm[j].cost
			if !bound(adm[j].at-adm[i].at, sum) {
				t.Fatalf("%s %+v admitted cost %d in [%d, %d] (span %v)", r.Algorithm, *r, sum, adm[i].at, adm[j].at, time.Duration(adm[j].at-adm[i].at))
			}
		}
	}
}

func admitted(s *stepper, arr []arrival) []arrival {
	var out []arrival
	for _, x := range arr {
		if s.step(x.at, x.cost).Allowed && x.cost > 0 {
			out = append(out, x)
		}
	}
	return out
}

func TestRateBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, rapid.SampledFrom([]Algorithm{TokenBucket, GCRA, LeakyBucket}).Draw(t, "alg"))
		adm := admitted(&stepper{r: r}, genArrivals(t, r))
		// sum ≤ burst + rate·span ⇔ (sum − burst)·Period ≤ span·Limit.
		checkIntervals(t, r, adm, func(span, sum int64) bool {
			return (sum-r.Capacity())*int64(r.Period) <= span*r.Limit
		})
	})
}

func TestSlidingLogWindowBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, SlidingLog)
		adm := admitted(&stepper{r: r}, genArrivals(t, r))
		checkIntervals(t, r, adm, func(span, sum int64) bool {
			return span >= int64(r.Period) || sum <= r.Limit
		})
	})
}

// A denied check retried exactly at now + RetryAfter passes; one
// nanosecond earlier it does not.
func TestRetryAfterIsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, rapid.SampledFrom([]Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog}).Draw(t, "alg"))
		s := &stepper{r: r}
		for i, x := range genArrivals(t, r) {
			probe := s.clone()
			d := s.step(x.at, x.cost)
			if d.Allowed {
				if d.RetryAfter != 0 {
					t.Fatalf("arrival %d allowed with RetryAfter %v", i, d.RetryAfter)
				}
				continue
			}
			if d.RetryAfter <= 0 {
				t.Fatalf("arrival %d denied with RetryAfter %v", i, d.RetryAfter)
			}
			at := x.at + int64(d.RetryAfter)
			if early := probe.clone(); early.step(at-1, x.cost).Allowed {
				t.Fatalf("arrival %d (%+v): denied, RetryAfter %v, but passes 1ns earlier", i, x, d.RetryAfter)
			}
			if !probe.step(at, x.cost).Allowed {
				t.Fatalf("arrival %d (%+v): denied, RetryAfter %v, still denied then", i, x, d.RetryAfter)
			}
		}
	})
}

// RetryAfter stays exact when the clock has gone back, across a window's
// start too. Was: sliding_window measured the wait from the start of the
// window its state was in, so a check denied before that start waited
// too little.
func TestRetryAfterIsExactAfterClockBack(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, rapid.SampledFrom(allAlgorithms).Draw(t, "alg"))
		s := &stepper{r: r}
		now := alignDown(1<<50, int64(r.Period)) + rapid.Int64Range(0, int64(r.Period)-1).Draw(t, "offset")
		for range rapid.IntRange(1, int(min(r.Capacity(), 50))).Draw(t, "warm") {
			s.step(now, 1)
		}
		at := now - rapid.Int64Range(1, int64(r.Period)).Draw(t, "back")
		cost := rapid.Int64Range(1, r.Capacity()).Draw(t, "cost")
		probe := s.clone()
		d := s.step(at, cost)
		if d.Allowed {
			return
		}
		then := at + int64(d.RetryAfter)
		if early := probe.clone(); early.step(then-1, cost).Allowed {
			t.Fatalf("denied at now−%v, RetryAfter %v, but passes 1ns earlier", time.Duration(now-at), d.RetryAfter)
		}
		if !probe.step(then, cost).Allowed {
			t.Fatalf("denied at now−%v, RetryAfter %v, still denied then", time.Duration(now-at), d.RetryAfter)
		}
	})
}

func TestLeakyBucketDelays(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, LeakyBucket)
		s := &stepper{r: r}
		iv := r.interval()
		lastRelease := int64(-1 << 62)
		for i, x := range genArrivals(t, r) {
			x.cost = min(x.cost, 1) // spacing is per unit; cost-1 requests
			d := s.step(x.at, max(x.cost, 1))
			if !d.Allowed {
				continue
			}
			if d.Delay < 0 || int64(d.Delay) > r.Capacity()*iv {
				t.Fatalf("arrival %d: delay %v outside [0, burst/rate = %v]", i, d.Delay, time.Duration(r.Capacity()*iv))
			}
			release := x.at + int64(d.Delay)
			if release-lastRelease < iv {
				t.Fatalf("arrival %d released %v after the previous one, want ≥ %v", i, time.Duration(release-lastRelease), time.Duration(iv))
			}
			if d.Delay > 0 && release-lastRelease != iv {
				t.Fatalf("arrival %d waited %v but was released %v after the previous, want exactly %v", i, d.Delay, time.Duration(release-lastRelease), time.Duration(iv))
			}
			lastRelease = release
		}
	})
}

// Time that runs backwards never admits more than time standing still.
func TestClockBackwardsIsClamped(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRule(t, rapid.SampledFrom([]Algorithm{TokenBucket, GCRA, LeakyBucket, SlidingLog}).Draw(t, "alg"))
		s := &stepper{r: r}
		now := int64(1 << 50)
		for range rapid.IntRange(0, 50).Draw(t, "warm") {
			s.step(now, 1)
		}
		back := rapid.Int64Range(1, int64(r.Period)).Draw(t, "back")
		a, b := s.clone(), s.clone()
		for i := range 3 * r.Capacity() {
			if a.step(now-back, 1).Allowed && !b.step(now, 1).Allowed {
				t.Fatalf("check %d: admitted at now-%v but not at now", i, time.Duration(back))
			}
		}
	})
}

func TestLogMemoryBounded(t *testing.T) {
	r := mustRule(t, Rule{Name: "l", Algorithm: SlidingLog, Limit: 50, Period: time.Minute})
	var l Log
	for i := range int64(10_000) {
		l.Step(r, i*int64(time.Millisecond), 1)
		if l.Len() > 50 || len(l.exps) > 50 {
			t.Fatalf("after %d checks the log holds %d entries in %d slots, limit 50", i+1, l.Len(), len(l.exps))
		}
	}
}

// Failures rapid once found (their .fail files were committed under
// testdata/rapid; they are these rows now).
func TestRapidRegressions(t *testing.T) {
	const ms = time.Millisecond
	// TestTokenBucketAgreesWithGCRAAndOracle and TestRetryAfterIsExact,
	// 2026-11-29: a query (cost 0) on a fresh key of 1 per ms was denied
	// with RetryAfter 0.
	t.Run("token bucket query on a fresh key", func(t *testing.T) {
		runRows(t, Rule{Name: "q", Algorithm: TokenBucket, Limit: 1, Period: ms}, 0, []row{
			{at: 0, cost: 0, allowed: true, remain: 1},
			{at: 0, cost: 1, allowed: true, remain: 0},
			{at: 0, cost: 0, allowed: false, remain: 0, retry: ms},
		})
	})
	// TestRetryAfterIsExact, 2026-11-29: sliding_window 1 per ms, spend
	// 1 at 0 between queries; the query after it was told 2.000001ms,
	// though it passes at 2ms (the window two periods on).
	t.Run("sliding window retry after a spent window", func(t *testing.T) {
		runRows(t, Rule{Name: "s", Algorithm: SlidingWindow, Limit: 1, Period: ms}, 0, []row{
			{at: 0, cost: 0, allowed: true, remain: 1},
			{at: 0, cost: 0, allowed: true, remain: 1},
			{at: 0, cost: 1, allowed: true, remain: 0},
			{at: 0, cost: 0, allowed: false, remain: 0, retry: 2 * ms},
			{at: 2*ms - 1, cost: 0, allowed: false, remain: 0, retry: 1},
			{at: 2 * ms, cost: 0, allowed: true, remain: 1},
		})
	})
}
