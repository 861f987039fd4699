package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/pause"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

// ViewSource reads the cluster's view (GET /v1/cluster/view, an admin
// endpoint) from the members, starting with the one that answered last
// and failing over to the others in turn, each given an equal share of
// the time left. It is the router.ViewSource of a router that is not a
// member.
type ViewSource struct {
	clients []*Client

	mu   sync.Mutex // guards cur, last
	cur  int        // the member that answered last
	last error      // the last FetchView's error, nil after one succeeded
}

// NewViewSource returns a source reading from the members at addrs (HTTP
// addresses). Give WithAdminToken when the members have one.
func NewViewSource(addrs []string, opts ...Option) *ViewSource {
	s := &ViewSource{}
	for _, a := range addrs {
		s.clients = append(s.clients, New(a, opts...))
	}
	return s
}

// FetchView implements router.ViewSource.
func (s *ViewSource) FetchView(ctx context.Context) (*router.View, error) {
	if len(s.clients) == 0 {
		return nil, errors.New("client: no cluster members to read the view from")
	}
	s.mu.Lock()
	start := s.cur
	s.mu.Unlock()
	var errs []error
	deadline, bounded := ctx.Deadline()
	for k := range s.clients {
		i := (start + k) % len(s.clients)
		// Each member gets its share of what is left of ctx, so that one
		// that hangs (stopped, not refusing) leaves the others time.
		// Was: the first took the whole deadline, and a router whose
		// first --cluster member hung never read a view from the rest.
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if bounded {
			tctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/time.Duration(len(s.clients)-k))
		}
		av, err := s.clients[i].RouterView(tctx)
		cancel()
		if err == nil {
			var v *router.View
			if v, err = router.ViewFromAPI(av); err == nil {
				s.mu.Lock()
				s.cur, s.last = i, nil
				s.mu.Unlock()
				return v, nil
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", s.clients[i].Addr(), err))
		if ctx.Err() != nil {
			break
		}
	}
	err := errors.Join(errs...)
	s.mu.Lock()
	s.last = err
	s.mu.Unlock()
	return nil, err
}

// Err returns the error of the last FetchView, each member's joined (an
// *api.Error 401 from a member that refuses the admin token, say), or nil
// when it read a view (or none was made yet).
func (s *ViewSource) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// CloseIdleConnections closes the idle HTTP connections to the members.
func (s *ViewSource) CloseIdleConnections() {
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
}

// Backoff is how a call retries: after the n-th failure it waits
// Base·2ⁿ⁻¹ (at most Max), spread by ±Jitter (a fraction), and never less
// than the RetryAfter an answer asked for.
type Backoff struct {
	Attempts int           // tries in all, the first included (default 3)
	Base     time.Duration // default 10ms
	Max      time.Duration // default 1s
	Jitter   float64       // default 0.2
	// PerTry bounds each try (default 1s, within the caller's context):
	// a member that hangs is given up and the next one tried.
	PerTry time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Attempts <= 0 {
		b.Attempts = 3
	}
	if b.Base <= 0 {
		b.Base = 10 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = time.Second
	}
	if b.Jitter <= 0 || b.Jitter > 1 {
		b.Jitter = 0.2
	}
	if b.PerTry <= 0 {
		b.PerTry = time.Second
	}
	return b
}

// RingConfig configures a Ring.
type RingConfig struct {
	// Members are HTTP addresses of cluster members: the view is read
	// from them, and checks fall back to them over HTTP.
	Members []string
	// AdminToken reads the view (it carries the hash seed). A Ring that
	// the members refuse the view goes on over HTTP: ViewError says so.
	AdminToken string
	// Refresh is how often the view is re-read (default 1s); a NOT_OWNER
	// answer re-reads it at once.
	Refresh time.Duration
	// Router tunes the batching and the owner timeout.
	Router router.Config
	// DataPlane configures the connections to the owners (its Dial for
	// TLS or the cluster secret); zero = transport.DefaultClientConfig().
	DataPlane *transport.ClientConfig
	// HTTPClient carries the view reads and the HTTP fallback; nil = a
	// keep-alive client of its own.
	HTTPClient *http.Client
	// Retry is the HTTP fallback's retry policy.
	Retry Backoff
}

// Ring is the fast Go client: it follows the cluster's ring and sends
// each check over the binary data plane straight to its owner, batching
// concurrent calls bound for one owner into one frame (a router with no
// keys of its own, in process). Until it has a view, and when it has
// none, it falls back to POST /v1/check on the members, retrying
// failures with jittered back-off. An owner that does not answer in time
// is answered by the rule's failure mode (Decision.Degraded).
//
// A Ring is safe for concurrent use; use one per process and Close it.
type Ring struct {
	rt      *router.Router
	pool    *transport.Pool
	src     *ViewSource
	http    []*Client
	retry   Backoff
	life    context.Context // ends at Close
	cancel  context.CancelFunc
	done    chan struct{}
	sleep   func(ctx context.Context, d time.Duration) error
	randMu  sync.Mutex // guards rnd
	rnd     *mrand.Rand
	fbMu    sync.Mutex // guards fbNext, fbCount, fbBad
	fbNext  int
	fbCount int64       // calls that went over HTTP (guarded by fbMu)
	fbBad   []time.Time // per member: tried last only until then (guarded by fbMu)
	closed  atomic.Bool
	refresh time.Duration // the Follow period (Ready's staleness)
}

// NewRing starts a Ring following the cluster at cfg.Members. It returns
// at once; Ready tells when the data plane is in use.
func NewRing(cfg RingConfig) (*Ring, error) {
	if len(cfg.Members) == 0 {
		return nil, errors.New("client: a Ring needs at least one member address")
	}
	if cfg.Refresh < 0 {
		return nil, fmt.Errorf("client: Refresh %v is negative (0 means the default, 1s)", cfg.Refresh)
	}
	dp := transport.DefaultClientConfig()
	if cfg.DataPlane != nil {
		dp = *cfg.DataPlane
	}
	if err := dp.Validate(); err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: NewTransport(64)}
	}
	opts := []Option{WithHTTPClient(hc), WithAdminToken(cfg.AdminToken)}
	pool := transport.NewPool(dp)
	rt, err := router.New(cfg.Router, nil, pool)
	if err != nil {
		_ = pool.Close()
		return nil, err
	}
	var seed [16]byte
	_, _ = rand.Read(seed[:])
	c := &Ring{rt: rt, pool: pool, src: NewViewSource(cfg.Members, opts...), retry: cfg.Retry.withDefaults(),
		done: make(chan struct{}), sleep: pause.For, refresh: cmp.Or(cfg.Refresh, time.Second),
		rnd: mrand.New(mrand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))}
	for _, m := range cfg.Members {
		c.http = append(c.http, New(m, opts...))
	}
	c.fbBad = make([]time.Time, len(c.http))
	ctx, cancel := context.WithCancel(context.Background())
	c.life, c.cancel = ctx, cancel
	go func() {
		defer close(c.done)
		_ = rt.Follow(ctx, c.src, cfg.Refresh)
	}()
	return c, nil
}

// Router returns the router inside (to share it with a gateway).
func (c *Ring) Router() *router.Router { return c.rt }

// Ready reports whether the Ring has a view, so checks take the data
// plane, and has read it within the last staleViewAfter refreshes (10 s
// at least): a Ring (or router, or gateway: their readiness is this)
// whose reads keep failing routes by an old ring, and says so. Was: ready
// for as long as it had any view. A closed Ring is not ready.
func (c *Ring) Ready() bool {
	return !c.closed.Load() && c.rt.View() != nil && c.rt.ViewAge() < max(staleViewAfter*c.refresh, 10*time.Second)
}

// staleViewAfter is how many refresh periods without a view read make a
// Ring not ready.
const staleViewAfter = 10

// ErrClosed is the error of a Ring's Check after (or cut short by) Close.
var ErrClosed = errors.New("client: ring closed")

// Close stops following and closes the connections. Checks made after it,
// and those it cuts short, return ErrClosed.
func (c *Ring) Close() error {
	c.closed.Store(true)
	c.cancel()
	<-c.done
	c.rt.Close()
	c.src.CloseIdleConnections()
	return c.pool.Close()
}

// Check spends cost of rule for key (cost 0 is a query) and returns the
// decision; a denial is a Decision with Allowed false, not an error.
func (c *Ring) Check(ctx context.Context, rule, key string, cost int64) (api.Decision, error) {
	if c.closed.Load() {
		return api.Decision{}, ErrClosed
	}
	if c.rt.View() != nil {
		var out [1]router.Result
		req := []router.Request{{Rule: rule, Key: key, Cost: cost}}
		err := c.rt.Check(ctx, req, out[:]) // a rule younger than the view: the router reads it again, once
		if err == nil {
			return DecisionOf(out[0]), nil
		}
		if errors.Is(err, router.ErrClosed) {
			return api.Decision{}, ErrClosed
		}
		if !errors.Is(err, api.ErrUnavailable) {
			return api.Decision{}, apiErrorOf(err)
		}
	}
	var d api.Decision
	err := c.viaHTTP(ctx, func(ctx context.Context, hc *Client) (err error) {
		d, err = hc.Check(ctx, rule, key, cost)
		return err
	})
	return d, err
}

// CheckBatch decides checks one by one and returns the decisions in the
// same order, as Client.CheckBatch does over HTTP, but on the data plane:
// the batch's checks for one owner travel in one frame (with concurrent
// callers' checks for it), each owner's frames in parallel. At most
// api.MaxBatch checks fit in one call. A batch with an invalid entry is
// refused whole, nothing in it spent, with the *api.Error a member would
// answer for it (404 unknown_rule, 400 bad_request; the message names
// the entry: "checks[3]: ..."). A check whose owner does not answer in
// time is answered by its rule's failure mode (Decision.Degraded), on
// its own. Without a view the batch goes over HTTP, as Check does. An
// empty batch returns no decisions and sends nothing.
func (c *Ring) CheckBatch(ctx context.Context, checks []api.CheckRequest) ([]api.Decision, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if len(checks) == 0 {
		return []api.Decision{}, nil
	}
	if len(checks) > api.MaxBatch {
		return nil, &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest,
			Message: fmt.Sprintf("checks: more than %d checks in a batch", api.MaxBatch)}
	}
	if c.rt.View() != nil {
		reqs := make([]router.Request, len(checks))
		for i, q := range checks {
			reqs[i] = router.Request{Rule: q.Rule, Key: q.Key, Cost: q.CostValue()}
		}
		out := make([]router.Result, len(reqs))
		err := c.rt.Check(ctx, reqs, out)
		if err == nil {
			ds := make([]api.Decision, len(out))
			for i := range out {
				ds[i] = DecisionOf(out[i])
			}
			return ds, nil
		}
		if errors.Is(err, router.ErrClosed) {
			return nil, ErrClosed
		}
		if !errors.Is(err, api.ErrUnavailable) {
			return nil, batchErrorOf(apiErrorOf(err), err)
		}
	}
	var ds []api.Decision
	err := c.viaHTTP(ctx, func(ctx context.Context, hc *Client) (err error) {
		ds, err = hc.CheckBatch(ctx, checks)
		return err
	})
	return ds, err
}

// batchErrorOf names the refused entry in e's message, as a member does
// for a batch; routerErr is the router's error that e was made from.
func batchErrorOf(e, routerErr error) error {
	ae, ok := errors.AsType[*api.Error](e)
	ie, isItem := errors.AsType[*router.ItemError](routerErr)
	if ok && isItem {
		ae.Message = "checks[" + strconv.Itoa(ie.Index) + "]: " + ae.Message
	}
	return e
}

// apiErrorOf turns the router's refusal of a check (a *router.ItemError:
// an unknown rule, a bad key or cost) into the *api.Error a member
// answers over HTTP for it (404 unknown_rule, 400 bad_request), so that
// a caller reads one error type whichever way the Ring took; any other
// error is returned as it is.
func apiErrorOf(err error) error {
	ie, ok := errors.AsType[*router.ItemError](err)
	if !ok {
		return err
	}
	msg := ie.Err.Error()
	switch {
	case errors.Is(err, router.ErrUnknownRule):
		return &api.Error{Status: http.StatusNotFound, Code: api.CodeUnknownRule, Message: msg}
	case errors.Is(err, api.ErrBadRequest), errors.Is(err, limiter.ErrCost):
		msg, _ = strings.CutPrefix(msg, api.ErrBadRequest.Error()+": ")
		return &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest, Message: msg}
	}
	return err
}

// Period returns the period of a rule in the view (for the headers'
// window); false before the first view or for an unknown rule.
func (c *Ring) Period(rule string) (time.Duration, bool) {
	if v := c.rt.View(); v != nil {
		if r := v.Rules[rule]; r != nil {
			return r.Period, true
		}
	}
	return 0, false
}

// viaHTTP is the fallback: call (POST /v1/check) on the members in turn,
// retrying transport errors, 503s and tries over Retry.PerTry with
// back-off. It returns call's last error.
func (c *Ring) viaHTTP(ctx context.Context, call func(ctx context.Context, hc *Client) error) (err error) {
	// Close cuts the call short, as it does a check on the data plane.
	// Was: a call over HTTP went on retrying with the caller's context
	// after Close, and ended with its deadline, not ErrClosed.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(c.life, stop)()
	defer func() {
		if err != nil && c.life.Err() != nil {
			err = ErrClosed
		}
	}()
	order := c.fallbackOrder()
	for attempt := 1; ; attempt++ {
		i := order[(attempt-1)%len(order)]
		hc := c.http[i]
		tctx, cancel := context.WithTimeout(ctx, c.retry.PerTry)
		err = call(tctx, hc)
		cancel()
		// A try that ran out of its own time (a member that hangs) is
		// retried on the next member; was: it took the caller's whole
		// context, so half the checks of a Ring whose fallback list held
		// a stopped member hung until their caller gave up.
		lateTry := err != nil && ctx.Err() == nil && tctx.Err() != nil
		if err != nil && (lateTry || retryable(err)) {
			c.fallbackFailed(i)
		}
		if err == nil || !retryable(err) && !lateTry || attempt >= c.retry.Attempts {
			return err
		}
		if e := c.sleep(ctx, c.backoff(attempt, 0)); e != nil {
			return err
		}
	}
}

// fallbackBench is how long a member that failed a fallback try (not
// reached, 503, or over Retry.PerTry) is tried only after the others.
const fallbackBench = 5 * time.Second

// fallbackOrder is the members one fallback call tries, in turn: from
// the next in the rotation, those that failed within fallbackBench last.
// Each call has its own order: taken from a rotation shared by
// concurrent calls, one call could land on a member that hangs at every
// try.
func (c *Ring) fallbackOrder() []int {
	c.fbMu.Lock()
	defer c.fbMu.Unlock()
	start := c.fbNext
	c.fbNext++
	c.fbCount++
	now := time.Now()
	order := make([]int, 0, len(c.http))
	var benched []int
	for k := range c.http {
		i := (start + k) % len(c.http)
		if now.Before(c.fbBad[i]) {
			benched = append(benched, i)
			continue
		}
		order = append(order, i)
	}
	return append(order, benched...)
}

// fallbackFailed benches member i for fallbackBench.
func (c *Ring) fallbackFailed(i int) {
	c.fbMu.Lock()
	defer c.fbMu.Unlock()
	c.fbBad[i] = time.Now().Add(fallbackBench)
}

// retryable: the node could not answer now (503) or was not reached; a
// 4xx is the caller's mistake and would fail again.
func retryable(err error) bool {
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status == http.StatusServiceUnavailable || e.Status == http.StatusBadGateway
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// backoff is the wait after the n-th failure, at least floor.
func (c *Ring) backoff(n int, floor time.Duration) time.Duration {
	d := c.retry.Base << min(n-1, 30)
	d = min(d, c.retry.Max)
	d = max(d, floor)
	c.randMu.Lock()
	f := 1 + c.retry.Jitter*(2*c.rnd.Float64()-1)
	c.randMu.Unlock()
	return time.Duration(float64(d) * f)
}

// ErrWouldExceedDeadline: Wait's next try would come after ctx's deadline.
var ErrWouldExceedDeadline = errors.New("client: the limit would not allow the check before the context's deadline")

// Wait checks until the check is allowed, sleeping between denials for
// the RetryAfter the owner answered (never less; jittered upward so that
// many waiters do not return in lockstep). It returns the allowing
// decision, or the last denial with ErrWouldExceedDeadline when the next
// try would come after ctx's deadline, or ctx's error. An allowing
// decision of a leaky_bucket rule may carry a delay (DelayMs): the
// caller still waits that long before it acts, as Middleware does.
func (c *Ring) Wait(ctx context.Context, rule, key string, cost int64) (api.Decision, error) {
	for {
		d, err := c.Check(ctx, rule, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		wait := time.Duration(d.RetryAfterMs) * time.Millisecond
		c.randMu.Lock()
		wait += time.Duration(float64(wait) * c.retry.Jitter * c.rnd.Float64())
		c.randMu.Unlock()
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return d, ErrWouldExceedDeadline
		}
		if err := c.sleep(ctx, wait); err != nil {
			return d, err
		}
	}
}

// ViewError returns why the Ring's last read of the view failed (each
// member's error joined: an *api.Error 401 unauthorized when the members
// refuse RingConfig.AdminToken, 403 when they have no token and the Ring
// is not on their loopback), or nil when it succeeded or none was made
// yet. While the reads fail the Ring routes by the view it has, or, with
// none, checks over HTTP (HTTPFallbacks counts them): ViewError says why.
// Every failed read is also logged at WARN on RingConfig.Router.Logger,
// which discards by default.
func (c *Ring) ViewError() error { return c.src.Err() }

// HTTPFallbacks returns how many calls went over HTTP (metrics, tests).
func (c *Ring) HTTPFallbacks() int64 {
	c.fbMu.Lock()
	defer c.fbMu.Unlock()
	return c.fbCount
}

// DecisionOf is a router result as the API shows it: durations in whole
// milliseconds, rounded up.
func DecisionOf(r router.Result) api.Decision {
	ms := func(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
	return api.Decision{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
		ResetAfterMs: ms(r.ResetAfter), RetryAfterMs: ms(r.RetryAfter), DelayMs: ms(r.Delay), Degraded: r.Degraded}
}
