// Package loadgen is the load loop of `ringlimit bench` and of the
// side-by-side runs in bench/: N workers sending checks for keys drawn
// from a fixed key space (uniform or zipf) to check functions, each one
// call at a time, for a bounded time or number of calls, recording the
// latency of every call in a log-linear histogram.
//
// It knows nothing of the system under load: a CheckFunc is whatever
// sends one call of checks (ringlimit's HTTP API, its data plane, another
// rate limiter) and reports its decisions. Run is safe to call from
// several goroutines; a Histogram is not safe for concurrent use.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/pause"
)

// Bounds of a Config.
const (
	MaxDuration    = 10 * time.Minute
	MaxConcurrency = 1024
	MaxErrorKinds  = 8       // distinct error messages kept per worker
	KeyTable       = 100_000 // key names built once up to this many keys
)

// CheckFunc decides checks, in order, in one call to one target, writes
// the decision of checks[i] to ds[i] and returns how many decisions the
// target answered (an answer of another length than checks is counted
// as an error). ds has len(checks) and is zeroed before each call; both
// are the worker's, reused for its next call, so a CheckFunc keeps
// neither after it returns. The worker owning the buffers keeps the
// load loop's garbage out of the measurement: it belongs to no system.
type CheckFunc func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error)

// Config is what the load loop does.
type Config struct {
	Rule        string
	Keys        int // distinct keys, key-0 … key-<Keys-1>
	Zipf        bool
	Seed        uint64
	Concurrency int
	Batch       int // checks per call
	Duration    time.Duration
	Requests    int64 // cap on calls, answered or failed; 0 = none
	Cost        int64
	// Rate paces the calls of all workers together to this many per
	// second (each worker Rate/Concurrency, on a fixed schedule that
	// catches up when late); 0 = each worker calls again at once.
	Rate float64
}

// Validate checks the fields without changing them.
func (c Config) Validate() error {
	switch {
	case c.Rule == "":
		return errors.New("--rule: empty")
	case c.Keys < 1:
		return fmt.Errorf("--keys %d: must be ≥ 1", c.Keys)
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return fmt.Errorf("--concurrency %d: must be in 1…%d", c.Concurrency, MaxConcurrency)
	case c.Batch < 1 || c.Batch > api.MaxBatch:
		return fmt.Errorf("--batch %d: must be in 1…%d", c.Batch, api.MaxBatch)
	case c.Duration <= 0 || c.Duration > MaxDuration:
		return fmt.Errorf("--duration %v: must be in (0, %v]", c.Duration, MaxDuration)
	case c.Requests < 0:
		return fmt.Errorf("--requests %d: must be ≥ 0", c.Requests)
	case c.Cost < 0:
		return fmt.Errorf("--cost %d: must be ≥ 0", c.Cost)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("--rate %v: must be ≥ 0", c.Rate)
	}
	return nil
}

// Result is what the load loop measured. Requests counts answered calls;
// one that failed counts in Errors only; one cut off by the end of the
// run counts nowhere.
type Result struct {
	Elapsed                           time.Duration
	Requests, Errors                  int64
	Checks, Allowed, Denied, Degraded int64
	Latency                           Histogram // of answered calls, from send to answer
	// ResponseTime is, for a paced run (Rate > 0), each answered call's
	// time from its scheduled send to its answer: Latency plus the time
	// it waited behind a late call of its worker, which Latency omits
	// (coordinated omission), and the load generator's timer lateness.
	// Empty when unpaced.
	ResponseTime Histogram
	// WakeLate is, for a paced run, how late each worker that slept until
	// a call's scheduled send woke up: the load generator's (and the
	// machine's) share of ResponseTime, which a server cannot cause.
	WakeLate   Histogram
	ErrorKinds map[string]int64 // message → count; "(other)" past MaxErrorKinds
}

// Run runs cfg.Concurrency workers until cfg.Duration has passed,
// cfg.Requests calls were sent or ctx is done. Worker w starts at
// targets[w % len(targets)] and moves to the next target after each
// call. Workers keep going after errors (backing off up to 50ms while
// they persist). Memory is bounded: each worker owns a fixed-size
// histogram and at most MaxErrorKinds error messages.
func Run(ctx context.Context, cfg Config, targets []CheckFunc) Result {
	var names *keyTable
	if cfg.Keys <= KeyTable {
		names = newKeyTable(cfg.Keys)
	}
	var issued atomic.Int64
	workers := make([]worker, cfg.Concurrency)
	var wg sync.WaitGroup
	// The run's clock starts with its deadline, after the key table is
	// built: Elapsed is then never shorter than Duration for a run that
	// lasted it (it was, by the table's build time).
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	for i := range workers {
		w := &workers[i]
		w.id, w.errKinds = i, map[string]int64{}
		wg.Go(func() { w.run(ctx, cfg, targets, names, &issued, start) })
	}
	wg.Wait()
	res := Result{Elapsed: time.Since(start), ErrorKinds: map[string]int64{}}
	for i := range workers {
		w := &workers[i]
		res.Requests += w.requests
		res.Errors += w.errors
		res.Checks += w.checks
		res.Allowed += w.allowed
		res.Denied += w.denied
		res.Degraded += w.degraded
		res.Latency.Merge(&w.latency)
		res.ResponseTime.Merge(&w.response)
		res.WakeLate.Merge(&w.wakeLate)
		for k, n := range w.errKinds {
			res.ErrorKinds[k] += n
		}
	}
	return res
}

// KeyName is the name of key i.
func KeyName(i int) string { return "key-" + strconv.Itoa(i) }

// keyTable is KeyName(0) … KeyName(n-1) back to back in one string; the
// name of key i is found by arithmetic (the names of d digits are 4+d
// bytes each, in order), so a random pick reads one place in memory,
// the name's bytes, about 7 to a cache line. Names built one by one
// put a string header in a table and the bytes elsewhere on the heap: a
// pick missed the cache twice, in the load generator and in the system's
// client, and the GC scanned the table.
type keyTable struct {
	names string
	start [20]int // start[d]: offset of the first name of d digits
	first [20]int // first[d]: the first number of d digits (0 for d = 1)
}

func newKeyTable(n int) *keyTable {
	t := &keyTable{}
	b := make([]byte, 0, n*(4+len(strconv.Itoa(max(n-1, 0)))))
	for i := range n {
		if d := digits(i); i == 0 || d != digits(i-1) {
			t.start[d], t.first[d] = len(b), i
		}
		b = append(b, "key-"...)
		b = strconv.AppendInt(b, int64(i), 10)
	}
	t.names = string(b)
	return t
}

// name is KeyName(i), a substring of t.names.
func (t *keyTable) name(i int) string {
	d := digits(i)
	off := t.start[d] + (i-t.first[d])*(4+d)
	return t.names[off : off+4+d]
}

// digits is how many decimal digits i ≥ 0 has.
func digits(i int) int {
	d := 1
	for p := 10; i >= p && d < 19; p *= 10 { // 10^19 would overflow
		d++
	}
	return d
}

// worker is one worker's state; only its goroutine touches it until Run
// has waited for it.
type worker struct {
	id                                int
	requests, errors                  int64
	checks, allowed, denied, degraded int64
	latency, response, wakeLate       Histogram
	errKinds                          map[string]int64
}

func (w *worker) run(ctx context.Context, cfg Config, targets []CheckFunc, names *keyTable, issued *atomic.Int64, start time.Time) {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w.id)))
	pick := func() int { return rng.IntN(cfg.Keys) }
	if cfg.Zipf && cfg.Keys > 1 {
		z := rand.NewZipf(rng, 1.1, 1, uint64(cfg.Keys-1))
		pick = func() int { return int(z.Uint64()) }
	}
	var interval time.Duration // between this worker's calls when paced
	if cfg.Rate > 0 {
		interval = time.Duration(float64(cfg.Concurrency) / cfg.Rate * float64(time.Second))
	}
	// Spread the workers' schedules over one interval.
	due := start.Add(interval * time.Duration(w.id) / time.Duration(cfg.Concurrency))
	cost := cfg.Cost
	checks := make([]api.CheckRequest, cfg.Batch)
	ds := make([]api.Decision, cfg.Batch)
	next := w.id % len(targets)
	var backoff time.Duration
	end, _ := ctx.Deadline()
	for ctx.Err() == nil {
		if cfg.Requests > 0 && issued.Add(1) > cfg.Requests {
			return
		}
		for i := range checks {
			var key string
			if k := pick(); names != nil {
				key = names.name(k)
			} else {
				key = KeyName(k)
			}
			checks[i] = api.CheckRequest{Rule: cfg.Rule, Key: key, Cost: &cost}
		}
		scheduled := due
		if interval > 0 {
			if wait := time.Until(due); wait > 0 {
				if pause.For(ctx, wait) != nil {
					return
				}
				w.wakeLate.Record(max(time.Since(due), 0))
			}
			due = due.Add(interval)
		}
		clear(ds)
		t0 := time.Now()
		n, err := targets[next](ctx, checks, ds)
		t1 := time.Now()
		lat := t1.Sub(t0)
		next = (next + 1) % len(targets)
		if err == nil && n != len(checks) {
			err = fmt.Errorf("%d decisions for %d checks", n, len(checks))
		}
		if err != nil {
			if ctx.Err() != nil || !t1.Before(end) {
				// Cut off by the end of the run, whatever the target made
				// of it: a gRPC DeadlineExceeded status is not
				// context.DeadlineExceeded, and a connection deadline set
				// from the run's may fire before the context's timer
				// does. Not the target's fault. Any other deadline is the
				// target's: an error, counted.
				return
			}
			w.errors++
			w.noteError(err)
			backoff = min(max(2*backoff, time.Millisecond), 50*time.Millisecond)
			if pause.For(ctx, backoff) != nil {
				return
			}
			continue
		}
		backoff = 0
		w.requests++
		w.latency.Record(lat)
		if interval > 0 {
			w.response.Record(t1.Sub(scheduled))
		}
		for _, d := range ds {
			w.checks++
			if d.Allowed {
				w.allowed++
			} else {
				w.denied++
			}
			if d.Degraded {
				w.degraded++
			}
		}
	}
}

func (w *worker) noteError(err error) {
	msg := err.Error()
	if _, ok := w.errKinds[msg]; !ok && len(w.errKinds) >= MaxErrorKinds {
		msg = "(other)"
	}
	w.errKinds[msg]++
}

// Histogram is a log-linear histogram of durations in nanoseconds: exact
// below 2·histSub ns, then histSub buckets per power of two, so a
// percentile read from it is at most 1/histSub (1.6%) above the true value.
// Durations of 2^histMaxExp ns (~18 min) and more share the last bucket.
// The zero value is empty and ready; it is not safe for concurrent use.
type Histogram struct {
	counts   [histBuckets]uint64
	n        uint64
	sum, max time.Duration
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	histMaxExp  = 40
	// Values of exponent e (2^e ≤ v < 2^(e+1)) take buckets
	// (e-histSubBits+1)·histSub … (e-histSubBits+2)·histSub-1.
	histBuckets = (histMaxExp - 1 - histSubBits + 2) * histSub
)

// histIndex is the bucket of v nanoseconds.
func histIndex(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	v = min(v, 1<<histMaxExp-1)
	e := bits.Len64(v) - 1
	shift := e - histSubBits
	return shift*histSub + int(v>>shift)
}

// histUpper is the largest value in bucket i.
func histUpper(i int) uint64 {
	if i < 2*histSub {
		return uint64(i)
	}
	shift := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return (m+1)<<shift - 1
}

// Record adds one duration (negative ones count as 0).
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[histIndex(uint64(d))]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

// Merge adds o's durations to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is how many durations were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the largest duration recorded.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile is the q-quantile (0 < q ≤ 1): the upper end of the bucket of
// the ⌈q·n⌉-th smallest value, never above the largest value recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q*float64(h.n) - 1e-9))
	rank = min(max(rank, 1), h.n)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return min(time.Duration(histUpper(i)), h.max)
		}
	}
	return h.max
}

// Mean is the mean duration, 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}
