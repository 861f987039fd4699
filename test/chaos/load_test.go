package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// answerTarget is the latency within which a check counts as answered.
const answerTarget = 250 * time.Millisecond

// event is one check as the client saw it. Times are since the load
// started.
type event struct {
	sent, recv time.Duration
	key        int32 // index into load.keys
	target     int8  // index into the target list at send time
	ok         bool  // HTTP 200 with a decision
	allowed    bool
	degraded   bool
	remaining  int64
}

// answered reports whether the check got a decision (degraded included)
// within answerTarget.
func (e event) answered() bool { return e.ok && e.recv-e.sent <= answerTarget }

// admitted reports whether the limiter (not a failure mode) let it pass.
func (e event) admitted() bool { return e.ok && e.allowed && !e.degraded }

// check is one watched check the load sends every round.
type check struct {
	rule, key string
	cost      int64
}

// load sends every check in keys rounds per second, split over workers;
// each worker sends its share as one batch to the next target in turn.
type load struct {
	keys    []check
	workers int
	rounds  float64 // per second

	targets atomic.Pointer[[]string]
	client  *http.Client
	start   time.Time
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex // guards events, failures
	events   []event
	failures []string // why batches got no decision: "t=…s target: error"
}

func newLoad(keys []check, workers int, rounds float64, targets ...string) *load {
	l := &load{keys: keys, workers: workers, rounds: rounds,
		client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	l.setTargets(targets...)
	return l
}

func (l *load) setTargets(addrs ...string) {
	c := slices.Clone(addrs)
	l.targets.Store(&c)
}

// since is the time since the load started.
func (l *load) since() time.Duration { return time.Since(l.start) }

func (l *load) run() {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.start = time.Now()
	for w := 0; w < l.workers; w++ {
		var mine []int32
		for i := w; i < len(l.keys); i += l.workers {
			mine = append(mine, int32(i))
		}
		l.wg.Add(1)
		go l.worker(ctx, w, mine)
	}
}

// stop ends the load and waits for the workers (each bounded by the
// client timeout).
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
	l.client.CloseIdleConnections()
}

func (l *load) worker(ctx context.Context, w int, mine []int32) {
	defer l.wg.Done()
	interval := time.Duration(float64(time.Second) / l.rounds)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	req := api.BatchRequest{Checks: make([]api.CheckRequest, len(mine))}
	for i, k := range mine {
		c := l.keys[k]
		cost := c.cost
		req.Checks[i] = api.CheckRequest{Rule: c.rule, Key: c.key, Cost: &cost}
	}
	body, _ := json.Marshal(req)
	turn := w
	// Open loop: a batch goes out every interval whatever the earlier
	// ones are doing, so a hung member does not slow the offered load
	// down (at most maxInflight batches per worker wait at once).
	const maxInflight = 32
	sem := make(chan struct{}, maxInflight)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // every slot waits on a hung member: skip this round
		}
		targets := *l.targets.Load()
		ti := turn % len(targets)
		turn++
		inflight.Add(1)
		go func() {
			defer func() { <-sem; inflight.Done() }()
			l.once(ctx, targets[ti], ti, mine, body)
		}()
	}
}

// once sends one batch and records what came back.
func (l *load) once(ctx context.Context, addr string, ti int, mine []int32, body []byte) {
	sent := l.since()
	res, err := l.send(ctx, addr, body)
	ok := err == nil
	recv := l.since()
	if ctx.Err() != nil && !ok {
		return // cut short by stop: not an observation
	}
	evs := make([]event, len(mine))
	for i, k := range mine {
		evs[i] = event{sent: sent, recv: recv, key: k, target: int8(ti), ok: ok}
		if ok {
			d := res.Results[i]
			evs[i].allowed, evs[i].degraded, evs[i].remaining = d.Allowed, d.Degraded, d.Remaining
		}
	}
	l.mu.Lock()
	l.events = append(l.events, evs...)
	if err != nil && len(l.failures) < 20 {
		l.failures = append(l.failures, fmt.Sprintf("t=%.2fs %s: %v (after %v)", sent.Seconds(), addr, err, (recv-sent).Round(time.Millisecond)))
	}
	l.mu.Unlock()
}

func (l *load) send(ctx context.Context, addr string, body []byte) (api.BatchResponse, error) {
	var out api.BatchResponse
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return out, err
	}
	if resp.StatusCode != 200 {
		return out, fmt.Errorf("HTTP %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, err
	}
	if len(out.Results) == 0 {
		return out, fmt.Errorf("no results in %s", b)
	}
	return out, nil
}

// failed returns the first recorded reasons for batches without a decision.
func (l *load) failed() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.failures)
}

// snapshot returns the events recorded so far.
func (l *load) snapshot() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// window filters events sent in [from, to).
func window(evs []event, from, to time.Duration) []event {
	var out []event
	for _, e := range evs {
		if e.sent >= from && e.sent < to {
			out = append(out, e)
		}
	}
	return out
}

type tally struct {
	checks, answered, degraded, failed int
	slowest                            time.Duration
}

func count(evs []event) tally {
	var t tally
	for _, e := range evs {
		t.checks++
		if e.answered() {
			t.answered++
		}
		if e.ok && e.degraded {
			t.degraded++
		}
		if !e.ok {
			t.failed++
		}
		if e.ok && e.recv-e.sent > t.slowest {
			t.slowest = e.recv - e.sent
		}
	}
	return t
}

func (t tally) answeredPct() float64 { return pct(t.answered, t.checks) }

func (t tally) String() string {
	return fmt.Sprintf("%d checks, %d answered within %v (%.3f%%), %d degraded (%.2f%%), %d without an answer, slowest answer %v",
		t.checks, t.answered, answerTarget, t.answeredPct(), t.degraded, pct(t.degraded, t.checks), t.failed, t.slowest.Round(time.Millisecond))
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// keyUse is what one key admitted over the run.
type keyUse struct {
	key              int32
	admitted         int64 // cost admitted by the limiter (not by a failure mode)
	first, last      time.Duration
	degradedAdmitted int64
}

// perKey sums admissions per key over events (all keys of the load that
// were sent at least once).
func perKey(evs []event, keys []check) map[int32]*keyUse {
	m := map[int32]*keyUse{}
	for _, e := range evs {
		u := m[e.key]
		if u == nil {
			u = &keyUse{key: e.key, first: e.sent}
			m[e.key] = u
		}
		u.first = min(u.first, e.sent)
		u.last = max(u.last, e.recv)
		if e.admitted() {
			u.admitted += keys[e.key].cost
		}
		if e.ok && e.allowed && e.degraded {
			u.degradedAdmitted += keys[e.key].cost
		}
	}
	return m
}

// tokenBound is the most a token bucket of rate per second and burst can
// admit between the client's first send and last receive: an upper bound
// on the owner's elapsed time.
func tokenBound(u *keyUse, rate float64, burst int64) float64 {
	return float64(burst) + rate*(u.last-u.first).Seconds()
}

// worstOver returns the key whose admissions exceed bound the most.
func worstOver(uses map[int32]*keyUse, bound func(*keyUse) float64) (*keyUse, float64) {
	var worst *keyUse
	over := math.Inf(-1)
	for _, u := range uses {
		if o := float64(u.admitted) - bound(u); o > over || (o == over && u.key < worst.key) {
			worst, over = u, o
		}
	}
	return worst, over
}
