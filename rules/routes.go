package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// Route says which rules limit the requests a gateway matches to it. It
// is read from the "routes:" list of a rules document:
//
//	routes:
//	  - name: chat-free
//	    methods: [POST]            # optional; any method when left out
//	    path: /v1/chat/*           # "*" is one path segment; a final "/*" is anything below
//	    tier: free                 # optional; any tier when left out
//	    limits:
//	      - rule: chat-rpm         # cost 1
//	      - rule: chat-tpm
//	        cost_from: header:X-Token-Estimate
//	      - rule: uploads
//	        cost: 5                # a constant cost
//	      - rule: chat-per-ip
//	        key: ip                # keyed by the client IP, whatever the caller sends
//	  - name: health
//	    path: /healthz
//	    unlimited: true            # matched, and passed without a check
type Route struct {
	Name    string   `json:"name"`
	Methods []string `json:"methods,omitempty"` // upper case
	Path    string   `json:"path"`
	Tier    string   `json:"tier,omitempty"`
	Limits  []Limit  `json:"limits"`
	// Unlimited routes have no limits: the requests they match pass
	// unchecked (health checks, CORS preflights), so that a later
	// catch-all route does not limit them.
	Unlimited bool `json:"unlimited,omitempty"`
}

// Limit is one rule a route's requests must pass, and what each request
// costs under it.
type Limit struct {
	Rule string `json:"rule"`
	// Cost is a constant cost (1 when left out). Ignored with CostFrom.
	Cost int64 `json:"cost,omitempty"`
	// CostFrom is "header:NAME": the cost is the integer in that request
	// header (1 when the header is absent, and at least 1: a forwarded
	// request always spends).
	CostFrom string `json:"cost_from,omitempty"`
	// Key says what the limit is keyed by: "" or KeyClient for the
	// client as the gateway identifies it (a verified JWT claim, else the
	// API-key header, else the IP), KeyIP for the client IP alone. An
	// API key is whatever the caller sends (the gateway does not verify
	// it), so a caller that makes up a new one per request gets a new
	// budget each time under KeyClient; a KeyIP limit holds it.
	Key string `json:"key,omitempty"`
}

// The values of Limit.Key.
const (
	KeyClient = "client" // the identity chain: JWT claim, else API key, else IP (the default)
	KeyIP     = "ip"     // the client IP alone, keyed "ip:ADDR"
)

// ByIP reports whether l is keyed by the client IP alone.
func (l Limit) ByIP() bool { return l.Key == KeyIP }

// CostHeader returns the header named by CostFrom, or "" for a constant
// cost.
func (l Limit) CostHeader() string {
	h, _ := strings.CutPrefix(l.CostFrom, "header:")
	return h
}

// MaxRoutes is the most routes one document may hold; MaxRouteLimits the
// most limits one route may have.
const (
	MaxRoutes      = 1000
	MaxRouteLimits = 16
)

// RouteError says what is wrong with a route, and where. It wraps
// ErrInvalid. Its message reads
//
//	route "chat-free": limits[1].cost_from: must be header:NAME, got "body"
type RouteError struct {
	Index int    // the route's position in the document; -1 for the document
	Route string // its name when it has a valid one
	Field string // "path", "limits[1].rule", ...
	Msg   string
}

func (e *RouteError) Error() string {
	var s string
	switch {
	case e.Route != "":
		s = "route " + strconv.Quote(e.Route) + ": "
	case e.Index >= 0:
		s = "routes[" + strconv.Itoa(e.Index) + "]: "
	default:
		s = "routes: "
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Msg
}

// Unwrap returns ErrInvalid.
func (e *RouteError) Unwrap() error { return ErrInvalid }

// ParseRoutes reads the "routes:" list of a rules document (YAML or
// JSON; the "rules:" list is Parse's). A document without routes gives
// none. Each route needs a valid unique name, a path starting with "/"
// and either at least one limit naming a rule or unlimited: true (and
// then no limits); unknown fields are refused. That
// the named rules exist is CheckRoutes' business, against a rule set.
func ParseRoutes(data []byte) ([]Route, error) {
	if len(data) > MaxDocumentSize {
		return nil, &RouteError{Index: -1, Msg: fmt.Sprintf("document of %d bytes, over the limit of %d", len(data), MaxDocumentSize)}
	}
	js, err := yamlToJSON(data)
	if err != nil {
		return nil, &RouteError{Index: -1, Msg: "not valid YAML or JSON: " + strings.Join(strings.Fields(err.Error()), " ")}
	}
	js = bytes.TrimSpace(js)
	if isNull(js) {
		return nil, nil
	}
	var top map[string]json.RawMessage
	if js[0] != '{' || json.Unmarshal(js, &top) != nil {
		return nil, &RouteError{Index: -1, Msg: "the document must be a mapping"}
	}
	raw := bytes.TrimSpace(top["routes"])
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, &RouteError{Index: -1, Msg: "must be a list of routes, got " + rawText(raw)}
	}
	if len(items) > MaxRoutes {
		return nil, &RouteError{Index: -1, Msg: fmt.Sprintf("%d routes, over the limit of %d", len(items), MaxRoutes)}
	}
	out := make([]Route, len(items))
	seen := map[string]int{}
	for i, it := range items {
		if err := parseRoute(i, it, &out[i]); err != nil {
			return nil, err
		}
		if j, dup := seen[out[i].Name]; dup {
			return nil, &RouteError{Index: i, Route: out[i].Name, Field: "name", Msg: fmt.Sprintf("duplicate name: routes[%d] and routes[%d]", j, i)}
		}
		seen[out[i].Name] = i
	}
	return out, nil
}

// routeFields and limitFields are the fields a route and one of its
// limits may have, matched exactly (encoding/json would fold their case,
// so that "Path" beside "path" slipped past strict decoding).
var (
	routeFields = []string{"name", "methods", "path", "tier", "limits", "unlimited"}
	limitFields = []string{"rule", "cost", "cost_from", "key"}
)

func parseRoute(i int, raw json.RawMessage, r *Route) error {
	raw = bytes.TrimSpace(raw)
	var fields map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &fields) != nil {
		return &RouteError{Index: i, Msg: "must be a mapping of " + strings.Join(routeFields, ", ") + ", got " + rawText(raw)}
	}
	// The name first, so that every later message can use it.
	e := &RouteError{Index: i}
	fail := func(field, format string, a ...any) error {
		e.Field, e.Msg = field, fmt.Sprintf(format, a...)
		return e
	}
	if v, ok := present(fields, "name"); ok {
		if json.Unmarshal(v, &r.Name) != nil {
			return fail("name", "must be a string, got %s%s", rawText(v), quoteHint(v))
		}
	}
	if !limiter.ValidName(r.Name) {
		return fail("name", "missing or invalid: letters, digits, '-', '_' and '.', got %s", quoteTrunc(r.Name))
	}
	e.Route = r.Name
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(routeFields, k) {
			return fail(truncate(k), "unknown field (want %s)", strings.Join(routeFields, ", "))
		}
	}
	var limits []json.RawMessage
	for _, f := range []struct {
		name, want string
		v          any
	}{
		{"methods", "list of strings", &r.Methods}, {"path", "string", &r.Path}, {"tier", "string", &r.Tier},
		{"unlimited", "bool (true or false)", &r.Unlimited}, {"limits", "list", &limits},
	} {
		if v, ok := present(fields, f.name); ok && json.Unmarshal(v, f.v) != nil {
			return fail(f.name, "must be a %s, got %s", f.want, rawText(v))
		}
	}
	if !strings.HasPrefix(r.Path, "/") {
		return fail("path", "must start with /, got %s", quoteTrunc(r.Path))
	}
	if msg := unmatchablePath(r.Path); msg != "" {
		return fail("path", "%s, got %s", msg, quoteTrunc(r.Path))
	}
	for k, m := range r.Methods {
		if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
			return fail(fmt.Sprintf("methods[%d]", k), "not an HTTP method: %s", quoteTrunc(m))
		}
		r.Methods[k] = strings.ToUpper(m)
	}
	switch {
	case r.Unlimited && len(limits) > 0:
		return fail("limits", "an unlimited route takes no limits, got %d", len(limits))
	case r.Unlimited:
		return nil
	case len(limits) == 0 || len(limits) > MaxRouteLimits:
		return fail("limits", "want 1 to %d limits (or unlimited: true), got %d", MaxRouteLimits, len(limits))
	}
	r.Limits = make([]Limit, len(limits))
	for k, lr := range limits {
		if err := parseLimit(lr, &r.Limits[k], func(field, format string, a ...any) error {
			return fail(fmt.Sprintf("limits[%d]", k)+field, format, a...)
		}); err != nil {
			return err
		}
		// A rule named twice is one bucket spent twice by one request:
		// refused. Also with one of them "key: ip": a client known by
		// its IP alone has the same key under both.
		if j := slices.IndexFunc(r.Limits[:k], func(l Limit) bool { return l.Rule == r.Limits[k].Rule }); j >= 0 {
			return fail(fmt.Sprintf("limits[%d].rule", k), "names rule %q again (limits[%d]): give it one limit with the summed cost, or a second rule for a per-IP limit (a client known by its IP has one key under both)", r.Limits[k].Rule, j)
		}
	}
	return nil
}

// parseLimit decodes one limit of a route into l; fail names the field
// (".rule", ...; "" for the limit itself).
func parseLimit(raw json.RawMessage, l *Limit, fail func(field, format string, a ...any) error) error {
	raw = bytes.TrimSpace(raw)
	var fields map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &fields) != nil {
		return fail("", "must be a mapping of %s, got %s", strings.Join(limitFields, ", "), rawText(raw))
	}
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(limitFields, k) {
			return fail("."+truncate(k), "unknown field (want %s)", strings.Join(limitFields, ", "))
		}
	}
	if v, ok := present(fields, "rule"); ok && json.Unmarshal(v, &l.Rule) != nil {
		return fail(".rule", "must be a string, got %s%s", rawText(v), quoteHint(v))
	}
	cost, hasCost := present(fields, "cost")
	if hasCost && json.Unmarshal(cost, &l.Cost) != nil {
		return fail(".cost", "must be an integer, got %s", rawText(cost))
	}
	if v, ok := present(fields, "cost_from"); ok && json.Unmarshal(v, &l.CostFrom) != nil {
		return fail(".cost_from", "must be a string header:NAME, got %s", rawText(v))
	}
	key, hasKey := present(fields, "key")
	if hasKey && json.Unmarshal(key, &l.Key) != nil {
		return fail(".key", "must be %s or %s, got %s", KeyClient, KeyIP, rawText(key))
	}
	switch {
	case !limiter.ValidName(l.Rule):
		return fail(".rule", "missing or invalid rule name %s", quoteTrunc(l.Rule))
	case l.Cost < 0:
		return fail(".cost", "must be ≥ 0, got %d", l.Cost)
	case l.CostFrom != "" && (!strings.HasPrefix(l.CostFrom, "header:") || !validHeaderName(l.CostHeader())):
		return fail(".cost_from", "must be header:NAME, got %s", quoteTrunc(l.CostFrom))
	case hasCost && l.CostFrom != "":
		// Was: accepted, and cost never read (a helper trying the
		// gateway from the README: cost 3 with the header absent spent 1).
		return fail(".cost", "give cost or cost_from, not both (with cost_from %s the cost is that header's, 1 when it is absent)", quoteTrunc(l.CostFrom))
	case hasKey && l.Key != KeyClient && l.Key != KeyIP:
		return fail(".key", "must be %s (the JWT claim, else the API key, else the IP) or %s (the client IP alone), got %s", KeyClient, KeyIP, quoteTrunc(l.Key))
	}
	if !hasCost && l.CostFrom == "" {
		l.Cost = 1 // cost 0 written out is a query: it spends nothing
	}
	return nil
}

// unmatchablePath says why no request can match pattern p (the gateway
// matches the request's path with its dot segments resolved, repeated
// slashes merged and without the query), or "" when one can. A "*"
// inside a segment is refused too: it matches only itself.
func unmatchablePath(p string) string {
	if strings.ContainsAny(p, "?#") || strings.ContainsFunc(p, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return "no request path holds '?', '#', spaces or control characters (the query is not matched)"
	}
	segs := strings.Split(p[1:], "/")
	for k, seg := range segs {
		switch {
		case seg == "" && k < len(segs)-1:
			return "an empty segment (//) matches no request: repeated slashes are merged before matching"
		case seg == "." || seg == "..":
			return "a . or .. segment matches no request: dot segments are resolved before matching"
		case seg != "*" && strings.Contains(seg, "*"):
			// Taken for a prefix ("/slow*" for "/slowly"), it would match
			// only the literal path: almost surely not what was meant.
			return `"*" stands for a whole segment ("/v1/*" matches "/v1/x" and below); inside a segment it would match only a literal "*"`
		}
	}
	return ""
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, c := range []byte(h) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// CheckRoutes reports the first route limit whose rule is not in the set
// (by name), or whose constant cost the rule cannot allow.
func CheckRoutes(routes []Route, set []limiter.Rule) error {
	byName := make(map[string]*limiter.Rule, len(set))
	for i := range set {
		byName[set[i].Name] = &set[i]
	}
	for i, r := range routes {
		for k, l := range r.Limits {
			rule, ok := byName[l.Rule]
			if !ok {
				return &RouteError{Index: i, Route: r.Name, Field: fmt.Sprintf("limits[%d].rule", k), Msg: fmt.Sprintf("no rule named %q", l.Rule)}
			}
			if l.CostFrom == "" {
				if err := rule.CheckCost(l.Cost); err != nil {
					return &RouteError{Index: i, Route: r.Name, Field: fmt.Sprintf("limits[%d].cost", k), Msg: err.Error()}
				}
			}
		}
	}
	return nil
}

// MatchRoute returns the first route that matches the request's method,
// path and client tier, or nil. A route without methods matches any
// method, one without a tier any tier; one listing GET matches HEAD too
// (an upstream serves HEAD as GET without the body, as net/http's
// ServeMux routes it). Path patterns compare segment by
// segment: "*" matches one segment, and a final "/*" matches the path
// before it and anything below it ("/v1/chat/*" matches "/v1/chat",
// "/v1/chat/x" and "/v1/chat/x/y"; "/*" matches every path).
//
// A route with limits ignores trailing slashes, on its pattern and on
// the path: "/login" and "/login/" match both "/login" and "/login/", as
// most upstreams serve both alike (was: "/login/" passed "/login"'s
// limit). An unlimited route matches its pattern as written, a trailing
// slash included: an exemption stays as narrow as it was written, so a
// path it misses falls to the routes after it.
func MatchRoute(routes []Route, method, path, tier string) *Route {
	r, _ := MatchRouteFunc(routes, method, path, func() (string, error) { return tier, nil })
	return r
}

// MatchRouteFunc is MatchRoute with the client's tier asked of tier only
// when a route with a tier matches the method and path, and then once:
// a gateway identifies its client (verifies its token) only when that
// decides the route, or when a limit will be checked. When tier fails,
// MatchRouteFunc returns the route that asked and tier's error.
func MatchRouteFunc(routes []Route, method, path string, tier func() (string, error)) (*Route, error) {
	return matchRouteFunc(routes, method, path, false, tier)
}

// MatchRouteFuncFold is MatchRouteFunc with path patterns compared to
// the path ASCII case-insensitively, as an upstream that routes so reads
// a path (Express by default, ASP.NET, IIS): "/LOGIN" matches "/login".
func MatchRouteFuncFold(routes []Route, method, path string, tier func() (string, error)) (*Route, error) {
	return matchRouteFunc(routes, method, path, true, tier)
}

func matchRouteFunc(routes []Route, method, path string, fold bool, tier func() (string, error)) (*Route, error) {
	asked, t := false, ""
	// Once, not per route: a path of 60,000 trailing slashes made every
	// route with limits scan them (a helper attacking the gateway: 1 s
	// per request at 1,000 routes).
	trimmed := trimSlashes(path)
	for i := range routes {
		r := &routes[i]
		if len(r.Methods) > 0 && !containsFold(r.Methods, method) &&
			!(strings.EqualFold(method, http.MethodHead) && containsFold(r.Methods, http.MethodGet)) {
			continue
		}
		if r.Unlimited && !matchTrimmed(r.Path, path, false, fold) || !r.Unlimited && !matchTrimmed(r.Path, trimmed, true, fold) {
			continue
		}
		if r.Tier != "" {
			if !asked {
				var err error
				if t, err = tier(); err != nil {
					return r, err
				}
				asked = true
			}
			if r.Tier != t {
				continue
			}
		}
		return r, nil
	}
	return nil, nil
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// matchTrimmed matches a path against a route pattern (see MatchRoute);
// loose ignores trailing slashes on both (path's trimmed already by the
// caller: trimSlashes, once for every route), fold ASCII case. Its cost
// is the pattern's length, and for a "*" segment the path segment's:
// never the path's (matchSegments).
func matchTrimmed(pattern, path string, loose, fold bool) bool {
	prefix, below := strings.CutSuffix(pattern, "/*")
	if loose && !below {
		// After the cut: "/x/*/" is still one segment under "/x", not
		// the final wildcard "/x/*".
		prefix = trimSlashes(prefix)
	}
	if below && prefix == "" {
		return true
	}
	return matchSegments(prefix, path, below, fold)
}

// trimSlashes returns p without its trailing slashes; "/" stays "/".
func trimSlashes(p string) string {
	if t := strings.TrimRight(p, "/"); t != "" || p == "" {
		return t
	}
	return "/"
}

// matchSegments reports whether path matches pattern segment by segment,
// "*" matching any one segment; with below, path may go on under the
// pattern ("/x" matches "/x/y"). A literal segment is compared as a
// prefix of the rest of the path, so that a path segment of 60,000 bytes
// costs no more than the pattern's. Was: each path segment found first
// (IndexByte, and for a prefix route a byte-by-byte count of slashes
// over the whole path), which a helper attacking the gateway made cost
// 0.5 s per request with a 60 KB path and 1,000 prefix routes.
func matchSegments(pattern, path string, below, fold bool) bool {
	for {
		seg, restPattern, last := pattern, "", true
		if i := strings.IndexByte(pattern, '/'); i >= 0 {
			seg, restPattern, last = pattern[:i], pattern[i+1:], false
		}
		var rest string
		more := false // the path goes on after this segment
		if seg == "*" {
			if i := strings.IndexByte(path, '/'); i >= 0 {
				rest, more = path[i+1:], true
			}
		} else {
			if len(path) < len(seg) || !(path[:len(seg)] == seg || fold && equalFoldASCII(path[:len(seg)], seg)) {
				return false
			}
			switch r := path[len(seg):]; {
			case r == "":
			case r[0] == '/':
				rest, more = r[1:], true
			default:
				return false // the path's segment is longer
			}
		}
		if last {
			return !more || below
		}
		if !more {
			return false // the path ends before the pattern
		}
		pattern, path = restPattern, rest
	}
}

// equalFoldASCII reports whether a and b, of one length, are equal but
// for the case of ASCII letters.
func equalFoldASCII(a, b string) bool {
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// FromView returns the rule a View describes, validated: the direct
// inverse of ViewOf, with no document round trip. A router builds its
// rules from a member's view with it.
func FromView(v RuleView) (limiter.Rule, error) {
	r := limiter.Rule{Name: v.Name, Limit: v.Limit, Burst: v.Burst}
	a, err := limiter.ParseAlgorithm(v.Algorithm)
	if err != nil {
		return r, &Error{Index: -1, Rule: ruleName(v.Name), Field: "algorithm", Msg: err.Error()}
	}
	r.Algorithm = a
	if r.Period, err = time.ParseDuration(v.Period); err != nil {
		return r, &Error{Index: -1, Rule: ruleName(v.Name), Field: "period", Msg: err.Error()}
	}
	if r.FailureMode, err = limiter.ParseFailureMode(v.FailureMode); err != nil {
		return r, &Error{Index: -1, Rule: ruleName(v.Name), Field: "failure_mode", Msg: err.Error()}
	}
	return r, validateRule(-1, &r)
}
