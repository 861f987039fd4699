package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// alternate allows every other check the server sees and marks every
// fourth degraded, so that any whole run of 4k checks splits exactly.
func alternate(n int64, _ api.CheckRequest) api.Decision {
	return api.Decision{Allowed: n%2 == 0, Limit: 10, Degraded: n%4 == 0}
}

// benchJSON runs runBench with --json and decodes the report.
func benchJSON(t *testing.T, ctx context.Context, env map[string]string, args ...string) (int, benchReport, string) {
	t.Helper()
	code, out, errs := runCmd(ctx, runBench, env, append(args, "--json")...)
	var rep benchReport
	if out != "" {
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("bench --json printed %q: %v", out, err)
		}
	}
	return code, rep, errs
}

func TestBenchDuration(t *testing.T) {
	f := newFakeAPI(t)
	f.decide = alternate
	start := time.Now()
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--duration", "200ms", "--concurrency", "4")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if took < 200*time.Millisecond || took > 10*time.Second || rep.ElapsedSeconds < 0.2 {
		t.Errorf("bench --duration 200ms took %v (reported %.3fs)", took, rep.ElapsedSeconds)
	}
	if rep.Requests == 0 || rep.Errors != 0 {
		t.Errorf("requests %d, errors %d; want some and none (requests cut off at the end are no errors)", rep.Requests, rep.Errors)
	}
	// batch 1 = the single form; one decision per request.
	if rep.Checks != rep.Requests || f.batches.Load() != 0 {
		t.Errorf("checks %d for %d requests; %d batch requests sent", rep.Checks, rep.Requests, f.batches.Load())
	}
	if rep.Allowed+rep.Denied != rep.Checks {
		t.Errorf("allowed %d + denied %d != checks %d", rep.Allowed, rep.Denied, rep.Checks)
	}
	// The server alternates; only checks cut off at the end (at most one
	// per worker) can unbalance the split.
	if d := rep.Allowed - rep.Denied; d < -5 || d > 5 {
		t.Errorf("allowed %d, denied %d: not the server's alternation", rep.Allowed, rep.Denied)
	}
	if rep.RequestsPerSecond <= 0 || rep.LatencyMs.Max <= 0 || rep.LatencyMs.P50 > rep.LatencyMs.P99 || rep.LatencyMs.P99 > rep.LatencyMs.Max {
		t.Errorf("implausible rates/latency: %+v", rep)
	}
}

func TestBenchRequestsCap(t *testing.T) {
	f := newFakeAPI(t)
	f.decide = alternate
	code, rep, errs := benchJSON(t, context.Background(), nil,
		"--addr", f.addr, "--requests", "50", "--batch", "8", "--concurrency", "4", "--duration", "1m", "--dist", "zipf", "--keys", "10")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if rep.Requests != 50 || rep.Checks != 400 || rep.Errors != 0 {
		t.Errorf("requests %d checks %d errors %d, want 50 400 0", rep.Requests, rep.Checks, rep.Errors)
	}
	if f.requests.Load() != 50 || f.batches.Load() != 50 {
		t.Errorf("server saw %d requests (%d batches), want 50 batches", f.requests.Load(), f.batches.Load())
	}
	if rep.Allowed != 200 || rep.Denied != 200 || rep.Degraded != 100 {
		t.Errorf("allowed %d denied %d degraded %d, want 200 200 100", rep.Allowed, rep.Denied, rep.Degraded)
	}
	if rep.AllowedRatio != 0.5 || rep.DeniedRatio != 0.5 || rep.DegradedRatio != 0.25 {
		t.Errorf("ratios %v %v %v, want 0.5 0.5 0.25", rep.AllowedRatio, rep.DeniedRatio, rep.DegradedRatio)
	}
	if rep.ElapsedSeconds > 30 {
		t.Errorf("a 50-request run took %.1fs: the cap did not end it", rep.ElapsedSeconds)
	}
}

func TestBenchRoundRobin(t *testing.T) {
	a, b := newFakeAPI(t), newFakeAPI(t)
	env := map[string]string{"RINGLIMIT_ADDR": a.addr + ", " + b.srv.URL, "RINGLIMIT_REQUESTS": "40"}
	code, rep, errs := benchJSON(t, context.Background(), env, "--concurrency", "1")
	if code != 0 || rep.Requests != 40 {
		t.Fatalf("exit %d, %d requests; stderr: %s", code, rep.Requests, errs)
	}
	if na, nb := a.requests.Load(), b.requests.Load(); na != 20 || nb != 20 {
		t.Errorf("one worker over two targets sent %d and %d requests, want 20 and 20", na, nb)
	}
	if len(rep.Config.Targets) != 2 {
		t.Errorf("targets %q", rep.Config.Targets)
	}
}

func TestBenchErrorsAreCountedNotFatal(t *testing.T) {
	f := newFakeAPI(t)
	f.failEvery = 3 // requests 1, 4, 7, … fail
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--requests", "30", "--concurrency", "3")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if rep.Errors != 10 || rep.Requests != 20 || rep.Checks != 20 {
		t.Errorf("errors %d requests %d checks %d, want 10 20 20", rep.Errors, rep.Requests, rep.Checks)
	}
	if len(rep.ErrorKinds) != 1 || rep.ErrorKinds["unavailable (503): no leader"] != 10 {
		t.Errorf("error kinds %v", rep.ErrorKinds)
	}

	// The text form lists them too.
	f.requests.Store(0)
	code, out, _ := runCmd(context.Background(), runBench, nil, "--addr", f.addr, "--requests", "30", "--concurrency", "3")
	if code != 0 || !strings.Contains(out, "errors     10") || !strings.Contains(out, "10× unavailable (503): no leader") {
		t.Errorf("exit %d, text report:\n%s", code, out)
	}
}

func TestBenchAllFail(t *testing.T) {
	f := newFakeAPI(t)
	f.failEvery = 1
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--requests", "12", "--concurrency", "2")
	if code != 2 || rep.Errors != 12 || rep.Requests != 0 || !strings.Contains(errs, "all 12 requests failed") {
		t.Errorf("exit %d, errors %d, requests %d, stderr %q", code, rep.Errors, rep.Requests, errs)
	}
	// Without a cap the run still ends at --duration.
	code, _, _ = benchJSON(t, context.Background(), nil, "--addr", "127.0.0.1:1", "--duration", "200ms")
	if code != 2 {
		t.Errorf("against a closed port: exit %d, want 2", code)
	}
}

func TestBenchContextCancel(t *testing.T) {
	f := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	f.onRequest = func() {
		if f.requests.Load() >= 10 {
			once.Do(cancel) // as SIGINT would
		}
	}
	start := time.Now()
	code, rep, errs := benchJSON(t, ctx, nil, "--addr", f.addr, "--duration", "10m", "--concurrency", "2")
	if code != 0 || rep.Requests < 9 || rep.Errors != 0 {
		t.Errorf("exit %d, requests %d, errors %d; stderr %s", code, rep.Requests, rep.Errors, errs)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("bench took %v to stop after cancel", took)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--dist", "pareto"},
		{"--batch", "0"},
		{"--batch", "1001"},
		{"--duration", "11m"},
		{"--duration", "0s"},
		{"--concurrency", "0"},
		{"--keys", "0"},
		{"--requests", "-1"},
		{"--cost", "-1"},
		{"--addr", " , "},
		{"--rule", ""},
		{"--nope"},
	} {
		code, out, errs := runCmd(context.Background(), runBench, nil, args...)
		if code != 2 || out != "" || errs == "" {
			t.Errorf("bench %q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// recorder is a checkFunc that counts the keys it is asked about.
type recorder struct {
	mu   sync.Mutex
	keys map[string]int // guarded by mu
	reqs int            // guarded by mu
}

func (r *recorder) check(_ context.Context, checks []api.CheckRequest) ([]api.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs++
	if r.keys == nil {
		r.keys = map[string]int{}
	}
	for _, c := range checks {
		r.keys[c.Key]++
	}
	return make([]api.Decision, len(checks)), nil
}

func loadCfg(keys int, zipf bool, requests int64) loadConfig {
	return loadConfig{Rule: "r", Keys: keys, Zipf: zipf, Seed: 7, Concurrency: 4, Batch: 10,
		Duration: time.Minute, Requests: requests, Cost: 1}
}

func TestLoadKeyDistribution(t *testing.T) {
	const keys = 100
	for _, zipf := range []bool{false, true} {
		var r recorder
		res := runLoad(context.Background(), loadCfg(keys, zipf, 2000), []checkFunc{r.check})
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
		runLoad(context.Background(), cfg, []checkFunc{func(_ context.Context, cs []api.CheckRequest) ([]api.Decision, error) {
			for _, c := range cs {
				keys = append(keys, c.Key)
			}
			return make([]api.Decision, len(cs)), nil
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
	// Past benchKeyTable the names are made on the fly.
	var r recorder
	cfg := loadCfg(benchKeyTable*3, false, 100)
	runLoad(context.Background(), cfg, []checkFunc{r.check})
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
	res := runLoad(context.Background(), loadCfg(10, false, 40), []checkFunc{func(_ context.Context, cs []api.CheckRequest) ([]api.Decision, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch calls % 4 {
		case 0:
			return nil, errors.New("boom")
		case 1:
			return make([]api.Decision, len(cs)-1), nil
		}
		return []api.Decision{}, nil
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
		var h, other histogram
		vals := make([]time.Duration, n)
		for i := range vals {
			// log-uniform from 1ns to ~10s
			vals[i] = time.Duration(math.Exp2(rng.Float64() * 33))
			if i%2 == 0 {
				h.record(vals[i])
			} else {
				other.record(vals[i])
			}
		}
		h.merge(&other)
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
			want := vals[int(float64(n)*q+0.999999)-1]
			got := h.quantile(q)
			if got < want || float64(got) > float64(want)*(1+1.0/histSub) {
				t.Errorf("n=%d: quantile(%v) = %v, want %v within %.1f%%", n, q, got, want, 100.0/histSub)
			}
		}
		if h.max != vals[n-1] || h.n != uint64(n) {
			t.Errorf("n=%d: max %v count %d", n, h.max, h.n)
		}
	}
	var empty histogram
	if empty.quantile(0.5) != 0 || empty.mean() != 0 {
		t.Error("empty histogram: nonzero quantile or mean")
	}
}
