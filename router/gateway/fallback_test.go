package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
)

// A route whose rule is swapped for another (route "api": rule apiA,
// then apiB) changes in two steps, the rules and the routes, and a
// request between them is checked by the route's other version while
// its own names a rule the view lacks: the next routes (SetNextRoutes:
// the rules were written before the routes) or the routes before
// (SetRoutes: the routes were set before this process's view had the
// rules). Was: 500 (an embedded gateway, 15 of 16 reloads). Past
// routeFallbackFor, a route naming a rule nobody has is a mistake again:
// 500.
func TestRouteChangeIsNotMetHalfWay(t *testing.T) {
	rule := func(name string) limiter.Rule {
		return limiter.Rule{Name: name, Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second}
	}
	c := newChecker(t, rule("apiA"), rule("apiB"))
	both := c.view
	only := func(name string) *router.View {
		v := *both
		v.Rules = map[string]*limiter.Rule{name: both.Rules[name], "default": both.Rules["default"]}
		return &v
	}
	routeTo := func(name string) []rules.Route {
		return []rules.Route{{Name: "api", Path: "/api/*", Limits: []rules.Limit{{Rule: name, Cost: 1}}}}
	}
	clock := time.Unix(1_000_000, 0)
	g, err := New(Config{Now: func() time.Time { return clock }, Routes: routeTo("apiA"),
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}, c)
	if err != nil {
		t.Fatal(err)
	}
	send := func(step string, want int, wantRule string) {
		t.Helper()
		before := len(c.keys())
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/x", nil))
		if rec.Code != want {
			t.Fatalf("%s: %d %s, want %d", step, rec.Code, rec.Body, want)
		}
		if wantRule != "" {
			c.mu.Lock()
			got := c.calls[len(c.calls)-1][0].Rule
			c.mu.Unlock()
			if len(c.keys()) == before || got != wantRule {
				t.Fatalf("%s: checked by rule %q, want %q", step, got, wantRule)
			}
		}
	}
	send("in force, apiA", http.StatusOK, "apiA")
	// The embedded gateway's reload: routes restricted to the rules in
	// force (apiA's route kept), the file's routes next, then its rules
	// (apiB in, apiA out) are written.
	g.SetRoutes(routeTo("apiA"))
	g.SetNextRoutes(routeTo("apiB"))
	c.view = only("apiB")
	send("rules written, routes not yet", http.StatusOK, "apiB")
	g.SetRoutes(routeTo("apiB"))
	send("routes in force", http.StatusOK, "apiB")
	// Routes set before the view has their rule: the routes before stand in.
	g.SetRoutes(routeTo("apiA"))
	send("routes set first", http.StatusOK, "apiB")
	c.view = only("apiA")
	send("view caught up", http.StatusOK, "apiA")
	// A route naming a rule nobody has, past the fallback's time: 500.
	g.SetRoutes(routeTo("apiC"))
	clock = clock.Add(routeFallbackFor)
	send("a rule nobody has", http.StatusInternalServerError, "")
}
