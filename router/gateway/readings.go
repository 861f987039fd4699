package gateway

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
)

// matchReadings returns the route that decides r, and the other limited
// routes it is charged under too: r is matched in every reading an
// upstream may make of it (otherReadings, otherMethods), and is charged under the
// limits of every limited route one of them matches; it passes unlimited
// only when none does. route is the first limited route, or with none
// the first route a reading matched (unlimited) or nil; on an error (its
// tier could not be read: identify failed), the route that asked.
//
// The gateway cannot know which reading its upstream makes: an exemption
// covers a request only when it covers every reading, and a limit
// catches a request whenever it catches one. A request written plainly
// (no dot segment, no ";", no extension, no capital letter, no method
// override: most) has a single reading, and is matched once. A path
// with a capital letter is matched case-insensitively too, as Express
// (by default), ASP.NET and IIS route: "/LOGIN" is "/login" to them (was:
// not, and a case form per request went past "/login"'s limit). One
// that can be read in more than maxPasses ways (paths times methods,
// times two with capitals) is errTooManyReadings.
//
// A reading that an unlimited route names exactly ("/robots.txt") is not
// read further without its extension or script: the exemption was
// written for that very path. Was: "/robots" fell to the catch-all, and
// "/robots.txt" was limited (and identified: 401 for an expired token)
// where it had been exempt (a helper reviewing the change); then, so
// decided for the first reading alone, "/login.json//.." (first "/",
// exempt exactly) was not read as "/login" from its RFC 3986 reading
// "/login.json/" (a helper attacking the gateway).
func matchReadings(set *routeSet, r *http.Request, identify func() (string, error)) (route *rules.Route, also []*rules.Route, err error) {
	routes := set.routes
	first := matchPath(r.URL.Path)
	ms, err := otherMethods(r)
	if err != nil {
		return nil, nil, err
	}
	route, err = matchRoute(routes, r.Method, r.URL, first, false, identify)
	if err != nil {
		return route, nil, err
	}
	paths := otherReadings(r.URL, first, set.named)
	fold := set.upper || hasUpper(first) || slices.ContainsFunc(paths, hasUpper)
	if paths == nil && ms == nil && !fold {
		return route, nil, nil
	}
	folds := []bool{false}
	if fold {
		folds = append(folds, true)
	}
	if (1+len(ms))*(1+len(paths))*len(folds) > maxPasses {
		return nil, nil, errTooManyReadings
	}
	var limited []*rules.Route
	if route != nil && !route.Unlimited {
		limited = append(limited, route)
	}
	for i, method := range append([]string{r.Method}, ms...) {
		for j, path := range append([]string{first}, paths...) {
			for _, fold := range folds {
				if i == 0 && j == 0 && !fold {
					continue // matched above
				}
				m, err := matchRoute(routes, method, r.URL, path, fold, identify)
				switch {
				case err != nil:
					return m, nil, err
				case route == nil:
					route = m
				}
				if m != nil && !m.Unlimited && !slices.Contains(limited, m) {
					limited = append(limited, m)
				}
			}
		}
	}
	if len(limited) == 0 {
		return route, nil, nil
	}
	return limited[0], limited[1:], nil
}

// matchRoute returns the route of routes that decides a request of
// method for u, its path matched as path (ASCII case-insensitively with
// fold), with the tier asked of identify when a route with a tier
// matches (rules.MatchRouteFunc). An unlimited route exempts it only if
// exemptAsSent: otherwise the routes after it decide.
func matchRoute(routes []rules.Route, method string, u *url.URL, path string, fold bool, identify func() (string, error)) (*rules.Route, error) {
	match := rules.MatchRouteFunc
	if fold {
		match = rules.MatchRouteFuncFold
	}
	route, err := match(routes, method, path, identify)
	for err == nil && route != nil && route.Unlimited && !exemptAsSent(u) {
		i := 0 // the routes after it decide
		for &routes[i] != route {
			i++
		}
		routes = routes[i+1:]
		route, err = match(routes, method, path, identify)
	}
	return route, err
}

// maxPasses bounds how many times one request is matched against the
// routes (matchReadings): with maxPathBytes, the worst a request can make
// the gateway do, ~8 ms at 1,000 routes.
const maxPasses = 64

// errTooManyReadings refuses a request whose path and method can be
// read in more than maxPasses ways.
var errTooManyReadings = errors.New("the request's path and method can be read in too many ways (parameters, dot segments, extensions, overrides)")

// hasUpper reports whether s holds an ASCII capital letter.
func hasUpper(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return 'A' <= r && r <= 'Z' })
}

// otherReadings returns the paths a request for u is matched as besides
// first, its decoded path with dot segments resolved and repeated
// slashes merged (matchPath(u.Path): what most upstreams serve), each
// once and none equal to first; nil when there are none. Each base —
//
//   - its decoded path;
//   - when its path as sent holds ";", that path with each segment's
//     parameters cut off, from a ";" to the next "/" as sent, then
//     decoded: how Tomcat and Spring's PathPattern read it
//     ("/login;jsessionid=1" is "/login", "/login;%2F.." is "/login": a
//     parameter ends at a "/" sent as such, not at %2F);
//   - when its decoded path holds ";" (%3B too), that path with its
//     parameters so cut: how a server that decodes before it cuts reads
//     it —
//
// is read in three forms: resolved as matchPath does (backslashes as
// slashes, repeated slashes merged: Tomcat, Caddy, nginx, IIS); with its
// dot segments removed as RFC 3986 (5.2.4) says, repeated slashes kept,
// so that ".." removes an empty segment ("/api//../login" is
// "/api/login": the WHATWG URL parser of Node, Deno and Bun, Kestrel,
// nginx with merge_slashes off, Envoy and Istio's normalisation); and
// with its dot segments kept (Express: app.use("/graphql") serves
// "/graphql/../static/x"; Go's ServeMux, to which "%2E%2E" is a name;
// Spring's PathPattern, which matches "/api/{v}/login" with v "..").
//
// Was: the first reading alone, plus from b03617b parameters cut after
// decoding: "/login;%2F.." (resolved to "/") went past "/login"'s limit
// to Tomcat, "/admin/%3B/..;/users" was charged as "/users", and
// "/graphql/../static/x" was exempt under "/static/*" while Express
// served "/graphql"; then "/api//../login" went past "/api/login"'s
// limit to Node (two helpers attacking the gateway, with a real Express
// 4, Node and Go's ServeMux behind it).
func otherReadings(u *url.URL, first string, named map[string]bool) []string {
	semi, dots := strings.IndexByte(u.Path, ';') >= 0, hasDotSegment(u.Path)
	if !semi && !dots {
		// A ";" sent as such decodes to one: u.Path has it too.
		if strings.IndexByte(u.Path, '.') < 0 && !hasFoldRune(u.Path) {
			return nil
		}
		return suffixReadings(nil, first, named)
	}
	bases := []string{absolute(u.Path)}
	if sent := u.EscapedPath(); strings.IndexByte(sent, ';') >= 0 {
		if p, err := url.PathUnescape(withoutParams(sent)); err == nil {
			bases = append(bases, absolute(p))
		}
	}
	if semi {
		bases = append(bases, absolute(withoutParams(u.Path)))
	}
	var paths []string
	add := func(p string) {
		if p != first && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	for _, b := range bases {
		add(matchPath(b))
		if hasDotSegment(b) {
			add(removeDotSegments(b))
			add(b)
		}
	}
	return suffixReadings(paths, first, named)
}

// suffixReadings returns paths (other readings of a request whose first
// is first) with, for first and each of paths, the readings of two kinds
// of upstream added, each once and none equal to first:
//
//   - a last segment's extension cut off ("/login.json" as "/login"):
//     Rails routes every path with an optional "(.:format)", and Spring
//     MVC's suffix pattern matching did the same;
//   - a PHP front controller's script segment taken out, when more
//     segments follow ("/index.php/login" as "/login", and
//     "/app/index.php/login" as "/app/login" too): Symfony, Laravel,
//     CodeIgniter and Slim route the path after the script.
//
// Was: neither, and "/login.json" (Rails) and "/index.php/login"
// (Symfony's getPathInfo, run behind the gateway) went past "/login"'s
// limit (a helper attacking the gateway).
//
// And, for a path with a letter that Java's equalsIgnoreCase takes for an
// ASCII one ("ı" for "i", "ſ" for "s", the Kelvin sign for "k": Spring's
// AntPathMatcher with case-insensitive matching on), the path with those
// letters so read ("/logın" as "/login"). None of these for a path an
// unlimited route names exactly (named).
func suffixReadings(paths []string, first string, named map[string]bool) []string {
	add := func(p string) {
		if p != "" && p != first && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	for _, p := range append([]string{first}, paths...) {
		if hasFoldRune(p) {
			add(foldRunes.Replace(p))
		}
		if named[p] {
			continue
		}
		for _, q := range afterScript(p) {
			add(q)
			add(withoutExtension(q))
		}
		add(withoutExtension(p))
	}
	return paths
}

// foldRunes reads the letters that Java's equalsIgnoreCase (and
// toLowerCase) takes for ASCII ones as those (suffixReadings).
var foldRunes = strings.NewReplacer("ı", "i", "ſ", "s", "\u212a", "k", "\u212b", "å")

// hasFoldRune reports whether p holds a letter foldRunes reads.
func hasFoldRune(p string) bool { return strings.ContainsAny(p, "ıſ\u212a\u212b") }

// withoutExtension is absolute path p with its last segment's extension
// cut off (from its last "."), or "" when it has none: no ".", or one
// leading it (".well-known") or ending it. Trailing slashes go first, as
// Rails drops them before it routes ("/login.json/" is "/login"; was
// not cut).
func withoutExtension(p string) string {
	if t := strings.TrimRight(p, "/"); t != "" {
		p = t
	}
	i := strings.LastIndexByte(p, '/')
	seg := p[i+1:]
	j := strings.LastIndexByte(seg, '.')
	if j <= 0 || j == len(seg)-1 || seg == ".." {
		return ""
	}
	return p[:i+1] + seg[:j]
}

// afterScript returns, for absolute path p with a segment that holds
// ".php" (any case) after at least one byte and has more after it, the
// path after the ".php" of the first such segment ("/" before it when it
// has none), and p without the script ("/a/index.php/login": "/login"
// and "/a/login"); nil otherwise. Symfony takes the script's path as a
// string prefix of the request's: "/index.phplogin" is "/login" to it
// (was: not read, a helper attacking the gateway, Symfony 5.4 run).
func afterScript(p string) []string {
	for i := 1; i < len(p); {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p) - i
		}
		seg := p[i : i+j]
		if k := indexFold(seg, ".php"); k > 0 {
			rest := seg[k+len(".php"):] + p[i+j:] // what follows the script
			switch {
			case rest == "" || rest == "/":
			case rest[0] == '/':
				return []string{rest, p[:i] + rest[1:]}
			default:
				return []string{"/" + rest, p[:i] + rest}
			}
		}
		i += j + 1
	}
	return nil
}

// indexFold is the index of the first ASCII case-insensitive match of
// lower-case sub in s, or -1.
func indexFold(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

// absolute is p with a leading "/" when it has none.
func absolute(p string) string {
	if p == "" || p[0] != '/' {
		return "/" + p
	}
	return p
}

// removeDotSegments resolves the "." and ".." segments of absolute path
// p as RFC 3986 (5.2.4) does: repeated slashes stay (an empty segment
// is a segment, and ".." removes it), and a path that ends in a dot
// segment ends in "/".
func removeDotSegments(p string) string {
	segs := strings.Split(p, "/")[1:]
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, s)
			continue
		}
		if last {
			out = append(out, "")
		}
	}
	return "/" + strings.Join(out, "/")
}

// hasDotSegment reports whether path p holds a "." or ".." segment.
func hasDotSegment(p string) bool {
	if !strings.Contains(p, ".") {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// withoutParams is path p with each segment's parameters cut off: from a
// ";" up to the next "/" (RFC 3986's path parameters), as servlet
// containers (Tomcat, Jetty: the upstreams of Spring applications) read
// a path before they route it (otherReadings).
func withoutParams(p string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(p, ';')
		if i < 0 {
			b.WriteString(p)
			return b.String()
		}
		b.WriteString(p[:i])
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			return b.String()
		}
		p = p[i+j:]
	}
}

// overrideHeaders are the headers a request names the method it means
// in, lower case: Rails (Rack::MethodOverride), Symfony, Laravel, Slim
// and Express's method-override read one of them, and serve the request
// as that method.
var overrideHeaders = [...]string{"x-http-method-override", "x-http-method", "x-method-override"}

// errTooManyMethods refuses a request that names more methods than a
// request is matched as (maxMethods).
var errTooManyMethods = errors.New("a method override names more than 3 methods; name one")

// otherMethods returns the methods a request r is matched as besides
// its own (nil: none): each method an override header names (spelled
// with dashes or underscores: Rack reads X_HTTP_Method_Override as the
// dashed header when only that spelling is sent), and each a "_method"
// query parameter names (Laravel and Symfony), its key read as PHP reads
// it (decoded, "." and " " as "_": "%5Fmethod", ".method"), all
// upper-cased as those frameworks read them; on any method, as Slim and
// Express's method-override (configured so) do, whatever r's method's
// case. More than maxMethods in all is errTooManyMethods: cut to the
// first ones, junk named first would push the one the upstream reads out
// of the match.
//
// Was: for a POST only, the dashed headers and "_method" as written, cut
// to 4: a POST with "X-HTTP-Method-Override: GET" went past a GET
// route's limit to Rails (fixed), then "?_method=A&_method=B&_method=C&_method=GET",
// "?%5Fmethod=GET", "X_HTTP_Method_Override: GET", "post" and a GET
// naming POST to Slim did (two helpers attacking the gateway). A
// "_method" field in a form body is not read (the body is the
// upstream's): a route listing methods does not catch such a POST unless
// it lists POST too.
func otherMethods(r *http.Request) ([]string, error) {
	var ms []string
	var err error
	add := func(v string) {
		v = strings.ToUpper(strings.TrimSpace(v))
		switch {
		case v == "" || strings.EqualFold(v, r.Method) || slices.Contains(ms, v):
		case len(ms) == maxMethods-1:
			err = errTooManyMethods
		default:
			ms = append(ms, v)
		}
	}
	for k, vs := range r.Header {
		if !slices.ContainsFunc(overrideHeaders[:], func(h string) bool { return strings.EqualFold(k, h) || strings.EqualFold(dashed(k), h) }) {
			continue
		}
		for _, v := range vs {
			for m := range strings.SplitSeq(v, ",") {
				add(m)
			}
		}
	}
	for pair := range strings.SplitSeq(r.URL.RawQuery, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if !strings.Contains(k, "method") && strings.IndexByte(k, '%') < 0 {
			continue // not _method, however PHP reads it (was: every query with a % parsed whole)
		}
		if k, uerr := url.QueryUnescape(k); uerr != nil || phpKey(k) != "_method" && phpKey("x"+k) != "x_method" {
			continue
		}
		if v, uerr := url.QueryUnescape(v); uerr == nil {
			add(v)
		}
	}
	return ms, err
}

// phpKey is query key k as PHP names the variable: leading spaces
// dropped, and " ", "." and "[" as "_". (otherMethods also reads a key
// with its leading spaces kept as "_": " method", sent "+method".)
func phpKey(k string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '.' || r == '[' {
			return '_'
		}
		return r
	}, strings.TrimLeft(k, " "))
}

// maxMethods bounds the methods one request is matched as (otherMethods).
const maxMethods = 4

// mergeRepeated returns reqs, the checks of route (one per limit, in
// order), with the checks of one rule and key merged into the first of
// them at the highest cost, and route with the limits of the checks
// kept. Two routes of two readings of one request (joinLimits) may name
// one rule, at two costs, or keyed by the client and by the IP of a
// client known by its IP alone: a group names a rule and key once (the
// router refuses it otherwise). Was: such a request (a jsessionid, an
// override) was refused.
func mergeRepeated(reqs []router.Request, route *rules.Route) ([]router.Request, *rules.Route) {
	out := make([]router.Request, 0, len(reqs))
	kept := *route
	kept.Limits = make([]rules.Limit, 0, len(reqs))
	for i, q := range reqs {
		j := slices.IndexFunc(out, func(o router.Request) bool { return o.Rule == q.Rule && o.Key == q.Key })
		if j >= 0 {
			out[j].Cost = max(out[j].Cost, q.Cost)
			continue
		}
		out = append(out, q)
		kept.Limits = append(kept.Limits, route.Limits[i])
	}
	return out, &kept
}

// joinLimits returns a route named as a that has a's limits, then b's
// (two readings of one request: matchReadings); a limit both name makes
// one check (mergeRepeated).
func joinLimits(a, b *rules.Route) *rules.Route {
	j := *a
	j.Limits = slices.Concat(a.Limits, b.Limits)
	return &j
}
