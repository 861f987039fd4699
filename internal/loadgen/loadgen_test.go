package loadgen

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// recorder is a CheckFunc that counts the keys it is asked about.
type recorder struct {
	mu   sync.Mutex
	keys map[string]int // guarded by mu
	reqs int            // guarded by mu
}

func (r *recorder) check(_ context.Context, checks []api.CheckRequest, _ []api.Decision) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs++
	if r.keys == nil {
		r.keys = map[string]int{}
	}
	for _, c := range checks {
		r.keys[c.Key]++
	}
	return len(checks), nil
}

func loadCfg(keys int, zipf bool, requests int64) Config {
	return Config{Rule: "r", Keys: keys, Zipf: zipf, Seed: 7, Concurrency: 4, Batch: 10,
		Duration: time.Minute, Requests: requests, Cost: 1}
}

func TestLoadKeyDistribution(t *testing.T) {
	const keys = 100
	for _, zipf := range []bool{false, true} {
		var r recorder
		res := Run(context.Background(), loadCfg(keys, zipf, 2000), []CheckFunc{r.check})
		if res.Requests != 2000 || res.Checks != 20000 || r.reqs != 2000 {
			t.Fatalf("zipf=%v: %d requests, %d checks, %d seen", zipf, res.Requests, res.Checks, r.reqs)
		}
		count := func(i int) int { return r.keys["key-"+strconv.Itoa(i)] }
		total := 0
		for i := range keys {
			total += count(i)
		}
		if total != 20000 || len(r.keys) > keys {
			t.Fatalf("zipf=%v: %d checks over %d names; some outside key-0…key-%d", zipf, total, len(r.keys), keys-1)
		}
		if zipf {
			// P(0)/P(50) = 51^1.1 ≈ 75 for s=1.1, v=1.
			if count(0) < 10*max(count(50), 1) || count(0) < count(1) {
				t.Errorf("zipf: key-0 %d, key-1 %d, key-50 %d: not skewed", count(0), count(1), count(50))
			}
		} else {
			for i := range keys {
				if c := count(i); c < 100 || c > 300 { // expected 200
					t.Errorf("uniform: key-%d chosen %d times of 20000", i, c)
				}
			}
		}
	}
}

func TestLoadSeedIsDeterministic(t *testing.T) {
	seq := func(seed uint64) []string {
		var keys []string
		cfg := loadCfg(1000, true, 20)
		cfg.Concurrency, cfg.Seed = 1, seed
		Run(context.Background(), cfg, []CheckFunc{func(_ context.Context, cs []api.CheckRequest, _ []api.Decision) (int, error) {
			for _, c := range cs {
				keys = append(keys, c.Key)
			}
			return len(cs), nil
		}})
		return keys
	}
	if a, b := seq(1), seq(1); !slices.Equal(a, b) {
		t.Error("the same seed gave two key sequences")
	}
	if a, b := seq(1), seq(2); slices.Equal(a, b) {
		t.Error("two seeds gave the same key sequence")
	}
}

func TestLoadManyKeysAndBadAnswers(t *testing.T) {
	// Past KeyTable the names are made on the fly.
	var r recorder
	cfg := loadCfg(KeyTable*3, false, 100)
	Run(context.Background(), cfg, []CheckFunc{r.check})
	for k := range r.keys {
		i, err := strconv.Atoi(strings.TrimPrefix(k, "key-"))
		if err != nil || i < 0 || i >= cfg.Keys {
			t.Fatalf("key %q", k)
		}
	}

	// A target answering the wrong number of decisions is an error, and a
	// failing target is retried, not fatal.
	calls := 0
	var mu sync.Mutex
	res := Run(context.Background(), loadCfg(10, false, 40), []CheckFunc{func(_ context.Context, cs []api.CheckRequest, _ []api.Decision) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch calls % 4 {
		case 0:
			return 0, errors.New("boom")
		case 1:
			return len(cs) - 1, nil
		}
		return 0, nil
	}})
	if res.Requests != 0 || res.Errors != 40 || res.ErrorKinds["boom"] != 10 || res.ErrorKinds["0 decisions for 10 checks"] != 20 {
		t.Errorf("requests %d errors %d kinds %v", res.Requests, res.Errors, res.ErrorKinds)
	}
}

// TestHistogramIndex checks the bucket layout: contiguous, monotone, and
// histUpper the last value of each bucket.
func TestHistogramIndex(t *testing.T) {
	for i := range histBuckets - 1 {
		u := histUpper(i)
		if histIndex(u) != i || histIndex(u+1) != i+1 {
			t.Fatalf("bucket %d: upper %d → %d, upper+1 → %d", i, u, histIndex(u), histIndex(u+1))
		}
	}
	if got := histIndex(1 << 62); got != histBuckets-1 {
		t.Errorf("histIndex(2^62) = %d, want the last bucket %d", got, histBuckets-1)
	}
}

// TestHistogramQuantiles compares the histogram with a sorted sample.
func TestHistogramQuantiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 10, 999, 20000} {
		var h, other Histogram
		vals := make([]time.Duration, n)
		for i := range vals {
			// log-uniform from 1ns to ~10s
			vals[i] = time.Duration(math.Exp2(rng.Float64() * 33))
			if i%2 == 0 {
				h.Record(vals[i])
			} else {
				other.Record(vals[i])
			}
		}
		h.Merge(&other)
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
			want := vals[int(float64(n)*q+0.999999)-1]
			got := h.Quantile(q)
			if got < want || float64(got) > float64(want)*(1+1.0/histSub) {
				t.Errorf("n=%d: quantile(%v) = %v, want %v within %.1f%%", n, q, got, want, 100.0/histSub)
			}
		}
		if h.max != vals[n-1] || h.n != uint64(n) {
			t.Errorf("n=%d: max %v count %d", n, h.max, h.n)
		}
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 {
		t.Error("empty Histogram: nonzero quantile or mean")
	}
}

// TestRatePaces checks that a paced run makes about Rate calls per second
// and that an unpaced one makes more.
func TestRatePaces(t *testing.T) {
	var n atomic.Int64
	f := func(_ context.Context, cs []api.CheckRequest, _ []api.Decision) (int, error) {
		n.Add(1)
		return len(cs), nil
	}
	cfg := Config{Rule: "r", Keys: 10, Seed: 1, Concurrency: 4, Batch: 1, Duration: 300 * time.Millisecond, Cost: 1, Rate: 200}
	res := Run(context.Background(), cfg, []CheckFunc{f})
	// 200/s for 0.3s: 60 calls, on a schedule; a loaded machine may lag.
	if res.Requests < 20 || res.Requests > 64 {
		t.Errorf("paced at 200/s for 300ms: %d calls, want about 60", res.Requests)
	}
}

// TestDecisionsInWorkerBuffer checks the CheckFunc contract: ds has one
// zeroed slot per check at every call, and what the target writes there
// is what is counted.
func TestDecisionsInWorkerBuffer(t *testing.T) {
	f := func(_ context.Context, cs []api.CheckRequest, ds []api.Decision) (int, error) {
		if len(ds) != len(cs) {
			return 0, errors.New("ds and checks differ in length")
		}
		for i := range ds {
			if ds[i] != (api.Decision{}) {
				return 0, errors.New("ds not zeroed")
			}
			ds[i] = api.Decision{Allowed: i%2 == 0, Remaining: 7, Degraded: i == 0}
		}
		return len(cs), nil
	}
	cfg := loadCfg(10, false, 50) // 4 workers, 10 checks per call
	res := Run(context.Background(), cfg, []CheckFunc{f})
	if res.Errors != 0 || res.Requests != 50 || res.Checks != 500 || res.Allowed != 250 || res.Denied != 250 || res.Degraded != 50 {
		t.Errorf("errors %d (%v) requests %d checks %d allowed %d denied %d degraded %d, want 0 50 500 250 250 50",
			res.Errors, res.ErrorKinds, res.Requests, res.Checks, res.Allowed, res.Denied, res.Degraded)
	}
}

// TestKeyTable checks every name of the packed table against KeyName,
// across each change in the number of digits.
func TestKeyTable(t *testing.T) {
	for _, n := range []int{1, 9, 10, 11, 101, KeyTable} {
		kt := newKeyTable(n)
		total := 0
		for i := range n {
			if got, want := kt.name(i), KeyName(i); got != want {
				t.Fatalf("n=%d: name(%d) = %q, want %q", n, i, got, want)
			}
			total += len(KeyName(i))
		}
		if len(kt.names) != total {
			t.Fatalf("n=%d: %d bytes of names, want %d back to back", n, len(kt.names), total)
		}
	}
}

func TestDigits(t *testing.T) {
	for _, tc := range []struct{ i, want int }{
		{0, 1}, {9, 1}, {10, 2}, {99, 2}, {100, 3}, {999_999, 6}, {1_000_000, 7},
		{999_999_999_999_999_999, 18}, {1_000_000_000_000_000_000, 19}, {math.MaxInt, 19},
	} {
		if got := digits(tc.i); got != tc.want {
			t.Errorf("digits(%d) = %d, want %d", tc.i, got, tc.want)
		}
	}
}

// A run reports at least the duration it ran for: its clock starts with
// its deadline, after the key table is built (a run with the largest
// table reported less than its duration, by the table's build time —
// with the old order this fails by milliseconds on every run).
func TestRunElapsedCoversDuration(t *testing.T) {
	target := func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		for i := range checks {
			ds[i].Allowed = true
		}
		return len(checks), nil
	}
	cfg := Config{Rule: "r", Keys: KeyTable, Seed: 1, Concurrency: 2, Batch: 1, Duration: 20 * time.Millisecond}
	res := Run(context.Background(), cfg, []CheckFunc{target})
	if res.Elapsed < cfg.Duration || res.Requests == 0 {
		t.Fatalf("elapsed %v with %d requests, want ≥ %v and some", res.Elapsed, res.Requests, cfg.Duration)
	}
}

// A paced run's ResponseTime counts from each call's scheduled send: the
// calls queued behind a stalled one waited, though each was answered at
// once (Latency, from send, omits that wait: coordinated omission).
func TestResponseTimeCountsTheWaitBehindALateCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		target := func(ctx context.Context, cs []api.CheckRequest, _ []api.Decision) (int, error) {
			if calls.Add(1) == 1 {
				time.Sleep(50 * time.Millisecond) // a stall, five intervals long
			}
			return len(cs), nil
		}
		cfg := Config{Rule: "r", Keys: 10, Seed: 1, Concurrency: 1, Batch: 1, Duration: 200 * time.Millisecond, Cost: 1, Rate: 100}
		res := Run(context.Background(), cfg, []CheckFunc{target})
		if res.Latency.Quantile(0.5) != 0 || res.Latency.Max() != 50*time.Millisecond {
			t.Fatalf("latency p50 %v max %v, want 0 and the 50ms stall", res.Latency.Quantile(0.5), res.Latency.Max())
		}
		// Calls due at 10, 20, 30 and 40ms were sent at 50ms.
		if got := res.ResponseTime.Count(); got != uint64(res.Requests) {
			t.Fatalf("%d response times for %d calls", got, res.Requests)
		}
		// Five of them ≥ 10ms: the stalled call and the four behind it.
		if q := res.ResponseTime.Quantile(1 - 4.5/float64(res.Requests)); q < 10*time.Millisecond {
			t.Fatalf("response time %v at the quantile of the 5th slowest of %d, want the queued calls ≥ 10ms", q, res.Requests)
		}
		// In the bubble, timers fire on time: no wake-up was late.
		if res.WakeLate.Count() == 0 || res.WakeLate.Max() != 0 {
			t.Fatalf("%d late wake-ups, the latest %v; want some, all on time", res.WakeLate.Count(), res.WakeLate.Max())
		}
		unpaced := Run(context.Background(), Config{Rule: "r", Keys: 10, Seed: 1, Concurrency: 1, Batch: 1, Requests: 3, Duration: time.Second, Cost: 1}, []CheckFunc{target})
		if unpaced.ResponseTime.Count() != 0 {
			t.Fatalf("an unpaced run has %d response times, want none", unpaced.ResponseTime.Count())
		}
	})
}

// A deadline that is not the run's end is the target's failure: counted
// as an error, and the worker goes on. Was: its worker returned without
// a word, and the row lost a caller for the rest of its time.
func TestATargetsOwnDeadlineIsAnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		target := func(ctx context.Context, cs []api.CheckRequest, _ []api.Decision) (int, error) {
			if calls.Add(1) == 1 {
				return 0, context.DeadlineExceeded
			}
			return len(cs), nil
		}
		cfg := Config{Rule: "r", Keys: 10, Seed: 1, Concurrency: 1, Batch: 1, Requests: 10, Duration: time.Second, Cost: 1}
		res := Run(context.Background(), cfg, []CheckFunc{target})
		if res.Errors != 1 || res.Requests != 9 {
			t.Fatalf("%d errors, %d requests; want 1 and 9", res.Errors, res.Requests)
		}
	})
}
