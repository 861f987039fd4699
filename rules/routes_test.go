package rules

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

const routesDoc = `
rules:
  - {name: chat-rpm, algorithm: token_bucket, limit: 10, period: 1m}
  - {name: chat-tpm, algorithm: sliding_window, limit: 1000, period: 1m}
routes:
  - name: chat-free
    methods: [post]
    path: /v1/chat/*
    tier: free
    limits:
      - rule: chat-rpm
      - rule: chat-tpm
        cost_from: header:X-Token-Estimate
  - name: item
    path: /v1/items/*/detail
    limits: [{rule: default, cost: 2}]
  - name: everything-else
    path: /*
    limits: [{rule: default}]
`

func TestParseRoutesAndMatch(t *testing.T) {
	rs, err := Parse([]byte(routesDoc))
	if err != nil {
		t.Fatalf("Parse with routes: %v", err)
	}
	routes, err := ParseRoutes([]byte(routesDoc))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRoutes(routes, Effective(rs)); err != nil {
		t.Fatal(err)
	}
	if got := routes[0].Methods[0]; got != "POST" {
		t.Errorf("methods upper-cased: got %q", got)
	}
	if l := routes[0].Limits; l[0].Cost != 1 || l[1].CostHeader() != "X-Token-Estimate" {
		t.Errorf("limits = %+v", l)
	}
	tests := []struct {
		method, path, tier, want string
	}{
		{"POST", "/v1/chat/completions", "free", "chat-free"},
		{"POST", "/v1/chat", "free", "chat-free"},
		{"POST", "/v1/chat/a/b", "free", "chat-free"},
		{"POST", "/v1/chatter", "free", "everything-else"},
		{"GET", "/v1/chat/x", "free", "everything-else"},
		{"POST", "/v1/chat/x", "pro", "everything-else"},
		{"GET", "/v1/items/42/detail", "", "item"},
		{"GET", "/v1/items/42/other", "", "everything-else"},
		{"GET", "/", "", "everything-else"},
	}
	for _, tt := range tests {
		got := ""
		if r := MatchRoute(routes, tt.method, tt.path, tt.tier); r != nil {
			got = r.Name
		}
		if got != tt.want {
			t.Errorf("MatchRoute(%s %s, tier %q) = %q, want %q", tt.method, tt.path, tt.tier, got, tt.want)
		}
	}
	if r := MatchRoute(routes[:1], "GET", "/", ""); r != nil {
		t.Errorf("no route should match, got %q", r.Name)
	}
}

// A route with limits ignores trailing slashes on its pattern and on the
// path; an unlimited route matches as written, so a path it misses falls
// to the routes after it. Was: "/login/" matched no "/login" route and
// passed unlimited to an upstream that serves it as "/login".
func TestMatchRouteTrailingSlashes(t *testing.T) {
	lim := []Limit{{Rule: "r", Cost: 1}}
	routes := []Route{
		{Name: "health", Path: "/healthz", Unlimited: true},
		{Name: "public", Path: "/public/", Unlimited: true},
		{Name: "login", Path: "/login", Limits: lim},
		{Name: "form", Path: "/form/", Limits: lim},
		{Name: "content", Path: "/files/*/content", Limits: lim},
		{Name: "one", Path: "/one/*/", Limits: lim},
		{Name: "chat", Path: "/chat/*", Limits: lim},
		{Name: "root", Path: "/", Limits: lim},
	}
	for _, tt := range []struct{ path, want string }{
		{"/login", "login"},
		{"/login/", "login"},
		{"/login//", "login"},
		{"/login/x", ""},
		{"/form", "form"},
		{"/form/", "form"},
		{"/files/a/content/", "content"},
		{"/files/a/content", "content"},
		{"/one/a", "one"},
		{"/one/a/", "one"},
		{"/one", ""}, // "/one/*/" is one segment under /one, not a final wildcard
		{"/one/a/b", ""},
		{"/chat/", "chat"},
		{"/chat", "chat"},
		{"/", "root"},
		{"/healthz", "health"},
		{"/healthz/", ""}, // not the exemption: limited by whatever follows (here nothing)
		{"/public/", "public"},
		{"/public", ""},
	} {
		got := ""
		if r := MatchRoute(routes, "GET", tt.path, ""); r != nil {
			got = r.Name
		}
		if got != tt.want {
			t.Errorf("MatchRoute(GET %s) = %q, want %q", tt.path, got, tt.want)
		}
	}
}

func TestParseRoutesErrors(t *testing.T) {
	tests := []struct{ doc, msg string }{
		{"routes: [{name: a, path: x, limits: [{rule: default}]}]", `route "a": path: must start with /, got "x"`},
		{"routes: [{name: a, path: /, limits: []}]", `route "a": limits: want 1 to 16 limits (or unlimited: true), got 0`},
		{"routes: [{name: a, path: /}]", `route "a": limits: want 1 to 16 limits (or unlimited: true), got 0`},
		{"routes: [{name: a, path: /, unlimited: false}]", `route "a": limits: want 1 to 16 limits (or unlimited: true), got 0`},
		{"routes: [{name: a, path: /, unlimited: true, limits: [{rule: r}]}]", `route "a": limits: an unlimited route takes no limits, got 1`},
		{`routes: [{name: a, path: /, unlimited: "true"}]`, `route "a": unlimited: must be a bool (true or false), got "true"`},
		{"routes: [{name: a, path: /, limits: [{rule: r, cost_from: body}]}]", `route "a": limits[0].cost_from: must be header:NAME, got "body"`},
		{"routes: [{name: a, path: /, limits: [{rule: r, cost: 3, cost_from: 'header:X-T'}]}]", `route "a": limits[0].cost: give cost or cost_from, not both (with cost_from "header:X-T" the cost is that header's, 1 when it is absent)`},
		{"routes: [{name: a, path: /, bogus: 1, limits: [{rule: r}]}]", `route "a": bogus: unknown field`},
		// Fields are matched exactly: "Path" beside "path" is no alias.
		{"routes: [{name: a, PATH: /admin/*, limits: [{rule: r}]}]", `route "a": PATH: unknown field`},
		{"routes: [{name: a, path: /admin/*, Path: /*, limits: [{rule: r}]}]", `route "a": Path: unknown field`},
		{"routes: [{name: a, path: /, limits: [{rule: r, Rule: other}]}]", `route "a": limits[0].Rule: unknown field (want rule, cost, cost_from, key)`},
		// What a limit is keyed by: the client (default) or its IP.
		{"routes: [{name: a, path: /, limits: [{rule: r, key: address}]}]", `route "a": limits[0].key: must be client (the JWT claim, else the API key, else the IP) or ip (the client IP alone), got "address"`},
		{"routes: [{name: a, path: /, limits: [{rule: r}, {rule: s, key: IP}]}]", `route "a": limits[1].key: must be client`},
		{"routes: [{name: a, path: /, limits: [{rule: r, key: ''}]}]", `route "a": limits[0].key: must be client`},
		{"routes: [{name: a, path: /, limits: [{rule: r, key: [ip]}]}]", `route "a": limits[0].key: must be client or ip, got ["ip"]`},
		{"routes: [{name: a, path: /, limits: [{rule: r, Key: ip}]}]", `route "a": limits[0].Key: unknown field`},
		{"routes: [{name: a, path: /, limits: [{rule: r}, {rule: r, key: ip}]}]", `route "a": limits[1].rule: names rule "r" again (limits[0])`},
		// A limit's errors name its index and the route.
		{"routes: [{name: s, path: /b, limits: [{rule: x, bogus: 1}]}]", `route "s": limits[0].bogus: unknown field`},
		{"routes: [{name: s, path: /b, limits: [{rule: x}, {rule: z, cost: '3'}]}]", `route "s": limits[1].cost: must be an integer, got "3"`},
		{"routes: [{name: s, path: /b, limits: [7]}]", `route "s": limits[0]: must be a mapping of rule, cost, cost_from, key, got 7`},
		{"routes: [{name: s, path: /b, limits: [{rule: x}, {rule: z}, {rule: x, cost: 2}]}]", `route "s": limits[2].rule: names rule "x" again (limits[0])`},
		{"routes: [{name: yes, path: /b, limits: [{rule: x}]}]", `routes[0]: name: must be a string, got true (YAML reads an unquoted`},
		{"routes: [{name: s, path: /b, limits: [{rule: 123}]}]", `route "s": limits[0].rule: must be a string, got 123 (YAML reads an unquoted`},
		// Paths no request can match: the gateway matches a cleaned path
		// without its query.
		{"routes: [{name: a, path: /api//v1/*, limits: [{rule: r}]}]", `route "a": path: an empty segment (//) matches no request`},
		{"routes: [{name: a, path: /api/./v1/*, limits: [{rule: r}]}]", `route "a": path: a . or .. segment matches no request`},
		{"routes: [{name: a, path: /api/../v1/*, limits: [{rule: r}]}]", `route "a": path: a . or .. segment matches no request`},
		{"routes: [{name: a, path: /slow*, limits: [{rule: r}]}]", `route "a": path: "*" stands for a whole segment`},
		{"routes: [{name: a, path: /v1/*x/y, limits: [{rule: r}]}]", `route "a": path: "*" stands for a whole segment`},
		{"routes: [{name: a, path: '/search?q=*', limits: [{rule: r}]}]", `route "a": path: no request path holds '?'`},
		{"routes: [{name: a, path: '/a b', limits: [{rule: r}]}]", `route "a": path: no request path holds '?', '#', spaces`},
		{"routes: [{name: a, path: /, limits: [{rule: r}]}, {name: a, path: /, limits: [{rule: r}]}]", `route "a": name: duplicate name: routes[0] and routes[1]`},
		{"routes: 3", `routes: must be a list of routes, got 3`},
	}
	for _, tt := range tests {
		_, err := ParseRoutes([]byte(tt.doc))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tt.msg) {
			t.Errorf("ParseRoutes(%s) = %v, want %q", tt.doc, err, tt.msg)
		}
	}
	routes, err := ParseRoutes([]byte("routes: [{name: a, path: /, limits: [{rule: nope}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRoutes(routes, Effective(nil)); err == nil || err.Error() != `route "a": limits[0].rule: no rule named "nope"` {
		t.Errorf("CheckRoutes = %v", err)
	}
}

// A limit may be keyed by the client IP alone (key: ip), beside limits
// keyed by the client (the default, or key: client written out).
func TestParseRouteLimitKeys(t *testing.T) {
	rs, err := ParseRoutes([]byte(`routes:
  - name: login
    path: /login
    limits: [{rule: login-per-client}, {rule: login-per-ip, key: ip}, {rule: login-named, key: client}]
`))
	if err != nil {
		t.Fatal(err)
	}
	l := rs[0].Limits
	if l[0].Key != "" || l[0].ByIP() || l[1].Key != KeyIP || !l[1].ByIP() || l[2].Key != KeyClient || l[2].ByIP() {
		t.Errorf("limits %+v: want keys \"\", ip, client", l)
	}
}

func TestFromViewInvertsViewOf(t *testing.T) {
	for _, r := range []limiter.Rule{
		Default(),
		{Name: "w", Algorithm: limiter.SlidingWindow, Limit: 7, Period: time.Minute, FailureMode: limiter.FailClosed},
		{Name: "l", Algorithm: limiter.LeakyBucket, Limit: 5, Period: 90 * time.Second, Burst: 3},
	} {
		got, err := FromView(ViewOf(r))
		if err != nil {
			t.Fatal(err)
		}
		if ViewOf(got) != ViewOf(r) {
			t.Errorf("FromView(ViewOf(%+v)) = %+v", r, got)
		}
	}
	if _, err := FromView(RuleView{Name: "x", Algorithm: "nope", Limit: 1, Period: "1s"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad algorithm: %v", err)
	}
}

// A limit's cost: 1 when left out, and a cost 0 written out is kept (a
// query: the request is admitted while a cost-1 check would pass, and
// spends nothing). Was: an explicit 0 spent 1. Paths that end in a
// slash and the root stay valid.
func TestParseRouteCosts(t *testing.T) {
	rs, err := ParseRoutes([]byte("routes: [{name: r, path: /a/, limits: [{rule: one}, {rule: zero, cost: 0}, {rule: five, cost: 5}, {rule: h, cost_from: 'header:X-Cost'}]}, {name: root, path: /, limits: [{rule: one}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, l := range rs[0].Limits {
		got = append(got, l.Cost)
	}
	if want := []int64{1, 0, 5, 0}; !slices.Equal(got, want) {
		t.Errorf("costs %v, want %v", got, want)
	}
	if rs[0].Limits[3].CostHeader() != "X-Cost" {
		t.Errorf("cost header %q, want X-Cost", rs[0].Limits[3].CostHeader())
	}
}
