// Package router forwards checks to the owners of their keys.
//
// A Router holds the current View of the cluster (the ring, the rules and
// the hash seed), pushed to it with SetView whenever the cluster changes;
// it never reads the Raft log, so it runs as well inside a member as in a
// stateless front door. For each check it computes the key's partition
// and owner: checks this node owns go to the Local handler in place;
// checks owned elsewhere join that owner's micro-batch, which is sent over
// the data plane when it is full or after a short linger. An owner that
// answers NOT_OWNER makes the router wait briefly for a newer ring and
// retry once; an owner that does not answer in time makes the rule's
// failure mode answer (open: allowed, closed: denied; both degraded).
//
// Requests may be joined into groups (Request.Joined) that spend on all
// their limits or on none. A group travels to its owner adjacent and in
// order in one batch, and is retried whole on NOT_OWNER; the owner
// decides it under its partitions' locks. A group whose keys have
// different owners cannot be atomic: the router then queries every
// limit (cost 0, nothing spent), refuses when one could not take its
// cost, and otherwise spends them one by one. Only in that case can a
// concurrent request take the last units of a limit between the query
// and the spend: that spend is then denied, the group refused, and what
// its other limits spent stays spent. It never admits more than a limit
// allows. When owners cannot be reached, each request of a group gets
// its rule's failure answer, and a closed one denies the group.
//
// A Router is safe for concurrent use. Per-request deadlines survive
// batching: each caller stops waiting at its own deadline, and a batch is
// sent with the latest of its callers' deadlines, so that a caller with
// little time left does not cut the batch short for the others (was:
// the earliest, and a caller with 5 ms left had every other check of its
// batch answered by the failure mode).
package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// View is what the router knows of the cluster: the ring, the rules and
// the hash seed (the same type members use).
type View = view.View

// Remote sends a batch to the owner at a data-plane address
// (transport.Pool implements it).
type Remote interface {
	Do(ctx context.Context, addr string, req *transport.BatchRequest, resp *transport.BatchResponse) error
}

// asyncRemote is a Remote that sends without a goroutine waiting for the
// answer (transport.Pool): done gets the error Do would return, once.
type asyncRemote interface {
	Go(addr string, deadline time.Time, req *transport.BatchRequest, resp *transport.BatchResponse, done func(error))
}

// Config tunes a Router. The zero value of a field means its default.
type Config struct {
	// Self is the member id whose checks the local handler decides; ""
	// for a router that owns nothing.
	Self string
	// Linger is how long a remote batch waits for more checks (200µs).
	Linger time.Duration
	// MaxBatch is the most checks in one remote batch (512).
	MaxBatch int
	// Timeout is how long an owner may take to answer before the rule's
	// failure mode answers instead (250ms).
	Timeout time.Duration
	// RefreshWait is how long a NOT_OWNER answer may wait for this
	// router's view to reach the owner's epoch before the retry (500ms).
	RefreshWait time.Duration
	// Registerer receives the router's metrics; nil = not registered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Linger: 200 * time.Microsecond, MaxBatch: 512, Timeout: 250 * time.Millisecond, RefreshWait: 500 * time.Millisecond}
}

// Validate checks the fields without changing them.
func (c Config) Validate() error {
	switch {
	case c.Linger < 0 || c.Linger > time.Second:
		return fmt.Errorf("router: linger %v outside [0, 1s]", c.Linger)
	case c.MaxBatch < 0 || c.MaxBatch > 65536:
		return fmt.Errorf("router: max batch %d outside [1, 65536]", c.MaxBatch)
	case c.Timeout < 0 || c.RefreshWait < 0:
		return errors.New("router: negative timeout")
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Linger == 0 {
		c.Linger = d.Linger
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = d.MaxBatch
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.RefreshWait == 0 {
		c.RefreshWait = d.RefreshWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Router forwards checks to their owners. Create it with New.
type Router struct {
	cfg    Config
	local  transport.Handler // decides what this node owns; nil for a pure router
	remote Remote
	m      *metrics

	ctx    context.Context // lives until Close: the base of batch sends
	cancel context.CancelFunc

	cell view.Cell // the current view

	mu       sync.Mutex // guards batchers
	batchers map[string]*batcher

	scratch sync.Pool // *scratch

	routes atomic.Pointer[routes] // dispatch's tables of the last ring seen

	goneMu sync.Mutex           // guards gone
	gone   map[string]goneOwner // owners found gone, by data-plane address (see run)

	stale      chan struct{} // a NOT_OWNER answer was seen (buffer 1); Follow refreshes
	fetchMu    sync.Mutex    // guards fetchDone, fetchSeq, fetching, wantRules and wantUntil
	fetchDone  chan struct{} // closed when Follow's next fetch is done (Refresh)
	fetchSeq   uint64        // how many fetches Follow has begun
	fetching   bool          // a fetch of Follow's is under way
	wantRules  uint64        // restale waits for a view with rules this new (0: none)…
	wantUntil  time.Time     // …until then: Follow reads every refetchGap meanwhile
	following  atomic.Bool   // Follow is running: Refresh is answered
	lastFetch  atomic.Int64  // when Follow's last fetch ended (Unix ns)
	lastViewOK atomic.Int64  // when Follow last read a view (Unix ns)

	authWarn rate.Sometimes // an owner refused this router's connection: at most one WARN per authWarnEvery
}

// authWarnEvery spaces the WARN lines of owners refusing this router's
// connections (authentication): the metric counts every failed batch.
const authWarnEvery = 10 * time.Second

// New returns a router. local decides the partitions this node owns (may
// be nil when View.Self is ""); remote reaches the other owners.
func New(cfg Config, local transport.Handler, remote Remote) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Router{cfg: cfg, local: local, remote: remote, batchers: map[string]*batcher{}, stale: make(chan struct{}, 1), gone: map[string]goneOwner{},
		authWarn: rate.Sometimes{Interval: authWarnEvery}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.scratch.New = func() any { return new(scratch) }
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r.m = m
	return r, nil
}

// Close stops the router: batches in flight fail and answer by failure mode.
func (r *Router) Close() { r.cancel() }

// errRouterClosed is the error of a check on a closed router.
var errRouterClosed = fmt.Errorf("%w: %w", api.ErrUnavailable, ErrClosed)

// SetView installs a new view; checks from now on use it. The metric
// series of rules the previous view had and v has not are deleted.
func (r *Router) SetView(v *View) {
	old := r.cell.Swap(v)
	if v != nil && v.Ring != nil {
		r.m.viewEpoch.Set(float64(v.Ring.Epoch()))
	}
	if old != nil && v != nil {
		for name := range old.Rules {
			if _, ok := v.Rules[name]; !ok {
				r.m.forget(name)
			}
		}
	}
}

// View returns the current view, nil before the first SetView.
func (r *Router) View() *View { return r.cell.Load() }

// scratch is the per-call working memory, pooled.
type scratch struct {
	checks   []transport.Check
	rules    []*limiter.Rule
	pending  []int
	retry    []int
	stale    []int    // indexes whose owner had no such rule, or refused the cost (see run)
	gone     []int    // indexes whose owner could not be reached (see run)
	goneAt   []string // the data-plane addresses of those owners (repeats allowed)
	local    transport.BatchRequest
	resp     transport.BatchResponse
	localIdx []int   // indexes decided in place, in s.local order
	groups   []group // indexes per remote owner
	groupOf  []int32 // by slot of routes.peers: 1 + index in groups, 0 for none yet
	waits    []ticket
	joined   bool    // some request is joined: look for groups
	split    [][]int // groups whose keys have different owners, by index runs of pending
}

// group is the checks of one call bound for one remote owner.
type group struct {
	addr string
	idx  []int
}

// ticket is a caller's share of a remote batch.
type ticket struct {
	b   *batch
	off int
	idx []int // indexes into the caller's requests, in batch order
}

// Check decides every request and writes its result to out (len(out) ≥
// len(reqs)); joined requests (Request.Joined) as groups, all-or-nothing
// (see the package documentation for the one case that is not atomic). An invalid request fails the whole call with an *ItemError
// before anything is spent; an error wrapping api.ErrUnavailable means
// the router knows no cluster yet; otherwise the only error is ctx's.
//
// When a router that follows the cluster (Follow) meets a rule its view
// does not know, it fetches the view (bounded by RefreshWait; at most once
// per refetchGap, waiting for the gap's end when its last fetch is more
// recent, the callers meanwhile sharing one fetch; twice when the first
// brings no newer rules) and decides again:
// the rule may be younger than its view, which it otherwise reads once
// per Follow period. Was: within the gap it refused at once, so a rule
// used right after the PUT that added it was unknown (404) when the
// router had read the view just before.
func (r *Router) Check(ctx context.Context, reqs []Request, out []Result) error {
	return r.CheckBy(ctx, time.Time{}, reqs, out)
}

// CheckBy is Check for a caller that must answer by a deadline of its
// own, by (the zero time: none, as Check). A check whose owner has not
// answered by then gets its rule's failure mode (Result.Degraded), every
// other check keeps its owner's answer, and CheckBy returns nil: the
// caller has a whole answer in time. Envoy's rate-limit filter, for one,
// waits 20 ms by default and then decides every descriptor of the call
// by its own failure_mode_deny, closed limits too. As with Timeout, an
// owner that was only slow may still count a check it decides after by.
// ctx's own end is still an error.
func (r *Router) CheckBy(ctx context.Context, by time.Time, reqs []Request, out []Result) error {
	err := r.check(ctx, by, reqs, out)
	if err == nil || !errors.Is(err, ErrUnknownRule) || !r.following.Load() || errors.As(err, new(lookedAgain)) {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RefreshWait)
	defer cancel()
	// Two reads at most: a read that brings no newer rules may come from
	// a member that has not applied the write yet (each follower reads
	// the member it read last), so one more, a refetchGap later. Was:
	// one, and a rule used through a router right after the PUT that
	// added it was 404 in 1 of 20 to 4 of 60 tries (a helper with real
	// processes). A read with newer rules that still lack the rule ends
	// it: the rule does not exist.
	for read := 0; read < 2; read++ {
		was, begun := r.View(), r.fetchesBegun()
		if r.waitGap(rctx) != nil || r.refreshAfter(rctx, begun) != nil {
			return err
		}
		err = r.check(ctx, by, reqs, out) // nothing was spent: validation comes first
		if err == nil || !errors.Is(err, ErrUnknownRule) || errors.As(err, new(lookedAgain)) {
			return err
		}
		if v := r.View(); v == nil || was == nil || v.RulesVersion != was.RulesVersion {
			return err
		}
	}
	return err
}

// lookedAgain is an error restale found under a view read after the
// owner's answer: CheckBy does not read the view again for it (was: it
// did, a refetchGap later, and the 404 of a rule just deleted came
// 100 ms late).
type lookedAgain struct{ error }

func (e lookedAgain) Unwrap() error { return e.error }

// refetchGap is the least time between two fetches made for unknown
// rules: a client that keeps naming a rule that does not exist costs the
// members at most 1/refetchGap view reads per router.
const refetchGap = 100 * time.Millisecond

func (r *Router) check(ctx context.Context, by time.Time, reqs []Request, out []Result) error {
	start := time.Now()
	if r.ctx.Err() != nil {
		return errRouterClosed
	}
	v := r.cell.Load()
	if v == nil || v.Ring == nil {
		if len(out) < len(reqs) || !carryRules(reqs) {
			return fmt.Errorf("%w: no cluster view yet", api.ErrUnavailable)
		}
		// No ring, so no owner to ask: checks that carry their own rule
		// (Envoy RLS) are answered by its failure mode, as when their
		// owner cannot be reached. Was: the call failed, and Envoy's
		// filter (failure_mode_deny false by default) let the hit
		// through for every limit, closed ones too (an audit: a router
		// that never reached its members).
		for i := range reqs {
			out[i] = failureAnswer(reqs[i].Inline)
		}
		denyGroups(reqs, out)
		r.m.countAll(reqs, out[:len(reqs)])
		return nil
	}
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: %d results for %d checks", api.ErrBadRequest, len(out), len(reqs))
	}
	s := r.scratch.Get().(*scratch)
	defer r.scratch.Put(s)
	s.checks, s.rules, s.pending = s.checks[:0], s.rules[:0], s.pending[:0]
	s.joined = false
	badKey := firstInvalidKey(reqs)
	// The checks of a batch mostly name one rule (the front doors share
	// its string): look a name up once per run of it, not per check.
	var lastName string
	var lastRule *limiter.Rule
	groupStart := 0 // index in s.checks (= in reqs) of the current group's head
	for i, q := range reqs {
		var rule *limiter.Rule
		var ok bool
		switch {
		case q.Inline != nil: // the caller's own rule (Envoy RLS): no lookup
			rule, ok = q.Inline, q.Inline.Name == q.Rule
		case lastRule != nil && q.Rule == lastName:
			rule, ok = lastRule, true
		default:
			if rule, ok = v.Rules[q.Rule]; ok {
				lastName, lastRule = q.Rule, rule
			}
		}
		switch {
		case q.Rule == "":
			// As the HTTP API answers it; was: unknown rule "" (404), and a
			// view read for it.
			return &ItemError{i, fmt.Errorf("%w: rule is empty", api.ErrBadRequest)}
		// The key before the rule, as the HTTP front door checks a
		// check's shape before its rule: a check bad both ways is 400
		// on either path (was 404 here, 400 there).
		case q.Key == "":
			return &ItemError{i, fmt.Errorf("%w: key is empty", api.ErrBadRequest)}
		case len(q.Key) > api.MaxKeyLen:
			return &ItemError{i, fmt.Errorf("%w: key is %d bytes, at most %d", api.ErrBadRequest, len(q.Key), api.MaxKeyLen)}
		case i == badKey:
			return &ItemError{i, fmt.Errorf("%w: key is not valid UTF-8", api.ErrBadRequest)}
		case !ok:
			return &ItemError{i, fmt.Errorf("%w %q", ErrUnknownRule, q.Rule)}
		case q.Joined && i == 0:
			return &ItemError{i, fmt.Errorf("%w: joined to no check before it", api.ErrBadRequest)}
		}
		if err := rule.CheckCost(q.Cost); err != nil {
			return &ItemError{i, fmt.Errorf("%w: %w", api.ErrBadRequest, err)}
		}
		kh := limiter.KeyHash(v.Seed, q.Key)
		if !q.Joined {
			groupStart = len(s.checks)
		} else if j := sameBucket(s.checks[groupStart:], q.Rule, kh); j >= 0 {
			// The owner refuses such a group (one bucket spent twice under
			// one decision); the router must refuse it first: was answered
			// by the failure mode, so a fail-open rule admitted every one.
			return &ItemError{i, fmt.Errorf("%w: the same rule and key as checks[%d] of its group", api.ErrBadRequest, groupStart+j)}
		}
		s.checks = append(s.checks, transport.Check{Rule: q.Rule, KeyHash: kh, Partition: v.Ring.Partition(kh), Cost: uint64(q.Cost), Inline: InlineOf(q.Inline), Joined: q.Joined})
		s.rules = append(s.rules, rule)
		s.pending = append(s.pending, i)
		s.joined = s.joined || q.Joined
	}
	runCtx := ctx
	if !by.IsZero() {
		// What no owner has answered by then keeps its failure answer:
		// every check starts with it, and an owner's answer replaces it
		// (settle). Was: by was a deadline on the whole call, and its
		// error made the caller answer every check by failure mode,
		// those its owners had decided (and spent) too.
		for i := range reqs {
			out[i] = failureAnswer(s.rules[i])
		}
		var cancel context.CancelFunc
		runCtx, cancel = context.WithDeadline(ctx, by)
		defer cancel()
	}
	if err := r.run(runCtx, v, s, out, start); err != nil {
		if by.IsZero() || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	if r.ctx.Err() != nil {
		// Closed meanwhile: forwarded checks were answered by the failure
		// mode (batches end with the router), which no one should act on.
		return errRouterClosed
	}
	if s.joined {
		denyGroups(reqs, out)
	}
	r.m.countAll(reqs, out[:len(reqs)])
	r.m.latency.Observe(time.Since(start).Seconds())
	return nil
}

// carryRules reports whether every check of reqs carries its own rule
// (Inline) and would pass the checks of the view's path that need no
// view: a rule named as it is called, a key, a cost it can take, a
// group with a head.
func carryRules(reqs []Request) bool {
	for i, q := range reqs {
		if q.Inline == nil || q.Inline.Name != q.Rule || q.Key == "" || (q.Joined && i == 0) || q.Inline.CheckCost(q.Cost) != nil {
			return false
		}
	}
	return len(reqs) > 0
}

// sameBucket returns the index in group of the check of rule and key
// hash kh, or -1.
func sameBucket(group []transport.Check, rule string, kh uint64) int {
	for j := range group {
		if group[j].KeyHash == kh && group[j].Rule == rule {
			return j
		}
	}
	return -1
}

// firstInvalidKey returns the index of the first request whose key
// (unchecked by the caller, and not too long) is not valid UTF-8, or
// len(reqs). It is the first read of the keys' bytes, which a caller's
// batch often holds scattered over the heap: in a loop of its own, with
// nothing else between two keys, the processor has several keys' cache
// misses in flight at once instead of one per turn of check's loop, and
// the hash reads the bytes from the cache after it.
func firstInvalidKey(reqs []Request) int {
	for i := range reqs {
		if q := &reqs[i]; !q.KeyValid && len(q.Key) <= api.MaxKeyLen && !utf8.ValidString(q.Key) {
			return i
		}
	}
	return len(reqs)
}

// denyGroups makes every result of a group that has a denied one denied
// (the owners do so already; this covers the failure answers).
func denyGroups(reqs []Request, out []Result) {
	for i := 0; i < len(reqs); {
		end, denied := i+1, !out[i].Allowed
		for ; end < len(reqs) && reqs[end].Joined; end++ {
			denied = denied || !out[end].Allowed
		}
		for k := i; denied && k < end; k++ {
			if out[k].Allowed {
				out[k].Allowed, out[k].RetryAfter, out[k].Delay = false, 0, 0
			}
		}
		i = end
	}
}

// run decides s.pending under view v into out, retrying once (under a
// newer view) what met NOT_OWNER; its only error is ctx's. now is the
// time it is called: the clock is read once per check, not at every
// step (a read was ~2% of a single check's CPU, and a check read it
// three to five times).
func (r *Router) run(ctx context.Context, v *View, s *scratch, out []Result, now time.Time) error {
	goneWait := min(r.cfg.RefreshWait, r.cfg.Timeout/2)
	for attempt := 0; len(s.pending) > 0; attempt++ {
		if attempt > 0 {
			now = time.Now()
		}
		if err := expiredAt(ctx, now); err != nil {
			return err
		}
		epoch := r.dispatch(ctx, v, s, out, now)
		if err := expired(ctx); err != nil {
			return err
		}
		notOwner := len(s.retry)
		if len(s.stale) > 0 && attempt == 0 {
			nv, err := r.restale(ctx, v, s)
			if err != nil {
				return err
			}
			if nv != nil {
				v = nv
			}
		}
		if len(s.retry) == 0 && len(s.gone) == 0 {
			break
		}
		if attempt == 1 { // NOT_OWNER twice: the cluster is still moving
			for _, i := range slices.Concat(s.retry, s.gone) {
				out[i] = failureAnswer(s.rules[i])
			}
			break
		}
		r.m.notOwner.Add(float64(notOwner))
		r.markStale()
		if len(s.gone) > 0 {
			// An owner this router could not reach (its port closed, its
			// connection broke): a following router's view lags the ring
			// by up to its refresh period, and a member that stops
			// gracefully hands its partitions off, marks itself down and
			// closes its port in that time. A view newer than v, fetched
			// at once (markStale), then names their new owners: the
			// checks go there. Was: answered at once by the failure mode.
			// A crashed owner's partitions move only once it is marked
			// dead, so the wait is bounded, by half the owner timeout.
			nv := r.cell.Await(ctx, max(epoch, v.Epoch()+1), 0, goneWait)
			if nv == nil || nv.Epoch() <= v.Epoch() {
				for _, i := range s.gone {
					out[i] = failureAnswer(s.rules[i])
				}
				r.noteGone(s.goneAt, v.Epoch())
				s.gone, s.goneAt = s.gone[:0], s.goneAt[:0]
				if len(s.retry) == 0 {
					break
				}
			} else {
				v = nv
			}
			s.retry = append(s.retry, s.gone...)
			s.gone, s.goneAt = s.gone[:0], s.goneAt[:0]
		}
		v = r.cell.Await(ctx, epoch, 0, r.cfg.RefreshWait)
		if s.joined {
			slices.Sort(s.retry) // request order: each group whole and in order
		}
		s.pending, s.retry = s.retry, s.pending[:0] // swap: the two never share an array
	}
	return nil
}

// restale looks again, under a view with newer rules than v's, at the
// checks an owner answered "no such rule" or "bad request" (s.stale,
// answered by the failure mode meanwhile): rules written a moment ago
// (a rule deleted, a burst lowered under a cost in flight) reach the
// owners before this router's view. It waits for such a view up to
// RefreshWait (a following router fetches one at once: markStale) and
// returns it, or nil. Under it, a check whose rule is gone or refuses its
// cost fails the call as the router's own validation would have
// (ErrUnknownRule: 404; api.ErrBadRequest: 400) when it is the whole
// call, nothing of it decided; in a call of several it keeps its failure
// answer. A check still valid there is sent again (s.retry). A call
// with groups is not sent again: a group goes whole or not at all.
//
// Was: answered by the failure mode, every such check degraded (a
// fail-open rule admitting a deleted rule's checks uncounted), for up
// to a view refresh after each rules write; an audit saw 12 to 3,855
// degraded answers per delete, and a "degraded checks" alert fire on a
// routine delete.
//
// A following router reads a view at once and, while the views it reads
// are no newer than v's rules, again every refetchGap until RefreshWait
// ends (askRules): the member it reads may not have applied the write
// yet. Was: one read, and when that member lagged by a few ms a lone
// check of a rule just deleted waited the whole RefreshWait and was
// answered by its failure mode (an audit: 4 of 8 after a PUT sent to a
// follower) instead of 404 or 400.
func (r *Router) restale(ctx context.Context, v *View, s *scratch) (*View, error) {
	if r.following.Load() {
		r.askRules(v.RulesVersion+1, time.Now().Add(r.cfg.RefreshWait))
	}
	r.markStale()
	nv := r.cell.Await(ctx, 0, v.RulesVersion+1, r.cfg.RefreshWait)
	if nv == nil || nv.RulesVersion <= v.RulesVersion {
		return nil, nil
	}
	whole := len(s.stale) == len(s.checks)
	for _, i := range s.stale {
		c := &s.checks[i]
		rule, ok := nv.Rules[c.Rule]
		var err error
		if !ok {
			err = lookedAgain{fmt.Errorf("%w %q", ErrUnknownRule, c.Rule)}
		} else if cerr := rule.CheckCost(int64(c.Cost)); cerr != nil {
			err = fmt.Errorf("%w: %w", api.ErrBadRequest, cerr)
		}
		switch {
		case err != nil && whole:
			return nil, &ItemError{i, err}
		case err == nil && !s.joined && c.Inline.Algorithm == 0:
			s.rules[i] = rule
			s.retry = append(s.retry, i)
		}
	}
	return nv, nil
}

// dispatch decides s.pending under view v, writing out[]; the indexes
// that met NOT_OWNER are left in s.retry, and the highest epoch an owner
// reported is returned.
func (r *Router) dispatch(ctx context.Context, v *View, s *scratch, out []Result, now time.Time) (maxEpoch uint64) {
	s.retry, s.stale, s.gone, s.goneAt = s.retry[:0], s.stale[:0], s.gone[:0], s.goneAt[:0]
	s.local.Checks = s.local.Checks[:0]
	s.waits = s.waits[:0]
	s.localIdx = s.localIdx[:0]
	s.split = s.split[:0]
	groups := s.groups[:0] // per owner address; a cluster has few owners
	rs := r.routesFor(v.Ring)
	s.groupOf = resize(s.groupOf, len(rs.peers))
	clear(s.groupOf)
	for p := 0; p < len(s.pending); {
		i := s.pending[p]
		run := s.pending[p : p+1]
		if s.joined {
			run = s.groupAt(p)
		}
		p += len(run)
		if allOwned(rs.mine, s.checks, run) {
			s.localIdx = append(s.localIdx, run...)
			continue
		}
		slot := int32(-1) // of the owner's address in rs.peers; -1: no owner
		if part := s.checks[i].Partition; int(part) < len(rs.peer) {
			slot = rs.peer[part]
		}
		if len(run) > 1 && slot >= 0 {
			if owner, _ := v.Ring.Owner(s.checks[i].Partition); !sameOwner(v, s.checks, run, owner.ID) {
				s.split = append(s.split, run)
				continue
			}
		}
		if slot < 0 {
			for _, i := range run {
				out[i] = failureAnswer(s.rules[i])
			}
			continue
		}
		// Not ours: every run of Self's partitions was taken above (allOwned).
		g := s.groupOf[slot] - 1
		if g < 0 {
			g = int32(len(groups))
			s.groupOf[slot] = g + 1
			addr := rs.peers[slot]
			if int(g) < cap(groups) {
				groups = groups[:g+1] // reuse the idx slice of a previous call
				groups[g].addr, groups[g].idx = addr, groups[g].idx[:0]
			} else {
				groups = append(groups, group{addr: addr})
			}
		}
		groups[g].idx = append(groups[g].idx, run...)
	}
	s.groups = groups
	// Remote groups first, so their batches fly while we decide locally.
	for _, g := range groups {
		b := r.batcherFor(g.addr)
		t := ticket{idx: g.idx}
		t.b, t.off = b.add(ctx, now, v.Ring.Epoch(), v.RulesVersion, s.checks, g.idx)
		s.waits = append(s.waits, t)
		r.m.forwarded.Add(float64(len(g.idx)))
	}
	localIdx := s.localIdx
	if len(localIdx) > 0 {
		s.local.Epoch, s.local.RulesVersion = v.Ring.Epoch(), v.RulesVersion
		own := s.local.Checks[:0]
		if inOrder(localIdx, len(s.checks)) {
			// Every check is ours, in order (one member, or a batch of
			// our keys): decide s.checks in place instead of copying it.
			s.local.Checks = s.checks
		} else {
			for _, i := range localIdx {
				own = append(own, s.checks[i])
			}
			s.local.Checks = own
		}
		s.resp.Results = resize(s.resp.Results, len(localIdx))
		r.decideLocal(ctx, now, &s.local, &s.resp)
		s.local.Checks = own // never s.checks' array: the next dispatch appends to s.local.Checks
		maxEpoch = max(maxEpoch, s.resp.Epoch)
		for k, i := range localIdx {
			r.settle(out, s, i, &s.resp.Results[k])
		}
	}
	for w, t := range s.waits {
		select {
		case <-t.b.done:
		case <-ctx.Done():
			// The answers that came meanwhile are kept (a caller with a
			// deadline of its own answers the rest: CheckBy), this one's
			// too: select picks either case when both are ready. Was:
			// the first owner not done hid every later owner's answer.
			for _, u := range s.waits[w:] {
				select {
				case <-u.b.done:
					maxEpoch = max(maxEpoch, r.settleTicket(out, s, u, v.Epoch()))
				default:
				}
			}
			return maxEpoch
		}
		maxEpoch = max(maxEpoch, r.settleTicket(out, s, t, v.Epoch()))
	}
	for _, run := range s.split {
		r.decideSplit(ctx, v, s, run, out)
	}
	return maxEpoch
}

// settleTicket settles the checks of a ticket whose batch is done, and
// returns the epoch its owner answered with. Checks whose owner could not
// be reached are left in s.gone instead, for run, when this router
// follows the cluster (unless that owner was found gone under the view
// of epoch, the one dispatch decides under: knownGone).
func (r *Router) settleTicket(out []Result, s *scratch, t ticket, epoch uint64) uint64 {
	defer t.b.release() // a caller that gave up (ctx) keeps its reference: the batch is not reused
	if t.b.err != nil {
		r.cfg.Logger.Debug("forward failed", "owner", t.b.b.addr, "err", t.b.err)
		if r.following.Load() && ownerGone(t.b.err) {
			if !r.knownGone(t.b.b.addr, epoch) {
				s.gone = append(s.gone, t.idx...)
				s.goneAt = append(s.goneAt, t.b.b.addr)
				return 0
			}
			r.markStale() // answered at once, but the ring may have moved
		}
	}
	for k, i := range t.idx {
		res := transport.Result{Status: transport.StatusUnavailable}
		if t.b.err == nil && t.off+k < len(t.b.resp.Results) {
			res = t.b.resp.Results[t.off+k]
		}
		r.settle(out, s, i, &res)
	}
	return t.b.resp.Epoch
}

// goneOwner is an owner found gone (not reachable, and no newer view
// within the wait for one) under the view of epoch, remembered until.
type goneOwner struct {
	epoch uint64
	until time.Time
}

// goneMemory is how long an owner found gone under a view is answered
// for at once by the failure mode, under that view: a crashed member's
// partitions move only once it is marked dead (--dead-after, seconds),
// and every check to it waited for a newer view (half the owner
// timeout, 125 ms) before the failure mode answered it: a closed-loop
// client's throughput fell a hundredfold (60k to 600 checks/s in a Go
// client audit) until the ring moved. One check per owner per
// goneMemory still waits, so a graceful stop's newer view is still met.
const goneMemory = time.Second

// noteGone remembers the owners at addrs as gone under the view of epoch.
func (r *Router) noteGone(addrs []string, epoch uint64) {
	now := time.Now()
	until := now.Add(goneMemory)
	r.goneMu.Lock()
	defer r.goneMu.Unlock()
	for a, g := range r.gone {
		if g.epoch < epoch || now.After(g.until) {
			delete(r.gone, a)
		}
	}
	for _, a := range addrs {
		r.gone[a] = goneOwner{epoch, until}
	}
}

// knownGone reports whether the owner at addr was found gone under the
// view of epoch less than goneMemory ago: its checks get their failure
// mode at once.
func (r *Router) knownGone(addr string, epoch uint64) bool {
	r.goneMu.Lock()
	defer r.goneMu.Unlock()
	g, ok := r.gone[addr]
	return ok && g.epoch == epoch && time.Now().Before(g.until)
}

// routes is what dispatch needs of one ring, computed once per ring:
// then a check needs no owner lookup (a Member copied out of the ring),
// no comparison of member ids for a local check and no search by
// address for a remote one.
type routes struct {
	ring  *ring.Ring
	mine  []bool   // by partition: Self owns it; nil when this router decides nothing in place
	peer  []int32  // by partition: its owner's data-plane address in peers; -1 when it has no owner
	peers []string // the owners' distinct data-plane addresses
}

// decideLocal has this node's owner decide req. An owner that would wait
// (for its lease, a partition on its way, a newer ring: see
// transport.PromptHandler) is waited for no longer than a remote owner,
// Timeout from now: past it every check is unavailable and gets its
// rule's failure mode. Its own waits are longer (a member that just
// started has its lease within a ping or two), and a member whose lease
// ran out kept its own callers' checks for them (seen in chaos scenario
// 8: 2 s), while the same checks forwarded to it were answered by the
// forwarding router's Timeout. A prompt owner decides under ctx alone,
// without the cost of a deadline on the hot path.
func (r *Router) decideLocal(ctx context.Context, now time.Time, req *transport.BatchRequest, resp *transport.BatchResponse) {
	if p, ok := r.local.(transport.PromptHandler); ok && p.Prompt(req) {
		r.local.HandleBatch(ctx, req, resp)
		return
	}
	lctx, cancel := context.WithDeadline(ctx, now.Add(r.cfg.Timeout))
	r.local.HandleBatch(lctx, req, resp)
	cancel()
}

// routesFor returns the routes of rg, computing them when rg is not the
// ring of the last call.
func (r *Router) routesFor(rg *ring.Ring) *routes {
	if rs := r.routes.Load(); rs != nil && rs.ring == rg {
		return rs
	}
	n := rg.Config().Partitions
	rs := &routes{ring: rg, peer: make([]int32, n)}
	local := r.local != nil && r.cfg.Self != ""
	if local {
		rs.mine = make([]bool, n)
	}
	for p := range n {
		o, ok := rg.Owner(uint32(p))
		if local {
			rs.mine[p] = ok && o.ID == r.cfg.Self
		}
		rs.peer[p] = -1
		if !ok {
			continue
		}
		k := slices.Index(rs.peers, o.Peer)
		if k < 0 {
			k = len(rs.peers)
			rs.peers = append(rs.peers, o.Peer)
		}
		rs.peer[p] = int32(k)
	}
	r.routes.Store(rs)
	return rs
}

// ownedBySelf returns which partitions of rg Self owns (decided in
// place), or nil when this router decides nothing in place.
func (r *Router) ownedBySelf(rg *ring.Ring) []bool { return r.routesFor(rg).mine }

// allOwned reports whether every check of run is in a partition of
// mine.
func allOwned(mine []bool, checks []transport.Check, run []int) bool {
	for _, i := range run {
		if p := checks[i].Partition; int(p) >= len(mine) || !mine[p] {
			return false
		}
	}
	return len(mine) > 0
}

// inOrder reports whether idx is 0, 1, …, n-1.
func inOrder(idx []int, n int) bool {
	if len(idx) != n {
		return false
	}
	for k, i := range idx {
		if i != k {
			return false
		}
	}
	return true
}

// groupAt returns the group of s.pending that starts at p: the request
// there and the joined ones right after it in request order. A group
// whose head is not pending any more (an owner answered part of it) is
// cut loose from it: its first pending request heads it.
func (s *scratch) groupAt(p int) []int {
	s.checks[s.pending[p]].Joined = false
	end := p + 1
	for end < len(s.pending) && s.pending[end] == s.pending[end-1]+1 && s.checks[s.pending[end]].Joined {
		end++
	}
	return s.pending[p:end]
}

// sameOwner reports whether every check of run is owned by id.
func sameOwner(v *View, checks []transport.Check, run []int, id string) bool {
	for _, i := range run[1:] {
		if o, ok := v.Ring.Owner(checks[i].Partition); !ok || o.ID != id {
			return false
		}
	}
	return true
}

// decideSplit decides a group whose keys have different owners, the one
// case that cannot be atomic (see the package documentation): a query of
// every check (cost 0, each alone), then, when each would take its cost,
// a spend of every check.
func (r *Router) decideSplit(ctx context.Context, v *View, s *scratch, run []int, out []Result) {
	t := r.scratch.Get().(*scratch)
	defer r.scratch.Put(t)
	t.checks, t.rules, t.pending, t.joined = t.checks[:0], t.rules[:0], t.pending[:0], false
	for k, i := range run {
		c := s.checks[i]
		c.Cost, c.Joined = 0, false
		t.checks = append(t.checks, c)
		t.rules = append(t.rules, s.rules[i])
		t.pending = append(t.pending, k)
	}
	res := make([]Result, len(run))
	if r.run(ctx, v, t, res, time.Now()) != nil {
		return // the caller's deadline: Check returns its error
	}
	pass := true
	for k, i := range run {
		cost := int64(s.checks[i].Cost)
		if d := &res[k]; !d.Allowed || (!d.Degraded && d.Remaining < cost) {
			pass = false
			if d.Allowed { // a cost-1 check would pass, this cost not yet
				d.Allowed, d.RetryAfter = false, retryEstimate(s.rules[i], cost, d.Decision)
			}
		}
	}
	if pass {
		// Spend what the queries decided; a check answered by its failure
		// mode (its owner unreachable) keeps that answer rather than
		// waiting a second Timeout on the same owner.
		t.pending = t.pending[:0]
		for k, i := range run {
			t.checks[k].Cost = s.checks[i].Cost
			if !res[k].Degraded {
				t.pending = append(t.pending, k)
			}
		}
		if r.run(ctx, v, t, res, time.Now()) != nil {
			return
		}
	}
	for k, i := range run {
		out[i] = res[k]
	}
}

// retryEstimate is when cost will fit where a query saw only
// d.Remaining: the refill time of the missing units for the rate
// algorithms, the time back to full for the windows (an upper bound).
func retryEstimate(rule *limiter.Rule, cost int64, d limiter.Decision) time.Duration {
	switch rule.Algorithm {
	case limiter.TokenBucket, limiter.GCRA, limiter.LeakyBucket:
		return time.Duration(cost-d.Remaining) * ((rule.Period + time.Duration(rule.Limit) - 1) / time.Duration(rule.Limit))
	}
	return max(d.ResetAfter, time.Second)
}

// expired returns ctx's error, or context.DeadlineExceeded once its
// deadline has passed even if its timer has not fired yet: a batch that
// failed because the caller's own deadline passed is the caller's timeout,
// not an unreachable owner to answer by failure mode.
func expired(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		return ctx.Err()
	}
	return expiredAt(ctx, time.Now())
}

// expiredAt is expired with the time now read by the caller.
func expiredAt(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// settle turns an owner's answer into the caller's result.
func (r *Router) settle(out []Result, s *scratch, i int, res *transport.Result) {
	switch res.Status {
	case transport.StatusOK:
		out[i] = Result{Decision: limiter.Decision{
			Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining,
			ResetAfter: res.ResetAfter, RetryAfter: res.RetryAfter, Delay: res.Delay,
		}}
	case transport.StatusNotOwner:
		s.retry = append(s.retry, i)
	case transport.StatusUnknownRule, transport.StatusBadRequest:
		// The owner's rules are newer than this view's (the router
		// checked both against its own): run looks again under a newer
		// view; until then, and if none comes, the failure mode answers.
		s.stale = append(s.stale, i)
		out[i] = failureAnswer(s.rules[i])
	default:
		// Unreachable, late, or disagreeing about the rule (rules still
		// replicating): the rule's failure mode answers (counted as
		// degraded once the call is answered, in countAll).
		out[i] = failureAnswer(s.rules[i])
	}
}

// failureAnswer is the decision of a rule's failure mode.
func failureAnswer(rule *limiter.Rule) Result {
	d := limiter.Decision{Limit: rule.Capacity()}
	if rule.FailureMode == limiter.FailOpen {
		d.Allowed = true
	} else {
		// Reset no sooner than the retry: headers built from it said
		// "full again now" (RateLimit t=0) beside Retry-After: 1.
		d.RetryAfter = min(rule.Period, time.Second)
		d.ResetAfter = d.RetryAfter
	}
	return Result{Decision: d, Degraded: true}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (r *Router) batcherFor(addr string) *batcher {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.batchers[addr]
	if b == nil {
		b = &batcher{r: r, addr: addr}
		b.async, _ = r.remote.(asyncRemote)
		r.batchers[addr] = b
	}
	return b
}

// batcher collects the checks bound for one owner into micro-batches.
type batcher struct {
	r     *Router
	addr  string
	async asyncRemote // r.remote, when it is one

	mu       sync.Mutex // guards cur and inflight
	cur      *batch     // the batch filling up, nil when none
	inflight int        // batches sent and not yet answered

	free sync.Pool // *batch of this batcher, answered and read by all
}

// batch is one frame to an owner and, once done is closed, its answer.
// Batches are reused: each caller holding a ticket for it, and its
// sender, hold a reference (refs) and release it when done with it; the
// last one puts it back in its batcher's pool, with its buffers and its
// linger timer.
type batch struct {
	b        *batcher
	req      transport.BatchRequest
	resp     transport.BatchResponse
	deadline time.Time // the latest of its callers'
	timer    *time.Timer
	done     chan struct{}
	err      error
	refs     atomic.Int32
	answered func(error) // b.finish for this batch, made once
}

// newBatch returns an empty batch, reused when one is free, holding the
// sender's reference. The caller holds b.mu.
func (b *batcher) newBatch(deadline time.Time, epoch, rulesVersion uint64) *batch {
	bt, _ := b.free.Get().(*batch)
	if bt == nil {
		bt = &batch{b: b}
		bt.answered = func(err error) { b.finish(bt, err) }
	}
	bt.deadline, bt.done, bt.err = deadline, make(chan struct{}), nil
	bt.req.Epoch, bt.req.RulesVersion, bt.req.Checks = epoch, rulesVersion, bt.req.Checks[:0]
	bt.resp = transport.BatchResponse{Results: bt.resp.Results[:0]}
	bt.refs.Store(1)
	return bt
}

// linger arms bt's linger timer: the batch goes when it ends, unless it
// went earlier (full, or the batch in flight came back).
func (bt *batch) linger() {
	if bt.timer == nil {
		bt.timer = time.AfterFunc(bt.b.r.cfg.Linger, func() { bt.b.flush(bt) })
		return
	}
	bt.timer.Reset(bt.b.r.cfg.Linger) // stopped or fired and done: its last use is over
}

// release drops a reference to bt; the last puts it back for reuse.
func (bt *batch) release() {
	if bt.refs.Add(-1) == 0 {
		bt.b.free.Put(bt)
	}
}

// add appends the checks at idx to the owner's current batch and returns
// the batch and the offset of the first one in it. now is the caller's
// current time; the checks' deadline is now plus the router's Timeout,
// or the caller's earlier one.
func (b *batcher) add(ctx context.Context, now time.Time, epoch, rulesVersion uint64, checks []transport.Check, idx []int) (*batch, int) {
	deadline := now.Add(b.r.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var full *batch // a batch to send once b.mu is released
	b.mu.Lock()
	if b.cur != nil && len(b.cur.req.Checks)+len(idx) > b.r.cfg.MaxBatch {
		if b.cur.timer.Stop() {
			full = b.cur
			b.inflight++
		}
		b.cur = nil
	}
	if b.cur == nil && b.inflight == 0 {
		// Nothing in flight to this owner: lingering would only add
		// latency. Send at once; checks arriving meanwhile batch up.
		bt := b.newBatch(deadline, epoch, rulesVersion)
		bt.req.Checks = slices.Grow(bt.req.Checks, len(idx))
		for _, i := range idx {
			bt.req.Checks = append(bt.req.Checks, checks[i])
		}
		bt.refs.Add(1) // the caller's ticket
		b.inflight++
		b.mu.Unlock()
		b.start(bt)
		return bt, 0
	}
	if b.cur == nil {
		b.cur = b.newBatch(deadline, epoch, rulesVersion)
		b.cur.linger()
	}
	bt := b.cur
	bt.refs.Add(1) // the caller's ticket
	off := len(bt.req.Checks)
	bt.req.Checks = slices.Grow(bt.req.Checks, len(idx))
	for _, i := range idx {
		bt.req.Checks = append(bt.req.Checks, checks[i])
	}
	if deadline.After(bt.deadline) {
		bt.deadline = deadline
	}
	bt.req.Epoch = max(bt.req.Epoch, epoch)
	bt.req.RulesVersion = max(bt.req.RulesVersion, rulesVersion)
	var filled *batch
	if len(bt.req.Checks) >= b.r.cfg.MaxBatch {
		b.cur = nil
		if bt.timer.Stop() {
			filled = bt
			b.inflight++
		}
	}
	b.mu.Unlock()
	if full != nil {
		b.start(full)
	}
	if filled != nil {
		b.start(filled)
	}
	return bt, off
}

// flush sends bt when its linger ends, unless it was sent already.
func (b *batcher) flush(bt *batch) {
	b.mu.Lock()
	if b.cur == bt {
		b.cur = nil
	}
	b.inflight++
	b.mu.Unlock()
	b.start(bt)
}

// start sends bt (counted in flight by the caller, who holds no lock):
// with an asyncRemote, on the remote's goroutines; else on a goroutine of
// its own that waits in Do. finish takes the answer.
func (b *batcher) start(bt *batch) {
	b.r.m.batchSize.Observe(float64(len(bt.req.Checks)))
	if err := b.r.ctx.Err(); err != nil { // the router is closed
		b.finish(bt, err)
		return
	}
	if b.async != nil {
		b.async.Go(b.addr, bt.deadline, &bt.req, &bt.resp, bt.answered)
		return
	}
	go func() {
		ctx, cancel := context.WithDeadline(b.r.ctx, bt.deadline)
		err := b.r.remote.Do(ctx, b.addr, &bt.req, &bt.resp)
		cancel()
		b.finish(bt, err)
	}()
}

// ownerGone reports whether err, a batch's, says its owner could not be
// reached at all (a refused dial, one not answered for SlowDial, a
// connection that broke or was closed),
// rather than late (ctx), overloaded (ErrQueueFull) or refusing the frame.
//
// A connection that broke after the frame left may have had it decided:
// the retry under a newer view then spends those checks a second time
// at the new owner, when it holds the old one's state (a hand-off). That
// errs toward counting twice, which never admits more than a limit
// allows; answering them by the failure mode instead would, for a
// fail-open rule, admit them uncounted.
func ownerGone(err error) bool {
	var oe *net.OpError
	return errors.Is(err, transport.ErrConnClosed) && !errors.Is(err, transport.ErrClientClosed) ||
		errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, transport.ErrDialSlow)
}

// finish publishes bt's answer and — when it was the last batch in
// flight — sends the batch that filled up meanwhile without waiting for
// its linger.
func (b *batcher) finish(bt *batch, err error) {
	if err != nil && b.r.ctx.Err() == nil {
		b.r.m.forwardErrors.Inc() // once per batch, whatever its callers
		if errors.Is(err, transport.ErrAuth) {
			// A configuration error, not an outage: every check of this
			// owner's keys is answered by its rule's failure mode (a
			// fail-open rule admits them all) until it is mended.
			b.r.authWarn.Do(func() {
				b.r.cfg.Logger.Warn("an owner refused this process's data-plane connection (a router's, gateway's or bench's): give it the cluster's secret or certificate (--cluster-secret, --tls-*); until then its checks are answered by their rules' failure_mode",
					"owner", b.addr, "err", err)
			})
		}
	}
	bt.err = err
	close(bt.done)
	b.mu.Lock()
	b.inflight--
	next := b.cur
	if b.inflight == 0 && next != nil && next.timer.Stop() {
		b.cur = nil
		b.inflight++
	} else {
		next = nil
	}
	b.mu.Unlock()
	if next != nil {
		b.start(next)
	}
	bt.release() // the sender's reference
}
