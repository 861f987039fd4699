package rls

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// MaxDescriptors is the most descriptors in one ShouldRateLimit call.
const MaxDescriptors = 128

// Checker decides checks; *router.Router implements it.
type Checker interface {
	// CheckBy decides reqs into out (len(out) ≥ len(reqs)); a check not
	// decided by by (the zero time: no such deadline) gets its rule's
	// failure mode, marked Degraded. See router.Router.CheckBy.
	CheckBy(ctx context.Context, by time.Time, reqs []router.Request, out []router.Result) error
}

// Service implements envoy.service.ratelimit.v3.RateLimitService on a
// Checker, under the Config in force (SetConfig swaps it atomically). It
// is safe for concurrent use.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer

	checker Checker
	headers bool
	m       *metrics
	log     *slog.Logger
	now     func() time.Time // deny-all limits' reset
	cfg     atomic.Pointer[Config]
	scratch sync.Pool // *scratch
}

// NewService returns a service with an empty config (every descriptor
// OK) until SetConfig. With headers, responses carry x-ratelimit-limit,
// x-ratelimit-remaining and x-ratelimit-reset for Envoy to add, from the
// matched limit with the least remaining.
func NewService(checker Checker, headers bool, m *metrics) *Service {
	s := &Service{checker: checker, headers: headers, m: m, log: slog.New(slog.DiscardHandler), now: time.Now}
	s.cfg.Store(&Config{domains: map[string]*level{}})
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// SetConfig puts c in force for the calls that start after it.
func (s *Service) SetConfig(c *Config) { s.cfg.Store(c) }

// Config returns the config in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// scratch is one call's working memory, pooled.
type scratch struct {
	lims []*limit
	key  []byte
	reqs []router.Request
	out  []router.Result
	at   []int // per descriptor: index of its first check in reqs, -1 when none was sent
}

// ShouldRateLimit decides every descriptor of the request; see the
// package documentation for the semantics.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	resp, err := s.shouldRateLimit(ctx, req)
	switch {
	case err != nil:
		s.m.calls.WithLabelValues("error").Inc()
	case resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT:
		s.m.calls.WithLabelValues("over_limit").Inc()
	default:
		s.m.calls.WithLabelValues("ok").Inc()
	}
	return resp, err
}

func (s *Service) shouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	ds := req.GetDescriptors()
	switch {
	case req.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case len(ds) == 0:
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case len(ds) > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors, at most %d", len(ds), MaxDescriptors)
	}
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(ds))}
	dom := s.cfg.Load().domains[req.GetDomain()]
	if dom == nil {
		s.m.unknownDomain.Inc()
		for i := range ds {
			resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		}
		return resp, nil
	}
	sc := s.scratch.Get().(*scratch)
	defer s.putScratch(sc)

	// Match every descriptor to its limit, then drop the limits that
	// another matched limit replaces.
	sc.lims = sc.lims[:0]
	replacing := false
	for _, d := range ds {
		l, err := s.limitOf(req.GetDomain(), dom, d)
		if err != nil {
			return nil, err
		}
		sc.lims = append(sc.lims, l)
		replacing = replacing || (l != nil && len(l.replaces) > 0)
	}
	if replacing {
		applyReplaces(sc.lims)
	}

	// One check per rate limit of every limited descriptor, all in one
	// router call, so they fly to their owners together. A descriptor's
	// rate limits are one group (router.Request.Joined): a hit denied by
	// one is counted by none. They share the descriptor's key, so one
	// owner decides the group, atomically.
	var pick headerPick // what the x-ratelimit-* headers describe
	sc.reqs, sc.at = sc.reqs[:0], sc.at[:0]
	for i, d := range ds {
		sc.at = append(sc.at, -1)
		l := sc.lims[i]
		if l == nil || l.unlimited || l.denyAll {
			continue
		}
		cost := hits(req, d)
		if over := overCapacity(l, cost); over >= 0 {
			// More hits than the limit can ever take: over the limit,
			// without spending anything anywhere. Its reset is a whole
			// period, not 0 ("now"): retrying at once cannot pass.
			r := l.rules[over]
			resp.Statuses[i] = s.status(l, over, router.Result{Decision: limiter.Decision{Limit: r.Capacity(), ResetAfter: r.Period}}, d)
			pick.offer(resp.Statuses[i], r.Period)
			continue
		}
		key := s.counterKey(sc, d.GetEntries())
		sc.at[i] = len(sc.reqs)
		for j, r := range l.rules {
			sc.reqs = append(sc.reqs, router.Request{Rule: r.Name, Key: key, Cost: cost, Inline: r, Joined: j > 0})
		}
	}
	if len(sc.reqs) > 0 {
		if cap(sc.out) < len(sc.reqs) {
			sc.out = make([]router.Result, len(sc.reqs))
		}
		sc.out = sc.out[:len(sc.reqs)]
		if err := s.check(ctx, sc.reqs, sc.out); err != nil {
			return nil, grpcError(err)
		}
	}

	for i, d := range ds {
		l := sc.lims[i]
		switch {
		case resp.Statuses[i] != nil: // decided above
		case l == nil:
			s.m.unmatched.Inc()
			resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		case l.unlimited:
			s.count(l, d, resultUnlimited)
			resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case l.denyAll:
			resp.Statuses[i] = s.status(l, 0, router.Result{}, d)
			pick.offer(resp.Statuses[i], l.period(0))
		default:
			// The decisive limit: the first that denied (a limit refused
			// only because another denied has no RetryAfter), else the
			// one with the least remaining.
			at, best := sc.at[i], 0
			for j := range l.rules {
				o, b := &sc.out[at+j], &sc.out[at+best]
				if b.Allowed && (!o.Allowed || o.Remaining < b.Remaining) ||
					!b.Allowed && b.RetryAfter == 0 && !o.Allowed && o.RetryAfter > 0 {
					best = j
				}
				if o.Degraded {
					s.m.degraded.Inc()
				}
			}
			resp.Statuses[i] = s.status(l, best, sc.out[at+best], d)
			// The status and headers describe what owners decided. A
			// failure mode's answer knows nothing of the limit's state:
			// one that let the hit through is a bare OK, as an
			// unmatched descriptor's (was: its current_limit with 0
			// remaining, which Envoy's own x-ratelimit headers would
			// pass on to the client as "none left"); one that denied
			// decides the answer, and is described, with its retry.
			if sc.out[at+best].Degraded && resp.Statuses[i].Code != rlspb.RateLimitResponse_OVER_LIMIT {
				resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
			} else {
				pick.offer(resp.Statuses[i], l.period(best))
			}
		}
		if resp.Statuses[i].Code == rlspb.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	if s.headers {
		addHeaders(resp, &pick)
	}
	return resp, nil
}

// check runs the checks through the router. When the caller (Envoy) has
// a deadline, the checks must be decided a little before it: the
// limits' failure modes answer those whose owner has not answered then,
// so a closed limit still denies when its owner is down or slow, instead
// of the call failing and Envoy's own failure_mode_deny deciding for
// every limit alike; the others keep their owners' answers.
func (s *Service) check(ctx context.Context, reqs []router.Request, out []router.Result) error {
	var by time.Time
	if dl, ok := ctx.Deadline(); ok {
		by = dl.Add(-min(time.Until(dl)/4, maxMargin))
	}
	return s.checker.CheckBy(ctx, by, reqs, out)
}

// maxMargin is the most of a caller's deadline kept to answer in; it is
// a quarter of the time left when that is less (5 ms of Envoy's default
// 20 ms). Was: a tenth, at most 5 ms: 2 ms of 20 was missed by 1 to 5
// calls in 40 on a busy machine, and Envoy then decided them itself.
const maxMargin = 10 * time.Millisecond

func (s *Service) putScratch(sc *scratch) {
	clear(sc.lims) // do not keep an old config alive
	clear(sc.reqs)
	if cap(sc.key) > 64<<10 {
		sc.key = nil // do not keep a huge descriptor's buffer
	}
	s.scratch.Put(sc)
}

// limitOf returns the limit a request descriptor is held to, nil for none.
// A descriptor that carries its own limit (Envoy's per-route override) is
// held to that, as a fixed window, in the domain.
func (s *Service) limitOf(domain string, dom *level, d *commonpb.RateLimitDescriptor) (*limit, error) {
	es := d.GetEntries()
	if len(es) == 0 {
		return nil, nil
	}
	o := d.GetLimit()
	if o == nil {
		if len(es) > MaxDepth {
			return nil, nil // deeper than any config descriptor
		}
		return dom.match(es), nil
	}
	name, ok := rlspb.RateLimitResponse_RateLimit_Unit_name[int32(o.GetUnit())]
	u, known := units[lower(name)]
	if !ok || !known {
		return nil, status.Errorf(codes.InvalidArgument, "descriptor limit override: unknown unit %v", o.GetUnit())
	}
	mult := int64(1) // unset and 0 mean 1, as in envoyproxy/ratelimit
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		mult = int64(m.GetValue())
	}
	// Bounded before the product, which overflows a time.Duration past
	// 292 years (YEAR × 300 was a negative period). In seconds it cannot
	// overflow: at most 2^32 × 31,536,000. A block is bounded alike: its
	// period says when its window ends.
	if mult > int64(limiter.MaxPeriod/u.d) {
		return nil, status.Errorf(codes.InvalidArgument, "descriptor limit override: %d × %s is a period of %ds, over the longest allowed, %ds (%d days)",
			mult, name, mult*int64(u.d/time.Second), int64(limiter.MaxPeriod/time.Second), int64(limiter.MaxPeriod/(24*time.Hour)))
	}
	period := u.d * time.Duration(mult)
	l := &limit{fullKey: domain + "._override", units: []rlspb.RateLimitResponse_RateLimit_Unit{u.u}, multiplier: uint32(mult)}
	if o.GetRequestsPerUnit() == 0 {
		l.denyAll = true
		return l, nil
	}
	// The rule, so the counter, is the descriptor's in the override's
	// window, named by its period: 3 per 30 SECOND and 3 per SECOND count
	// apart, 60 SECOND and MINUTE (one window) together. The limit is
	// not in the name, as envoyproxy/ratelimit leaves it out of its cache
	// key (domain, entries, window): routes that give one descriptor
	// different limits in one window share its count, each holding it to
	// its own limit, and a changed limit keeps the count.
	r := &limiter.Rule{Name: overrideRuleName(domain, period), Algorithm: limiter.FixedWindow, Limit: int64(o.GetRequestsPerUnit()), Period: period}
	if err := r.Validate(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "descriptor limit override: %v", err)
	}
	l.rules = []*limiter.Rule{r}
	return l, nil
}

// overrideRuleName names the rule of a descriptor limit override by its
// period: the unit of that length (the name an override had before its
// unit_multiplier counted), else the period in seconds.
func overrideRuleName(domain string, period time.Duration) string {
	for name, u := range units {
		if u.d == period {
			return ruleName(domain, overridePrefix+name, 0)
		}
	}
	return ruleName(domain, overridePrefix+strconv.FormatInt(int64(period/time.Second), 10)+"s", 0)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// applyReplaces drops (sets to nil) every limit one of whose names
// another matched limit replaces, as envoyproxy/ratelimit does: the
// replaced limit is neither checked nor spent.
func applyReplaces(lims []*limit) {
	var replaced []string
	for _, l := range lims {
		if l != nil {
			replaced = append(replaced, l.replaces...)
		}
	}
	for i, l := range lims {
		if l == nil {
			continue
		}
		for _, n := range l.names {
			for _, r := range replaced {
				if n == r {
					lims[i] = nil
				}
			}
		}
	}
}

// hits is the cost of a descriptor: its own hits_addend when set, else
// the request's, where 0 means 1 as in Envoy. Negative hits (a refund,
// is_negative_hits) are not supported: such a descriptor spends nothing
// and is answered as a query (cost 0: OK when one more hit would pass).
func hits(req *rlspb.RateLimitRequest, d *commonpb.RateLimitDescriptor) int64 {
	if d.GetIsNegativeHits() {
		return 0
	}
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), math.MaxInt64))
	}
	if n := req.GetHitsAddend(); n > 0 {
		return int64(n)
	}
	return 1
}

// overCapacity returns the index of a rate limit whose capacity cost
// exceeds, or -1.
func overCapacity(l *limit, cost int64) int {
	for j, r := range l.rules {
		if cost > r.Capacity() {
			return j
		}
	}
	return -1
}

// counterKey is the key of a descriptor's counter: its entries, each key
// and value length-prefixed so that no two descriptors share a key; the
// rule name already says which config limit it is. A key longer than the
// API allows is replaced by its SHA-256.
func (s *Service) counterKey(sc *scratch, es []*commonpb.RateLimitDescriptor_Entry) string {
	b := sc.key[:0]
	for _, e := range es {
		b = binary.AppendUvarint(b, uint64(len(e.GetKey())))
		b = append(b, e.GetKey()...)
		b = binary.AppendUvarint(b, uint64(len(e.GetValue())))
		b = append(b, e.GetValue()...)
	}
	sc.key = b
	if len(b) > api.MaxKeyLen || !utf8.Valid(b) {
		// A key must be UTF-8 (the router refuses others), and an entry
		// of 128 bytes or more has a length byte that is not: such keys,
		// and long ones, are the SHA-256 in hex. No key written as it is
		// can be 64 hex digits (it has two length bytes per entry, each
		// then ≥ '0', so ≥ 98 bytes), so the two never meet. Was: the raw
		// bytes, refused, so a descriptor with any entry of 128 bytes or
		// more failed the whole call (InvalidArgument).
		sum := sha256.Sum256(b)
		return hex.EncodeToString(sum[:])
	}
	return string(b)
}

// status builds a limited descriptor's status from the decision of its
// j-th rate limit (for a deny-all limit, j is 0 and r is ignored), and
// counts it.
func (s *Service) status(l *limit, j int, r router.Result, d *commonpb.RateLimitDescriptor) *rlspb.RateLimitResponse_DescriptorStatus {
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
	cur := &rlspb.RateLimitResponse_RateLimit{Unit: l.units[j]}
	if l.multiplier > 1 { // the whole window, as the override gave it
		cur.UnitMultiplier = wrapperspb.UInt32(l.multiplier)
	}
	if l.denyAll {
		r = router.Result{}
		// When its window (aligned to the Unix epoch, as every limit's)
		// ends, as envoyproxy/ratelimit says; was: none.
		if w := l.period(j); w > 0 {
			now := s.now().UnixNano()
			st.DurationUntilReset = durationpb.New(time.Duration(int64(w) - now%int64(w)))
		}
	} else {
		rule := l.rules[j]
		cur.RequestsPerUnit = uint32(rule.Limit)
		cur.Name = l.nameOf(j)
		st.LimitRemaining = uint32(min(max(r.Remaining, 0), math.MaxUint32))
		reset := r.ResetAfter
		if !r.Allowed {
			// A denial's reset is never sooner than it may pass: a
			// closed limit answered by its failure mode has no window
			// to end, only a RetryAfter.
			reset = max(reset, r.RetryAfter)
		}
		st.DurationUntilReset = durationpb.New(reset)
	}
	st.CurrentLimit = cur
	result := resultWithin
	if !r.Allowed {
		st.LimitRemaining = 0
		result = resultOver
		if l.shadow {
			result = resultShadow
		} else {
			st.Code = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	s.count(l, d, result)
	return st
}

// unitLength is the length of an RLS unit, 0 for one it does not know.
func unitLength(u rlspb.RateLimitResponse_RateLimit_Unit) time.Duration {
	for _, x := range units {
		if x.u == u {
			return x.d
		}
	}
	return 0
}

// period is the window of the j-th rate limit: its rule's period; for a
// deny-all limit, which has no rule, its unit times an override's
// unit_multiplier.
func (l *limit) period(j int) time.Duration {
	if l.denyAll {
		return unitLength(l.units[j]) * time.Duration(max(l.multiplier, 1))
	}
	return l.rules[j].Period
}

// nameOf returns the name of the j-th rate limit, "" when it has none.
func (l *limit) nameOf(j int) string {
	if j < len(l.rlNames) {
		return l.rlNames[j]
	}
	return ""
}

// count counts a descriptor's result under its metrics key: the config's
// key, with the descriptor's last value when detailed_metric is set (see
// metrics for the bound on those).
func (s *Service) count(l *limit, d *commonpb.RateLimitDescriptor, result string) {
	if !l.detailed {
		s.m.descriptor(l.fullKey, "", result)
		return
	}
	es := d.GetEntries()
	if s.m.descriptor(l.fullKey+"_"+es[len(es)-1].GetValue(), l.fullKey, result) {
		s.log.Warn("rls: detailed_metric values reached their bound; later values are counted under their key and \"_<other>\"",
			"bound", MaxDetailedKeys, "key", l.fullKey)
	}
}

// headerPick is the limited descriptor whose status the x-ratelimit-*
// headers describe, chosen as the statuses are built (a status has its
// limit's unit, not its window), with that limit's window.
type headerPick struct {
	st     *rlspb.RateLimitResponse_DescriptorStatus
	window time.Duration
}

// offer puts forward a limited descriptor's status and its limit's
// window. The one that decides the answer is kept: one that is
// OVER_LIMIT, the latest to reset, when any is; else the one with the
// least remaining.
func (p *headerPick) offer(st *rlspb.RateLimitResponse_DescriptorStatus, window time.Duration) {
	over := func(st *rlspb.RateLimitResponse_DescriptorStatus) bool {
		return st.Code == rlspb.RateLimitResponse_OVER_LIMIT
	}
	if p.st == nil ||
		over(st) && (!over(p.st) || st.DurationUntilReset.AsDuration() > p.st.DurationUntilReset.AsDuration()) ||
		!over(st) && !over(p.st) && st.LimitRemaining < p.st.LimitRemaining {
		p.st, p.window = st, window
	}
}

// headerSet is the three x-ratelimit-* headers, in one allocation.
type headerSet struct {
	v [3]corepb.HeaderValue
	p [3]*corepb.HeaderValue
}

// addHeaders adds x-ratelimit-* for the status p picked, if any, to resp,
// which has no headers yet. The form is that of Envoy's own rate-limit
// filter (draft 03 of the IETF RateLimit header fields: the limit with
// its window in seconds, the remaining count, seconds until reset).
func addHeaders(resp *rlspb.RateLimitResponse, p *headerPick) {
	if p.st == nil {
		return
	}
	limit := strconv.FormatUint(uint64(p.st.CurrentLimit.GetRequestsPerUnit()), 10)
	reset := int64(0)
	if p.st.DurationUntilReset != nil {
		reset = int64((p.st.DurationUntilReset.AsDuration() + time.Second - 1) / time.Second)
	}
	h := new(headerSet)
	h.v[0].Key, h.v[0].Value = "x-ratelimit-limit", limit+", "+limit+";w="+strconv.FormatInt(max(int64(p.window/time.Second), 1), 10)
	h.v[1].Key, h.v[1].Value = "x-ratelimit-remaining", strconv.FormatUint(uint64(p.st.LimitRemaining), 10)
	h.v[2].Key, h.v[2].Value = "x-ratelimit-reset", strconv.FormatInt(reset, 10)
	h.p = [3]*corepb.HeaderValue{&h.v[0], &h.v[1], &h.v[2]}
	resp.ResponseHeadersToAdd = h.p[:]
}

// grpcError maps a router error to a gRPC status.
func grpcError(err error) error {
	var ie *router.ItemError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, api.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &ie):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, fmt.Sprintf("rls: %v", err))
}
