package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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

// A check the limiter refuses as bad is answered 400 with its message,
// even with a fail-open OnError, and a request whose client has gone
// reaches neither OnError nor next. Was: both went to OnError, so README's
// fail-open pattern let a cost of -1 or 1000 through a spent budget.
func TestMiddlewareBadChecksAreNotErrorsToFailOpenOn(t *testing.T) {
	c := &countChecker{}
	hits, onError := 0, 0
	h := Middleware(c, MiddlewareConfig{Rule: "api",
		OnError: func(w http.ResponseWriter, r *http.Request, err error) { onError++; w.WriteHeader(http.StatusOK) }})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits++ }))
	c.err = &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest, Message: "cost 1000 is over the rule's capacity 100"}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "over the rule's capacity") || hits+onError != 0 {
		t.Fatalf("a bad cost: %d %s, next %d, OnError %d; want 400 and neither", rec.Code, rec.Body, hits, onError)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.err = context.Canceled
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
	if hits+onError != 0 {
		t.Fatalf("a client that left: next %d, OnError %d; want neither", hits, onError)
	}
	c.err = errors.New("down") // unreachable: OnError's to answer
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	if onError != 1 || hits != 0 {
		t.Fatalf("limiter down: OnError %d, next %d; want OnError once", onError, hits)
	}
}

// The middleware's keys are the gateway's: a long or non-UTF-8 API key
// is hashed (was: every request 400 from the cluster), a key header given
// twice is refused, and an IPv4-mapped peer is keyed as IPv4.
func TestMiddlewareKeysAsTheGateway(t *testing.T) {
	req := func(vs ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["X-Api-Key"] = vs
		return r
	}
	key := KeyByHeader("X-Api-Key")
	if k, err := key(req(strings.Repeat("k", 1100))); err != nil || !strings.HasPrefix(k, "keyh:") {
		t.Errorf("long key: %q, %v", k, err)
	}
	if k, err := key(req("a")); err != nil || k != "key:a" {
		t.Errorf("plain key: %q, %v", k, err)
	}
	if _, err := key(req("made-up", "real")); err == nil {
		t.Error("two key headers: keyed, want refused")
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "[::ffff:10.0.0.1]:5000"
	if k, err := KeyByIP(r); err != nil || k != "ip:10.0.0.1" {
		t.Errorf("IPv4-mapped peer: %q, %v; want ip:10.0.0.1", k, err)
	}
}

// blockingChecker answers only when the check's context ends, with its
// error, as a limiter that accepts connections and never answers.
type blockingChecker struct{ calls int }

func (b *blockingChecker) Check(ctx context.Context, _, _ string, _ int64) (api.Decision, error) {
	b.calls++
	<-ctx.Done()
	return api.Decision{}, ctx.Err()
}

// A limiter that never answers is one that could not decide: OnError
// answers once the middleware's Timeout (1s by default) passes, and once
// an outer deadline on the request passes first. Was: no bound of its
// own, so the request waited for its client to give up, and an outer
// timeout's deadline was taken for the client leaving: an empty 200,
// neither OnError nor next.
func TestMiddlewareBoundsAHungLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			name    string
			timeout time.Duration // MiddlewareConfig.Timeout
			outer   time.Duration // the request's own deadline (0: none)
			want    time.Duration
		}{
			{"default timeout", 0, 0, time.Second},
			{"own timeout", 300 * time.Millisecond, 0, 300 * time.Millisecond},
			{"outer deadline first", 0, 100 * time.Millisecond, 100 * time.Millisecond},
		} {
			var onError []error
			hits := 0
			h := Middleware(&blockingChecker{}, MiddlewareConfig{Rule: "api", Timeout: c.timeout,
				OnError: func(w http.ResponseWriter, r *http.Request, err error) {
					onError = append(onError, err)
					w.WriteHeader(http.StatusServiceUnavailable)
				}})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits++ }))
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if c.outer > 0 {
				ctx, cancel := context.WithTimeout(req.Context(), c.outer)
				defer cancel()
				req = req.WithContext(ctx)
			}
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, req)
			if took := time.Since(start); took != c.want || len(onError) != 1 || !errors.Is(onError[0], context.DeadlineExceeded) || hits != 0 || rec.Code != http.StatusServiceUnavailable {
				t.Errorf("%s: answered %d after %v, OnError %v, next %d; want OnError once after %v", c.name, rec.Code, took, onError, hits, c.want)
			}
		}
	})
}

// A request that costs 0 is free: it reaches next unchecked (a cost-0
// check is a query, which a spent budget answers 429: was). An empty key
// answers 401, as a key error does (was: 400 from the cluster).
func TestMiddlewareFreeRequestsAndEmptyKeys(t *testing.T) {
	c := &countChecker{n: 1}
	hits := 0
	cost := int64(1)
	key := "k"
	h := Middleware(c, MiddlewareConfig{Rule: "api",
		Key:  func(*http.Request) (string, error) { return key, nil },
		Cost: func(*http.Request) int64 { return cost }})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits++ }))
	serve := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec
	}
	if rec := serve(); rec.Code != http.StatusOK || hits != 1 {
		t.Fatalf("first request: %d, next %d", rec.Code, hits)
	}
	if rec := serve(); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second request, budget spent: %d, want 429", rec.Code)
	}
	cost = 0
	if rec := serve(); rec.Code != http.StatusOK || hits != 2 || rec.Header().Get("RateLimit") != "" {
		t.Errorf("a free request on a spent budget: %d, next %d, RateLimit %q; want 200 unchecked", rec.Code, hits, rec.Header().Get("RateLimit"))
	}
	cost, key = 1, ""
	if rec := serve(); rec.Code != http.StatusUnauthorized || hits != 2 {
		t.Errorf("an empty key: %d, next %d; want 401", rec.Code, hits)
	}
}

// A 429 of a closed rule whose owner could not be asked says so: the
// client exceeded nothing. Was "exceeded" for both.
func TestWriteDeniedSaysWhenDegraded(t *testing.T) {
	for _, degraded := range []bool{false, true} {
		rec := httptest.NewRecorder()
		WriteDenied(rec, RateLimit{Policy: "login", Window: time.Minute, Decision: api.Decision{Limit: 5, RetryAfterMs: 1000, Degraded: degraded}}, time.Unix(0, 0))
		var body Denied
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusTooManyRequests || body.Error != "rate_limited" || body.RetryAfterSeconds != 1 {
			t.Errorf("degraded %v: %d %+v; want 429, rate_limited, retry 1", degraded, rec.Code, body)
		}
		if got := strings.Contains(body.Message, "could not be checked"); got != degraded || strings.Contains(body.Message, "exceeded") == degraded {
			t.Errorf("degraded %v: message %q", degraded, body.Message)
		}
	}
}

// A 429's and an error's message are written as sent: a rule named
// "a<b>&c" read "a\u003cb\u003e\u0026c" (encoding/json's HTML escaping)
// to anyone reading the body raw.
func TestDeniedAndErrorBodiesAreNotHTMLEscaped(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteDenied(rec, RateLimit{Policy: "a<b>&c", Window: time.Second, Decision: api.Decision{Limit: 1, RetryAfterMs: 1}}, time.Unix(0, 0))
	if !strings.Contains(rec.Body.String(), `rate limit \"a<b>&c\" exceeded`) || strings.HasSuffix(rec.Body.String(), "\n\n") || !strings.HasSuffix(rec.Body.String(), "}\n") {
		t.Errorf("429 body %q; want the rule's name as sent, one newline", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	WriteError(rec, http.StatusBadRequest, api.CodeBadRequest, "cost must be <= 5")
	if want := `{"error":"bad_request","message":"cost must be <= 5"}` + "\n"; rec.Body.String() != want {
		t.Errorf("error body %q; want %q", rec.Body.String(), want)
	}
}

// next finds the decision the middleware made, a degraded admission
// included (a fail-open rule whose owner could not be asked was a plain
// 200 that nothing told the application of); a free request has none.
func TestMiddlewareHandsTheDecisionToNext(t *testing.T) {
	for _, degraded := range []bool{false, true} {
		c := checkerFunc(func(context.Context, string, string, int64) (api.Decision, error) {
			return api.Decision{Allowed: true, Limit: 3, Remaining: 2, Degraded: degraded}, nil
		})
		var got RateLimit
		var ok bool
		h := Middleware(c, MiddlewareConfig{Rule: "api", Window: time.Minute})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			got, ok = FromContext(r.Context())
		}))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		if !ok || got.Policy != "api" || got.Window != time.Minute || got.Decision.Remaining != 2 || got.Decision.Degraded != degraded {
			t.Errorf("degraded %v: next saw %+v, %v", degraded, got, ok)
		}
	}
	free := Middleware(checkerFunc(nil), MiddlewareConfig{Rule: "api", Cost: func(*http.Request) int64 { return 0 }})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if _, ok := FromContext(r.Context()); ok {
			t.Error("a free request carries a decision")
		}
	}))
	free.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
}

type checkerFunc func(ctx context.Context, rule, key string, cost int64) (api.Decision, error)

func (f checkerFunc) Check(ctx context.Context, rule, key string, cost int64) (api.Decision, error) {
	return f(ctx, rule, key, cost)
}
