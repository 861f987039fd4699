package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// A router's GET /v1/rules lists its view's rules as the members do,
// default first, then in the order written; before its first view it
// answers 503, as its checks do. Was: the written rules sorted by name,
// and 200 {"rules": []} (no default) before a view.
func TestRouterFrontRules(t *testing.T) {
	rt, err := router.New(router.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	h := NewFront(Config{}, rt, RouterFront(rt, nil))
	get := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/rules", nil))
		return rec
	}
	if rec := get(); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("before a view: %d %s, want 503", rec.Code, rec.Body)
	}
	r, err := ring.New(ring.Config{Partitions: 8, ReplicationFactor: 4, Load: 1.25}, 1, []ring.Member{{ID: "a", Peer: "a:1"}})
	if err != nil {
		t.Fatal(err)
	}
	written := []limiter.Rule{
		{Name: "zeta", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Second},
		{Name: "alpha", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Second},
	}
	rt.SetView(view.New(r, 1, rules.Effective(written), 1))
	rec := get()
	var body api.Rules
	if err := json.Unmarshal(rec.Body.Bytes(), &body); rec.Code != http.StatusOK || err != nil {
		t.Fatalf("with a view: %d %s", rec.Code, rec.Body)
	}
	var names []string
	for _, r := range body.Rules {
		names = append(names, r.Name)
	}
	if len(names) != 3 || names[0] != rules.DefaultName || names[1] != "zeta" || names[2] != "alpha" {
		t.Fatalf("rules %v, want [default zeta alpha]", names)
	}
}
