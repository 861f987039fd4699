package gateway

import (
	"net/http"
	"net/url"
	"slices"
	"strings"

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
// (no dot segment, no ";", no method override: nearly all) has a single
// reading, and is matched once.
func matchReadings(routes []rules.Route, r *http.Request, identify func() (string, error)) (route *rules.Route, also []*rules.Route, err error) {
	first := matchPath(r.URL.Path)
	paths, ms := otherReadings(r.URL, first), otherMethods(r)
	if paths == nil && ms == nil {
		route, err = matchRoute(routes, r.Method, r.URL, first, identify)
		return route, nil, err
	}
	var limited []*rules.Route
	for _, method := range append([]string{r.Method}, ms...) {
		for _, path := range append([]string{first}, paths...) {
			m, err := matchRoute(routes, method, r.URL, path, identify)
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
	if len(limited) == 0 {
		return route, nil, nil
	}
	return limited[0], limited[1:], nil
}

// matchRoute returns the route of routes that decides a request of
// method for u, its path matched as path, with the tier asked of
// identify when a route with a tier matches (rules.MatchRouteFunc). An
// unlimited route exempts it only if exemptAsSent: otherwise the routes
// after it decide.
func matchRoute(routes []rules.Route, method string, u *url.URL, path string, identify func() (string, error)) (*rules.Route, error) {
	route, err := rules.MatchRouteFunc(routes, method, path, identify)
	for err == nil && route != nil && route.Unlimited && !exemptAsSent(u) {
		i := 0 // the routes after it decide
		for &routes[i] != route {
			i++
		}
		routes = routes[i+1:]
		route, err = rules.MatchRouteFunc(routes, method, path, identify)
	}
	return route, err
}

// otherReadings returns the paths a request for u is matched as besides
// first, its decoded path with dot segments resolved and repeated
// slashes merged (matchPath(u.Path): what most upstreams serve), each
// once and none equal to first; nil when there are none:
//
//   - when its path as sent holds ";", that path with each segment's
//     parameters cut off, from a ";" to the next "/" as sent, then
//     decoded and resolved: how Tomcat reads it ("/login;jsessionid=1"
//     is "/login", "/public/..;/admin" is "/admin", "/login;%2F.." is
//     "/login": the parameter ends at a "/" sent as such, not at %2F);
//   - when its decoded path holds ";" (%3B too), the decoded path with
//     parameters so cut, resolved: how a server that decodes before it
//     cuts reads it;
//   - when its decoded path holds a dot segment (%2E%2E included), that
//     path with its dot segments kept: how an upstream that resolves none
//     reads it (Node's Express, whose app.use("/graphql") serves
//     "/graphql/../static/x"; Go's ServeMux, which resolves "%2E%2E" as
//     the name it is sent as).
//
// Was: the first alone, plus from b03617b the third: "/login;%2F.."
// (resolved to "/") went past "/login"'s limit to Tomcat, which serves
// "/login"; "/admin/%3B/..;/users" was charged as "/users" where Tomcat
// serves "/admin/users"; and "/graphql/../static/x" was exempt under
// "/static/*" while Express served "/graphql" (a helper attacking the
// gateway, with a real Express 4 and Go's ServeMux behind it).
func otherReadings(u *url.URL, first string) []string {
	semi, dots := strings.IndexByte(u.Path, ';') >= 0, hasDotSegment(u.Path)
	if !semi && !dots {
		return nil // a ";" sent as such decodes to one: u.Path has it too
	}
	var paths []string
	add := func(p string) {
		if p != first && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	if sent := u.EscapedPath(); strings.IndexByte(sent, ';') >= 0 {
		if p, err := url.PathUnescape(withoutParams(sent)); err == nil {
			add(matchPath(p))
		}
	}
	if semi {
		add(matchPath(withoutParams(u.Path)))
	}
	if dots {
		p := u.Path
		if p == "" || p[0] != '/' {
			p = "/" + p
		}
		add(p)
	}
	return paths
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

// overrideHeaders are the headers a POST names the method it means in:
// Rails (Rack::MethodOverride), Symfony and Laravel, and Express's
// method-override middleware read one of them, and serve the request as
// that method.
var overrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// otherMethods returns the methods a request r is matched as besides
// its own (nil: none): for a POST, each method an override header or a
// "_method" query parameter (Laravel, Symfony when enabled) names,
// upper-cased as those frameworks read it. Was: its own alone, so a POST with
// "X-HTTP-Method-Override: GET" went past a GET route's limit to a Rails
// upstream that served it as that GET. A "_method" field in a form body
// is not read (the body is the upstream's): a route listing methods
// does not catch such a POST unless it lists POST too.
func otherMethods(r *http.Request) []string {
	if r.Method != http.MethodPost {
		return nil
	}
	var ms []string
	add := func(v string) {
		// At most maxMethods in all: each is matched against every
		// route, in every reading of the path.
		if v = strings.ToUpper(strings.TrimSpace(v)); v != "" && v != r.Method && len(ms) < maxMethods-1 && !slices.Contains(ms, v) {
			ms = append(ms, v)
		}
	}
	for _, h := range overrideHeaders {
		for _, v := range r.Header.Values(h) {
			for m := range strings.SplitSeq(v, ",") {
				add(m)
			}
		}
	}
	if strings.Contains(r.URL.RawQuery, "_method") {
		for _, v := range r.URL.Query()["_method"] {
			add(v)
		}
	}
	return ms
}

// maxMethods bounds the methods one request is matched as (otherMethods).
const maxMethods = 4

// joinLimits returns a route named as a that has a's limits, then those
// of b that a lacks (two readings of one request: matchReadings).
func joinLimits(a, b *rules.Route) *rules.Route {
	j := *a
	j.Limits = slices.Clip(a.Limits)
	for _, l := range b.Limits {
		if !slices.Contains(j.Limits, l) {
			j.Limits = append(j.Limits, l)
		}
	}
	return &j
}
