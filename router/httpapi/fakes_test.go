package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/internal/pause"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// fakeChecker behaves like the router for the HTTP layer: it knows rules
// by capacity, refuses a whole call with an *router.ItemError before
// deciding anything, and otherwise answers decide's result per request.
type fakeChecker struct {
	caps   map[string]int64
	decide func(router.Request) router.Result // nil: allowed, remaining = cap - cost
	err    error                              // returned instead of deciding
	ctxKey any                                // when set, ctx must carry it

	mu    sync.Mutex // guards calls
	calls [][]router.Request
}

func newFakeChecker() *fakeChecker {
	return &fakeChecker{caps: map[string]int64{"default": 200, "small": 5}}
}

func (f *fakeChecker) Check(ctx context.Context, reqs []router.Request, out []router.Result) error {
	if len(out) != len(reqs) {
		panic(fmt.Sprintf("fakeChecker: %d results for %d requests", len(out), len(reqs)))
	}
	if f.ctxKey != nil && ctx.Value(f.ctxKey) == nil {
		return fmt.Errorf("fakeChecker: the request's context was not passed down")
	}
	if f.err != nil {
		return f.err
	}
	for i, q := range reqs {
		c, ok := f.caps[q.Rule]
		switch {
		case !ok:
			return &router.ItemError{Index: i, Err: fmt.Errorf("%w %q", router.ErrUnknownRule, q.Rule)}
		case q.Cost < 0 || q.Cost > c:
			return &router.ItemError{Index: i, Err: fmt.Errorf("%w: %w: cost %d, rule %q allows 0 to %d",
				api.ErrBadRequest, limiter.ErrCost, q.Cost, q.Rule, c)}
		}
	}
	f.mu.Lock()
	f.calls = append(f.calls, append([]router.Request(nil), reqs...))
	f.mu.Unlock()
	for i, q := range reqs {
		if f.decide != nil {
			out[i] = f.decide(q)
			continue
		}
		c := f.caps[q.Rule]
		out[i] = router.Result{Decision: limiter.Decision{Allowed: true, Limit: c, Remaining: c - q.Cost}}
	}
	return nil
}

func (f *fakeChecker) Calls() [][]router.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fakeAdmin records what the handler asks of the node side.
type fakeAdmin struct {
	mu        sync.Mutex // guards the fields below
	written   []limiter.Rule
	putErr    error
	putTakes  time.Duration // PutRules takes this long, or until its ctx ends
	cluster   api.Cluster
	joins     []api.JoinRequest
	joinEpoch uint64 // what Join returns
	joinErr   error
	leaves    []string
	leaveErr  error
	states    []string // id=state
	fwdJoins  int      // joins whose context was marked forwarded
	ready     error
	panicIn   string // "rules": Rules panics

	// memberTakes: Leave and SetState take this long, or until their
	// ctx ends.
	memberTakes time.Duration
}

func (a *fakeAdmin) Rules() []limiter.Rule {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.panicIn == "rules" {
		panic("fakeAdmin: boom")
	}
	return rules.Effective(a.written)
}

// takes waits d, or returns an error wrapping api.ErrUnavailable when
// ctx ends first.
func takes(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := pause.For(ctx, d); err != nil {
		return fmt.Errorf("%w: the write ran out of time (%w)", api.ErrUnavailable, err)
	}
	return nil
}

func (a *fakeAdmin) PutRules(ctx context.Context, written []limiter.Rule) ([]limiter.Rule, error) {
	a.mu.Lock()
	d := a.putTakes
	a.mu.Unlock()
	if err := takes(ctx, d); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.putErr != nil {
		return nil, a.putErr
	}
	a.written = written
	return rules.Effective(written), nil
}

func (a *fakeAdmin) Cluster(context.Context) (view.Cluster, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := view.Cluster{Leader: a.cluster.Leader, Epoch: a.cluster.Epoch, Partitions: a.cluster.Partitions}
	for _, m := range a.cluster.Members {
		c.Members = append(c.Members, view.Member(m))
	}
	return c, nil
}

func (a *fakeAdmin) Join(ctx context.Context, req api.JoinRequest) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if api.Forwarded(ctx) {
		a.fwdJoins++
	}
	a.joins = append(a.joins, req)
	if a.joinErr != nil {
		return 0, a.joinErr
	}
	return a.joinEpoch, nil
}

func (a *fakeAdmin) Leave(ctx context.Context, id string) error {
	a.mu.Lock()
	d := a.memberTakes
	a.mu.Unlock()
	if err := takes(ctx, d); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.leaves = append(a.leaves, id)
	return a.leaveErr
}

func (a *fakeAdmin) SetState(ctx context.Context, id, state string) error {
	a.mu.Lock()
	d := a.memberTakes
	a.mu.Unlock()
	if err := takes(ctx, d); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.states = append(a.states, id+"="+state)
	return nil
}

func (a *fakeAdmin) Seed(context.Context) (api.SeedStatus, error) {
	return api.SeedStatus{ID: "n1", InCluster: true}, nil
}

func (a *fakeAdmin) RouterView(context.Context) (*view.View, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ms []ring.Member
	for _, m := range a.cluster.Members {
		ms = append(ms, ring.Member{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer})
	}
	parts := max(a.cluster.Partitions, 1)
	r, err := ring.New(ring.Config{Partitions: parts, ReplicationFactor: 32, Load: 1.25}, a.cluster.Epoch, ms)
	if err != nil {
		return nil, err
	}
	return view.New(r, 0xff, rules.Effective(nil), 0), nil
}

func (a *fakeAdmin) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ready
}

// env is a handler with fakes behind it.
type env struct {
	h     http.Handler
	c     *fakeChecker
	a     *fakeAdmin
	reg   *prometheus.Registry
	logs  *logbuf.Buffer
	token string
}

func newEnv(t testing.TB, token string) *env {
	t.Helper()
	e := &env{c: newFakeChecker(), a: &fakeAdmin{}, reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}, token: token}
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	e.h = New(Config{AdminToken: token, Logger: log, Registry: e.reg}, e.c, e.a)
	return e
}

// do sends one request as a loopback caller (or from remote when given)
// and returns the recorded answer.
func (e *env) do(method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	req.RemoteAddr = "127.0.0.1:40000"
	req.Host = "127.0.0.1:8080" // as a local tool sends it (not a web page)
	if method != "GET" && method != "HEAD" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "RemoteAddr" {
			req.RemoteAddr = hdr[i+1]
			continue
		}
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return w
}

// apiError decodes an error answer, failing the test unless it is one
// with the given status and code.
func apiError(t *testing.T, w *httptest.ResponseRecorder, status int, code string) api.Error {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var e api.Error
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body %q: %v", w.Body, err)
	}
	if e.Code != code || e.Message == "" {
		t.Fatalf("error = %+v, want code %q and a message", e, code)
	}
	return e
}

// decodeOK decodes a 200 answer into v.
func decodeOK(t *testing.T, w *httptest.ResponseRecorder, v any) {
	t.Helper()
	if w.Code != http.StatusOK {
		t.Fatalf("status = %d, want 200; body %s", w.Code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
}

// fixedClock returns a clock that advances by step per reading.
func fixedClock(step time.Duration) func() time.Time {
	var mu sync.Mutex
	t := time.Unix(1_700_000_000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(step)
		return t
	}
}
