package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// countChecker allows the first n checks of each key, each leaving one
// less, and asks for delay on allowed ones.
type countChecker struct {
	mu    sync.Mutex
	n     int64
	delay int64
	spent map[string]int64
	err   error
}

func (c *countChecker) Check(_ context.Context, rule, key string, cost int64) (api.Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return api.Decision{}, c.err
	}
	if c.spent == nil {
		c.spent = map[string]int64{}
	}
	if c.spent[key]+cost > c.n {
		return api.Decision{Limit: c.n, ResetAfterMs: 1500, RetryAfterMs: 1200}, nil
	}
	c.spent[key] += cost
	return api.Decision{Allowed: true, Limit: c.n, Remaining: c.n - c.spent[key], ResetAfterMs: 1500, DelayMs: c.delay}, nil
}

func TestMiddlewareHeadersAndDenial(t *testing.T) {
	c := &countChecker{n: 2}
	hits := 0
	h := Middleware(c, MiddlewareConfig{Rule: "api", Window: time.Minute, Key: KeyByHeader("X-Api-Key"),
		Now: func() time.Time { return time.Unix(100, 0) }})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits++ }))
	do := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := do("a")
	want := map[string]string{"RateLimit-Policy": `"api";q=2;w=60`, "RateLimit": `"api";r=1;t=2`,
		"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "102"}
	for k, v := range want {
		if rec.Header().Get(k) != v {
			t.Errorf("%s = %q, want %q", k, rec.Header().Get(k), v)
		}
	}
	do("a")
	rec = do("a")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Cache-Control") != "no-store" ||
		rec.Header().Get("RateLimit") != `"api";r=0;t=2` {
		t.Fatalf("denied: %d %v", rec.Code, rec.Header())
	}
	if rec := do(""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("no key: %d, want 401", rec.Code)
	}
	if hits != 2 {
		t.Fatalf("next saw %d requests, want the 2 allowed", hits)
	}
	c.err = errors.New("down")
	if rec := do("b"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("limiter down: %d, want 503", rec.Code)
	}
}

func TestMiddlewareHoldsShapedRequestsAndDropsLeavers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &countChecker{n: 10, delay: 300}
		var at []time.Duration
		start := time.Now()
		h := Middleware(c, MiddlewareConfig{Rule: "s"})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			at = append(at, time.Since(start))
		}))
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		h.ServeHTTP(httptest.NewRecorder(), req)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		h.ServeHTTP(httptest.NewRecorder(), req.WithContext(ctx))
		if len(at) != 1 || at[0] != 300*time.Millisecond {
			t.Fatalf("released at %v; want once, after 300ms (the second client left at 100ms)", at)
		}
	})
}
