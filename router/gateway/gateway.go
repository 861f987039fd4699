// Package gateway is ringlimit's reverse proxy (README.md, "Gateway"):
// it matches the request to a route, finds who the request comes from
// when a limit will be checked (a verified JWT claim, an API-key header
// or the client IP; a route's tier asks for the claim), decides the
// route's limits through a Checker (the router: the owners over the data
// plane, or an embedded member), and forwards what is allowed to the
// upstream with httputil.ReverseProxy. Denied requests get 429 with the
// rate-limit headers and never reach the upstream; leaky_bucket limits
// shape, holding the request for its delay.
//
// Several limits on one route must all allow, and a request denied by
// one spends nothing of the others: the route's limits go to the router
// in one call as one group (router.Request.Joined). Limits keyed alike
// (the client, or its IP with rules.KeyIP) have one owner, which decides
// them under its partition's lock, all-or-nothing: exact, with no race
// between limits. A route mixing per-client and per-IP limits has two
// keys, which may have two owners; the router then queries before it
// spends (see package router), which never admits more than a limit
// allows.
//
// A Gateway is safe for concurrent use; it keeps no per-client state.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/repeats"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
)

// Checker decides checks: a *router.Router (following the cluster, or a
// member's own) implements it.
type Checker interface {
	// Check decides reqs into out (see router.Router.Check).
	Check(ctx context.Context, reqs []router.Request, out []router.Result) error
	// View returns the rules in force (for the headers' windows and the
	// retry times of costs over 1); nil before the first.
	View() *router.View
}

var _ Checker = (*router.Router)(nil)

// Config configures a Gateway.
type Config struct {
	// Upstream is the service behind the gateway (required unless Next
	// is set).
	Upstream *url.URL
	// Transport carries requests to Upstream; nil = http.DefaultTransport.
	// When it is an *http.Transport with a ResponseHeaderTimeout, an
	// upstream whose response headers do not come within it is answered
	// 504 gateway_timeout (every other upstream failure 502).
	Transport http.RoundTripper
	// Next, when set, receives the allowed requests instead of a reverse
	// proxy to Upstream (the gateway used as net/http middleware).
	Next http.Handler
	// Routes are tried in order; a request matching none passes
	// unlimited. Nil routes limit every request by the rule "default".
	Routes []rules.Route
	// Identity says how clients are told apart.
	Identity Identity
	// Registerer receives the gateway's metrics; nil = not registered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock of token expiry and of X-RateLimit-Reset; nil =
	// time.Now.
	Now func() time.Time
	// After waits for a shaped request's delay; nil = time.After.
	After func(time.Duration) <-chan time.Time
	// HeldBodyLimit is how many bytes of a shaped request's body are
	// read into memory before it is held, so that a client leaving
	// while held is noticed (see holdBody); 0 = DefaultHeldBodyLimit,
	// below 0 = none. It bounds the memory of each held request.
	HeldBodyLimit int64
}

// DefaultHeldBodyLimit is Config.HeldBodyLimit's default: 64 KiB.
const DefaultHeldBodyLimit = 64 << 10

// DefaultRoutes limits every request by the rule "default".
func DefaultRoutes() []rules.Route {
	return []rules.Route{{Name: "default", Path: "/*", Limits: []rules.Limit{{Rule: rules.DefaultName, Cost: 1}}}}
}

// Gateway is the http.Handler New returns.
type Gateway struct {
	cfg     Config
	checker Checker
	next    http.Handler
	log     *slog.Logger
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time
	m       *metrics
	routes  atomic.Pointer[routeSet] // the routes in force; SetRoutes swaps them whole
	// fallback is the routes before the last SetRoutes, or those
	// SetNextRoutes said come next, for a while (resolvable).
	fallback atomic.Pointer[routeFallback]

	// Lines a client's requests can repeat at their rate (an upstream
	// down, a route naming a rule the cluster lacks) are logged once per
	// logWindow per kind and route, with the count held back since.
	logMu   sync.Mutex
	logRep  *repeats.Repeats // guarded by logMu
	logZero time.Time
}

// logWindow is how long the gateway holds back repeats of a line.
const logWindow = 30 * time.Second

// logRepeated logs msg at level unless a line of key was logged within
// logWindow; a line logged after some were held back says how many.
func (g *Gateway) logRepeated(key string, level slog.Level, msg string, args ...any) {
	g.logMu.Lock()
	log, held := g.logRep.SeeAt(key, g.now().Sub(g.logZero))
	g.logMu.Unlock()
	if !log {
		return
	}
	msg, args = repeats.Summary(msg, args, held, logWindow)
	g.log.Log(context.Background(), level, msg, args...)
}

// New returns a gateway that decides with c.
func New(cfg Config, c Checker) (*Gateway, error) {
	g := &Gateway{cfg: cfg, checker: c, next: cfg.Next, log: cfg.Logger, now: cfg.Now, after: cfg.After}
	if g.next == nil {
		if cfg.Upstream == nil || cfg.Upstream.Host == "" {
			return nil, errors.New("gateway: an upstream URL is required")
		}
		p := httputil.NewSingleHostReverseProxy(cfg.Upstream)
		p.Transport = cfg.Transport
		p.ErrorHandler = g.upstreamError
		p.ErrorLog = log.New(proxyLog{g}, "", 0)
		p.ModifyResponse = dropUpstreamXRateLimit
		g.next = p
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.SetRoutes(cfg.Routes)
	if g.after == nil {
		g.after = time.After
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	g.m = m
	g.logRep, g.logZero = repeats.New(logWindow, 1024), g.now()
	return g, nil
}

// SetRoutes replaces the routes in force, whole: a request is matched
// against the old set or the new one, never a mix. Nil routes limit
// every request by the rule "default" (DefaultRoutes). The gateway keeps
// routes; the caller must not change them afterwards.
func (g *Gateway) SetRoutes(routes []rules.Route) {
	if routes == nil {
		routes = DefaultRoutes()
	}
	set := &routeSet{routes: routes, upper: slices.ContainsFunc(routes, func(r rules.Route) bool { return hasUpper(r.Path) }), named: map[string]bool{}}
	for _, r := range routes {
		if r.Unlimited && !strings.Contains(r.Path, "*") {
			set.named[r.Path] = true
		}
	}
	if old := g.routes.Swap(set); old != nil {
		g.fallback.Store(&routeFallback{routes: old.routes, until: g.now().Add(routeFallbackFor)})
	}
}

// maxPathBytes bounds a request's path, decoded or as sent (414 past it).
const maxPathBytes = 8 << 10

// routeSet is the routes in force, whether a path pattern of theirs
// holds a capital letter (every request is then matched case-
// insensitively too: matchReadings), and the paths their unlimited
// routes name exactly (read without an extension or script: none).
type routeSet struct {
	routes []rules.Route
	upper  bool
	named  map[string]bool
}

// SetNextRoutes says which routes will be put in force next, once the
// rules they name are (an embedded gateway writes its file's rules, then
// puts its routes in force): until then, or for routeFallbackFor, a
// request whose route names a rule removed meanwhile is checked by the
// route of its name there (resolvable). The gateway keeps next.
func (g *Gateway) SetNextRoutes(next []rules.Route) {
	g.fallback.Store(&routeFallback{routes: next, until: g.now().Add(routeFallbackFor)})
}

// routeFallback is a route table that stands in for the one in force,
// route by route, until a time (resolvable).
type routeFallback struct {
	routes []rules.Route
	until  time.Time
}

// routeFallbackFor is how long the routes before a change (or after it,
// SetNextRoutes) stand in for the routes in force: the two steps of a
// change take milliseconds; a route that names a rule for longer is a
// mistake, answered 500 and logged.
const routeFallbackFor = 10 * time.Second

// resolvable returns route or, when the checker's view lacks a rule it
// names, the route of its name in the fallback table (while it lasts)
// if the view has every rule of that one. A change of a route's rule
// comes in two steps — the rules are written, then the routes follow
// (or the routes are set a moment before this process's view has the
// rules) — and between them a route named a rule the view no longer (or
// not yet) had. Was: answered 500 (an audit: 15 of 16 reloads of an
// embedded gateway that swapped a route's rule, up to 440 requests each).
func (g *Gateway) resolvable(route *rules.Route, now time.Time) *rules.Route {
	v := g.checker.View()
	if v == nil || knowsRules(v, route) {
		return route
	}
	fb := g.fallback.Load()
	if fb == nil || !now.Before(fb.until) {
		return route
	}
	for i := range fb.routes {
		if r := &fb.routes[i]; r.Name == route.Name && !r.Unlimited && knowsRules(v, r) {
			return r
		}
	}
	return route
}

// knowsRules reports whether v has every rule route's limits name.
func knowsRules(v *router.View, route *rules.Route) bool {
	for _, l := range route.Limits {
		if v.Rules[l.Rule] == nil {
			return false
		}
	}
	return true
}

// parseCost reads a cost header's value as HTTP reads Content-Length:
// one or more ASCII digits, nothing else (no sign, no spaces inside), at
// most what an int64 holds. Was: strconv.ParseInt, which also took "+5"
// and "-0", numbers an upstream reading the same header as digits may
// refuse or read otherwise than the gateway charged. The error says
// what is wrong with v, for the client's 400.
func parseCost(v string) (int64, error) {
	if strings.Contains(v, ",") {
		return 0, errors.New("given as a list; want one non-negative integer cost")
	}
	if v == "" || strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, errors.New("want a non-negative integer cost, in decimal digits")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is over the largest cost, %d", v, int64(math.MaxInt64))
	}
	return n, nil
}

// dropUpstreamXRateLimit removes an upstream's own X-RateLimit-Limit,
// -Remaining and -Reset from its response, so that the client gets the
// gateway's alone: they hold one number each, and the proxy would add the
// upstream's after the gateway's (was: two of each, a client reading
// one or the other). RateLimit and RateLimit-Policy are lists of
// policies (structured fields), so the upstream's entries stay, after
// the gateway's; so does an upstream's Retry-After.
func dropUpstreamXRateLimit(resp *http.Response) error {
	for _, k := range [...]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		resp.Header.Del(k)
	}
	return nil
}

// upstreamError is the reverse proxy's ErrorHandler: a forwarded request
// the upstream failed is answered 504 gateway_timeout when its response
// headers did not come within the Transport's ResponseHeaderTimeout, else
// 502 bad_gateway (unreachable, refused, cut off, a dial or TLS timeout).
// Either is counted and logged as an upstream failure, unless the client
// had gone.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg := http.StatusBadGateway, "bad_gateway", "upstream unreachable"
	if headerTimeout(err) {
		status, code, msg = http.StatusGatewayTimeout, "gateway_timeout", "upstream did not answer in time"
	}
	if r.Context().Err() == nil {
		// By status: a dead upstream (502) and a slow one (504) call for
		// different fixes. Was: one counter for both.
		g.m.upstreams.WithLabelValues(strconv.Itoa(status)).Inc()
		g.logRepeated("upstream", slog.LevelWarn, "gateway: upstream failed", "err", err)
	}
	client.WriteError(w, status, code, msg)
}

// underscored returns the first key of h that spells name with
// underscores for (some of) its dashes (dashed), or "" when none does.
func underscored(h http.Header, name string) string {
	for k := range h {
		if d := dashed(k); d != "" && strings.EqualFold(d, name) {
			return k
		}
	}
	return ""
}

// exemptAsSent reports whether an unlimited route that matched u's
// decoded path may exempt it: not when the path as sent holds an
// encoded slash or backslash (%2F, %5C, either case). Decoded, those
// merge onto an exempt path (/public/%2F → /public// → /public/), while
// an upstream that keeps %2F within a segment (Express, Rails), or takes
// a backslash for a slash, serves a resource below it (README: an
// exemption never covers more than it says). Other escapes (%C3%A9 as
// %c3%a9, %61) are what they decode to. Was: exempt.
//
// A backslash is looked for in the decoded path: %5C is Go's own
// encoding of one, so RawPath is empty for a path that sends it so (and
// for one that sends it as is, which Go accepts), and /public/%5C,
// /public/..%5Cadmin and /public/..\admin were exempt under /public/*,
// forwarded to an upstream that may read /admin (a helper attacking the
// gateway).
func exemptAsSent(u *url.URL) bool {
	if strings.ContainsRune(u.Path, '\\') {
		return false
	}
	raw := u.RawPath // "" when the path was sent as its decoded form's encoding
	for i := strings.IndexByte(raw, '%'); i >= 0 && i+2 < len(raw); i = strings.IndexByte(raw, '%') {
		switch strings.ToUpper(raw[i+1 : i+3]) {
		case "2F", "5C":
			return false
		}
		raw = raw[i+1:]
	}
	return true
}

// dropConnectionHeaders removes from h the headers its Connection
// header names: hop-by-hop (RFC 9110, 7.6.1), dropped by the reverse
// proxy before it forwards, so the gateway identifies and charges a
// request by the headers its upstream gets. Was: it read them first, so
// "Connection: X-Api-Key" keyed a request by a key the upstream never
// saw (a fresh budget per request for a caller the upstream served as
// anonymous), and so for a cost header or Authorization. Upgrade stays:
// the proxy reads it for a protocol switch.
//
// The tokens it names are taken out of Connection too (Upgrade, close
// and keep-alive stay), so that the proxy does not drop the headers the
// gateway sets after this under those names (X-Forwarded-Host, say).
func dropConnectionHeaders(h http.Header) {
	vs := h["Connection"]
	if len(vs) == 0 {
		return
	}
	var keep []string
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			switch f = textproto.TrimString(f); {
			case f == "":
			case strings.EqualFold(f, "Upgrade") || strings.EqualFold(f, "close") || strings.EqualFold(f, "keep-alive"):
				keep = append(keep, f)
			case !strings.EqualFold(f, "Connection"):
				h.Del(f)
			}
		}
	}
	if len(keep) == 0 {
		h.Del("Connection")
		return
	}
	h["Connection"] = []string{strings.Join(keep, ", ")}
}

// proxyLog takes the reverse proxy's own log lines, which it writes
// once its answer's headers are sent: an upstream that cut its body off
// ("read error during body copy"; a client that left is not logged) is
// an upstream failure, counted under 502 as one cut off before its
// headers is. Every line is logged once per logWindow. Was: the
// standard logger's, one WARN per request, and the failure not counted.
type proxyLog struct{ g *Gateway }

func (l proxyLog) Write(b []byte) (int, error) {
	msg := strings.TrimSpace(string(b))
	if strings.Contains(msg, "read error during body copy") {
		l.g.m.upstreams.WithLabelValues(strconv.Itoa(http.StatusBadGateway)).Inc()
		l.g.logRepeated("upstream-cut", slog.LevelWarn, "gateway: upstream answer cut off", "err", msg)
		return len(b), nil
	}
	l.g.logRepeated("proxy", slog.LevelWarn, "gateway: reverse proxy", "err", msg)
	return len(b), nil
}

// headerTimeout reports whether err is an http.Transport's
// ResponseHeaderTimeout expiring (HTTP/1 or HTTP/2). net/http exports no
// sentinel for it: its errors are unexported net.Errors whose Timeout()
// is true and whose text says "timeout awaiting response headers". The
// text is matched too, since a dial timeout is also a net.Error with
// Timeout() true (and errors.Is context.DeadlineExceeded, as the header
// timeout is), and stays a 502.
func headerTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && strings.Contains(err.Error(), "timeout awaiting response headers")
}

// ServeHTTP matches, identifies, limits, shapes and forwards one
// request. The client is identified (its token verified) only when that
// decides the route (a route with a tier matches the method and path) or
// when a limit will be checked: a request that matches no route, or an
// unlimited one listed before any tier route it matches, is forwarded
// unchecked whatever its Authorization or API-key headers say. Was:
// identified first, so an expired token sent to an unlimited
// token-refresh route got 401, and two API-key headers 400, on paths the
// gateway does not limit; and the refusals were counted under route "".
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Path) > maxPathBytes || len(r.URL.RawPath) > maxPathBytes {
		// Matching costs each reading of the path a pass over the
		// routes, and a "*" segment a scan of the path's: bounded by
		// the path's length. nginx refuses a request line past 8 KiB
		// too (414). Was: up to the 64 KiB of the headers (a helper
		// attacking the gateway: 93 ms per request at 1,000 routes
		// starting with "*").
		g.m.outcome("", "bad_request")
		client.WriteError(w, http.StatusRequestURITooLong, api.CodeBadRequest,
			fmt.Sprintf("request path of %d bytes, over the %d the gateway reads", max(len(r.URL.Path), len(r.URL.RawPath)), maxPathBytes))
		return
	}
	dropConnectionHeaders(r.Header)
	g.cfg.Identity.forwarding(r)
	now := g.now()
	var (
		who        caller
		identified bool
		whoErr     error
	)
	identify := func() (string, error) { // once per request
		if !identified {
			who, whoErr = g.cfg.Identity.identify(r, now)
			identified = true
		}
		return who.tier, whoErr
	}
	route, also, err := matchReadings(g.routes.Load(), r, identify)
	if err == nil && route != nil && !route.Unlimited {
		_, err = identify()
	}
	if errors.Is(err, errTooManyMethods) || errors.Is(err, errTooManyReadings) {
		g.m.outcome("", "bad_request")
		client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	if errors.Is(err, ErrAmbiguous) {
		g.m.outcome(route.Name, "bad_request")
		client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, strings.TrimPrefix(err.Error(), "gateway: "))
		return
	}
	if err != nil {
		// Why, so an operator can tell a wrong audience from an expired
		// token; the reason, never the token (one line per window).
		g.logRepeated("unauthorized", slog.LevelInfo, "gateway: bearer token refused", "err", err)
		g.m.outcome(route.Name, "unauthorized")
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		client.WriteError(w, http.StatusUnauthorized, api.CodeUnauthorized, "bearer token refused")
		return
	}
	if route == nil || route.Unlimited {
		name := ""
		if route != nil {
			name = route.Name
		}
		g.m.outcome(name, "unlimited")
		g.next.ServeHTTP(w, r)
		return
	}
	route = g.resolvable(route, now)
	for _, a := range also {
		route = joinLimits(route, g.resolvable(a, now))
	}
	reqs := make([]router.Request, len(route.Limits))
	ipKey := ""
	for i, l := range route.Limits {
		key := who.key
		if l.ByIP() {
			if ipKey == "" {
				ipKey = g.cfg.Identity.ipKey(r)
			}
			key = ipKey
		}
		reqs[i] = router.Request{Rule: l.Rule, Key: key, Cost: l.Cost}
		if h := l.CostHeader(); h != "" {
			reqs[i].Cost = 1
			if k := underscored(r.Header, h); k != "" {
				// CGI, WSGI and Rack read X_Token_Estimate as
				// X-Token-Estimate: the upstream got a cost the gateway
				// never read, and charged 1 (a helper attacking the
				// gateway: 300 tokens through a limit of 100). Refused
				// as a cost given twice is.
				g.m.outcome(route.Name, "bad_request")
				client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("%s: the cost header %s spelled with underscores, which upstreams may read as it; send %s once", k, h, h))
				return
			}
			vs := r.Header.Values(h)
			if len(vs) > 1 {
				// Was: the first value spent (r.Header.Get) while the
				// upstream got both, so "1" then "99" paid 1 for 99;
				// refused as "1, 99" on one line is, and as a client
				// named twice is.
				g.m.outcome(route.Name, "bad_request")
				client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("%s: given %d times; want one non-negative integer cost", h, len(vs)))
				return
			}
			if v := r.Header.Get(h); v != "" {
				n, err := parseCost(v)
				if err != nil {
					g.m.outcome(route.Name, "bad_request")
					client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, h+": "+err.Error())
					return
				}
				// A forwarded request spends at least 1, whatever it
				// says of itself: the header is the caller's, and a
				// cost of 0 is a query that spends nothing. Was: every
				// request saying 0 passed while 1 unit was left.
				reqs[i].Cost = max(n, 1)
				if v := g.checker.View(); v != nil {
					if rule := v.Rules[l.Rule]; rule != nil && n > rule.Capacity() {
						// Said in the header's terms. Was the limiter's
						// "bad request: limiter: cost out of range: cost
						// 101, rule … allows 0 to 100" (0: a query, which
						// a forwarded request never is).
						g.m.outcome(route.Name, "bad_request")
						client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest,
							fmt.Sprintf("%s: %d is more than rule %q allows for one request (at most %d)", h, n, l.Rule, rule.Capacity()))
						return
					}
				}
			}
		}
	}
	if len(also) > 0 {
		reqs, route = mergeRepeated(reqs, route)
	}
	out, err := g.decide(r.Context(), reqs)
	if err != nil {
		g.checkError(w, r, route, err)
		return
	}
	v := g.checker.View()
	show, delay := pick(reqs, out, v)
	rl := client.RateLimit{Policy: reqs[show].Rule, Window: window(v, reqs[show].Rule), Decision: client.DecisionOf(out[show])}
	if !out[show].Allowed {
		g.m.outcome(route.Name, "denied")
		client.WriteDenied(w, rl, now)
		return
	}
	client.SetHeaders(w.Header(), rl, now)
	if delay > 0 {
		g.m.shaped.Observe(delay.Seconds())
		decided := g.now()
		if err := g.holdBody(r); err != nil {
			g.m.outcome(route.Name, "gone")
			client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "reading the request body: "+err.Error())
			return // the client left mid-body, or sent a broken one
		}
		// The body's read counts toward the delay: released no earlier
		// than the limiter said, and no later than needed.
		var release <-chan time.Time
		if wait := delay - g.now().Sub(decided); wait > 0 {
			release = g.after(wait)
		} else {
			c := make(chan time.Time, 1)
			c <- time.Time{}
			release = c
		}
		select {
		case <-release:
		case <-r.Context().Done():
			g.m.outcome(route.Name, "gone")
			return // the client left: nothing to forward
		}
		if r.Context().Err() != nil {
			g.m.outcome(route.Name, "gone")
			return
		}
	}
	g.m.outcome(route.Name, "allowed")
	g.next.ServeHTTP(w, r)
}

// holdBody reads r's body into memory, up to the held-body limit,
// before a shaped request is held. net/http notices a client that
// closes its connection (and cancels r's context) only once the handler
// has read the request body to its end: a held request with an unread
// body was forwarded after its client had gone. Was: README's "a client
// that goes away while held is never forwarded" held for bodiless
// requests alone. A body over the limit is left to stream as it came
// (its first bytes read already go first): its client's departure is
// noticed only when the upstream reads it. An error means the body
// could not be read (the client left mid-body, a broken chunk).
func (g *Gateway) holdBody(r *http.Request) error {
	limit := g.cfg.HeldBodyLimit
	if limit == 0 {
		limit = DefaultHeldBodyLimit
	}
	if limit < 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	orig := r.Body
	buf, err := io.ReadAll(io.LimitReader(orig, limit+1))
	if err != nil {
		return err
	}
	if int64(len(buf)) <= limit {
		r.Body = io.NopCloser(bytes.NewReader(buf)) // read to its end: the server watches the connection now
		return nil
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), orig), orig}
	return nil
}

// decide spends reqs as one group: all or nothing. out[i].Allowed false
// on any entry means refused; the limit that denied has the RetryAfter.
// A cost that can never pass is refused by the router as a bad request.
func (g *Gateway) decide(ctx context.Context, reqs []router.Request) ([]router.Result, error) {
	out := make([]router.Result, len(reqs))
	for i := 1; i < len(reqs); i++ {
		reqs[i].Joined = true
	}
	return out, g.checker.Check(ctx, reqs, out)
}

// pick returns the result the headers describe — the denial with the
// longest retry when denied, else the limit with the least remaining —
// and the longest shaping delay.
func pick(reqs []router.Request, out []router.Result, v *router.View) (show int, delay time.Duration) {
	show = -1
	for i := range out {
		delay = max(delay, out[i].Delay)
		if !out[i].Allowed {
			if show < 0 || out[show].Allowed || out[i].RetryAfter > out[show].RetryAfter {
				show = i
			}
			continue
		}
		if show < 0 || (out[show].Allowed && out[i].Remaining < out[show].Remaining) {
			show = i
		}
	}
	return show, delay
}

func window(v *router.View, rule string) time.Duration {
	if v != nil {
		if r := v.Rules[rule]; r != nil {
			return r.Period
		}
	}
	return time.Second
}

// itemMessage is err's message for a client: a check of the route's
// limits is named by its rule, not by its place in the gateway's batch
// (checks[1] means nothing to a client).
func itemMessage(route *rules.Route, err error) string {
	var ie *router.ItemError
	if errors.As(err, &ie) && ie.Index >= 0 && ie.Index < len(route.Limits) {
		return fmt.Sprintf("limit %q: %v", route.Limits[ie.Index].Rule, ie.Err)
	}
	return err.Error()
}

// checkError answers a Checker error.
func (g *Gateway) checkError(w http.ResponseWriter, r *http.Request, route *rules.Route, err error) {
	switch {
	case r.Context().Err() != nil:
		g.m.outcome(route.Name, "gone")
	case errors.Is(err, api.ErrBadRequest), errors.Is(err, limiter.ErrCost):
		g.m.outcome(route.Name, "bad_request")
		client.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, itemMessage(route, err))
	case errors.Is(err, router.ErrUnknownRule):
		g.m.outcome(route.Name, "error")
		g.logRepeated("unknown rule "+route.Name, slog.LevelError, "gateway: a route names a rule the cluster does not have", "route", route.Name, "err", err)
		client.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("route %q: %s", route.Name, itemMessage(route, err)))
	default:
		g.m.outcome(route.Name, "error")
		// A limiter with no cluster view yet, or unreachable: worth a
		// retry soon. Was: 503 without Retry-After.
		w.Header().Set("Retry-After", "1")
		client.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "rate limiter unavailable")
	}
}

// matchPath is the path routes are matched against: r.URL.Path (decoded)
// with its dot segments resolved and repeated slashes merged, a trailing
// slash kept (rules.MatchRoute ignores it for routes with limits). The
// request is forwarded as it came, and an upstream that resolves
// "/x/../chat" or "//chat" serves "/chat": matched as they came, such
// paths went past "/chat"'s limits. Being decoded, an encoded slash
// ("%2F") is a slash here: "/a%2Fb" is matched as "/a/b", and
// "/login%2F" as "/login/". So is a backslash, sent as is or as %5C:
// an upstream may take it for a slash (IIS, and servers on Windows), and
// "/admin\users" or "/x/..\admin" went past "/admin/users"'s limits.
func matchPath(p string) string {
	p = absolute(strings.ReplaceAll(p, "\\", "/"))
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}
