package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/server"
)

// members is a cluster of real members on loopback, in this process.
type members struct {
	ss   []*server.Server
	http []string
}

// startMembers starts n members (the first bootstraps) with the given
// rules, and waits until they agree. Sockets are not fake time: it polls
// for the condition, never sleeps a fixed while.
func startMembers(tb testing.TB, n int, rs ...limiter.Rule) *members {
	return startMembersToken(tb, n, testToken, rs...)
}

// testToken is the members' admin token, testViewToken their view token.
const (
	testToken     = "test-admin-token"
	testViewToken = "test-view-token"
)

func startMembersToken(tb testing.TB, n int, token string, rs ...limiter.Rule) *members {
	tb.Helper()
	m := &members{}
	for i := range n {
		var ls server.Listeners
		for _, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				tb.Fatal(err)
			}
			*l = ln
		}
		join := ""
		if i > 0 {
			join = m.http[0]
		}
		s, err := server.Start(server.Config{
			ID: fmt.Sprintf("n%d", i+1), HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(),
			PeerAdvertise: ls.Peer.Addr().String(), DataDir: tb.TempDir(), Join: []string{join}, AdminToken: token, ViewToken: testViewToken,
			Ring: ring.Config{Partitions: 64, ReplicationFactor: 32, Load: 1.25}, RaftTimeout: 300 * time.Millisecond,
			Router: router.Config{Timeout: 5 * time.Second},
		}, ls)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Shutdown(ctx)
		})
		m.ss = append(m.ss, s)
		m.http = append(m.http, ls.HTTP.Addr().String())
	}
	eventually(tb, "members settled", func() bool {
		for _, s := range m.ss {
			if v := s.Node.View(); v == nil || s.Node.Ready() != nil || len(v.Ring.Members()) != n {
				return false
			}
		}
		return true
	})
	if len(rs) > 0 {
		if _, err := m.ss[0].Node.PutRules(context.Background(), rs); err != nil {
			tb.Fatal(err)
		}
		eventually(tb, "rules everywhere", func() bool {
			for _, s := range m.ss {
				if v := s.Router.View(); v == nil || v.Rules[rs[0].Name] == nil {
					return false
				}
			}
			return true
		})
	}
	return m
}

func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The Ring follows the cluster and checks over the data plane; 64
// concurrent callers on one key are admitted exactly the limit, with no
// HTTP call once it has the view.
func TestRingChecksOverTheDataPlaneExactly(t *testing.T) {
	m := startMembers(t, 2, limiter.Rule{Name: "ten", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Hour})
	rc, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testToken, Refresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	eventually(t, "the ring client's first view", rc.Ready)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 4 {
				d, err := rc.Check(t.Context(), "ten", "shared", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Degraded {
					t.Error("degraded answer from a healthy cluster")
				}
				if d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 10 {
		t.Fatalf("admitted %d of 256, want exactly 10", allowed.Load())
	}
	if n := rc.HTTPFallbacks(); n != 0 {
		t.Fatalf("%d calls went over HTTP with a view in hand", n)
	}
	// The members agree: the key is spent for them too.
	d, err := client.New(m.http[1]).Check(t.Context(), "ten", "shared", 0)
	if err != nil || d.Remaining != 0 {
		t.Fatalf("members see remaining %d (err %v), want 0", d.Remaining, err)
	}
}

// Without the view (here: no admin token, so the members refuse it), the
// Ring checks over HTTP and stays exact.
func TestRingFallsBackToHTTP(t *testing.T) {
	m := startMembers(t, 1, limiter.Rule{Name: "three", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Hour})
	rc, err := client.NewRing(client.RingConfig{Members: m.http, Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	allowed := 0
	for range 5 {
		d, err := rc.Check(t.Context(), "three", "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 3 || rc.Ready() || rc.HTTPFallbacks() != 5 {
		t.Fatalf("admitted %d of 5 (want 3), ready %v (want false), %d over HTTP (want 5)", allowed, rc.Ready(), rc.HTTPFallbacks())
	}
}

// Keys that are not UTF-8 are refused by the member, over HTTP as over
// the data plane, instead of being merged: the Client once sent every
// one of them as U+FFFD (json.Marshal), so "\xff" and "\xfe" spent one
// bucket.
func TestKeysThatAreNotUTF8AreRefusedNotMerged(t *testing.T) {
	m := startMembers(t, 1, limiter.Rule{Name: "one", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	c := client.New(m.http[0])
	for _, key := range []string{"\xff", "\xfe"} {
		_, err := c.Check(t.Context(), "one", key, 1)
		var e *api.Error
		if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, "UTF-8") {
			t.Fatalf("Check(key %q) = %v; want a 400 naming UTF-8", key, err)
		}
	}
	_, err := c.CheckBatch(t.Context(), []api.CheckRequest{{Rule: "one", Key: "ok"}, {Rule: "one", Key: "a\xc3"}})
	var e *api.Error
	if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, "checks[1]") {
		t.Fatalf("CheckBatch with key %q second = %v; want a 400 naming checks[1]", "a\xc3", err)
	}
	// Nothing was spent, the valid key of the refused batch included.
	if d, err := c.Check(t.Context(), "one", "ok", 1); err != nil || !d.Allowed {
		t.Fatalf("Check(ok) after the refused batch = %+v, %v; want allowed", d, err)
	}
	// The characters JSON escapes reach their own buckets.
	for _, key := range []string{`"`, `\`, "\n", "\x00", "ü"} {
		if d, err := c.Check(t.Context(), "one", key, 1); err != nil || !d.Allowed {
			t.Fatalf("Check(%q) = %+v, %v; want allowed (a bucket of its own)", key, d, err)
		}
	}
}

// The Ring refuses a bad check with the *api.Error a member answers over
// HTTP, whether it has the view (the data plane's router refuses it) or
// falls back to HTTP: it once returned a *router.ItemError with no status
// once it had the view.
func TestRingRefusalsAreAPIErrors(t *testing.T) {
	m := startMembers(t, 1, limiter.Rule{Name: "ten", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Hour})
	cases := []struct {
		rule, key string
		cost      int64
		status    int
		code      string
	}{
		{"ten", "\xff", 1, 400, api.CodeBadRequest},
		{"ten", "", 1, 400, api.CodeBadRequest},
		{"ten", "k", 11, 400, api.CodeBadRequest},
		{"nope", "k", 1, 404, api.CodeUnknownRule},
		{"", "k", 1, 400, api.CodeBadRequest}, // was 404 unknown rule "" on the data plane (and a view read)
	}
	check := func(rc *client.Ring, how string) {
		t.Helper()
		for _, tc := range cases {
			_, err := rc.Check(t.Context(), tc.rule, tc.key, tc.cost)
			var e *api.Error
			if !errors.As(err, &e) || e.Status != tc.status || e.Code != tc.code || e.Message == "" {
				t.Errorf("%s: Check(%q, %q, %d) = %v; want %d %s", how, tc.rule, tc.key, tc.cost, err, tc.status, tc.code)
			}
		}
	}
	viewless, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: "not-the-token", Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer viewless.Close()
	check(viewless, "over HTTP")
	rc, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testToken, Refresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	eventually(t, "the ring client's first view", rc.Ready)
	check(rc, "on the data plane")
}

// A view source whose first member hangs (stopped, not refusing) reads
// the view from the next one within the same call: each member gets its
// share of the deadline. Was: the first took all of it, and a router
// whose first --cluster member hung never got a view. Real sockets: the
// deadline bounds a hang, it is not what is measured.
func TestViewSourceFailsOverFromAHungMember(t *testing.T) {
	m := startMembers(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel's backlog), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	src := client.NewViewSource([]string{ln.Addr().String(), m.http[0]}, client.WithAdminToken(testToken))
	defer src.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := src.FetchView(ctx)
	if err != nil || v == nil || v.Ring == nil {
		t.Fatalf("FetchView with the first member hung: %v, %v; want the second member's view", v, err)
	}
}

// The Ring's HTTP fallback gives up a member that hangs after
// Retry.PerTry and asks the next. Was: the try took the caller's whole
// context, so every other check hung. Real sockets.
func TestRingFallbackSkipsAHungMember(t *testing.T) {
	m := startMembers(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// No admin token: the Ring never gets a view and stays on HTTP.
	rc, err := client.NewRing(client.RingConfig{Members: []string{ln.Addr().String(), m.http[0]},
		Retry: client.Backoff{PerTry: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for i := range 4 { // the fallback takes the members in turn: each first once or more
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := rc.Check(ctx, "default", fmt.Sprint("k", i), 1)
		cancel()
		if err != nil || !d.Allowed {
			t.Fatalf("check %d with one member hung: %+v, %v", i, d, err)
		}
	}
}

// Concurrent fallback calls each take the members in their own order,
// and a member that failed a try is asked only after the others for a
// while: 8 callers × 5 checks with one member hung all succeed, and the
// hung member is tried about once per caller, not at every other check.
// Was: calls shared one rotation, so one could meet the hung member at
// all three tries and fail with time to spare, and every call that
// started there paid the whole per-try bound.
func TestRingFallbackBenchesAHungMember(t *testing.T) {
	m := startMembers(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var tried atomic.Int64
	var held []net.Conn
	var heldMu sync.Mutex
	go func() { // accepts and never answers; counts the tries' connections
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tried.Add(1)
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	defer func() {
		heldMu.Lock()
		for _, c := range held {
			c.Close()
		}
		heldMu.Unlock()
	}()
	rc, err := client.NewRing(client.RingConfig{Members: []string{ln.Addr().String(), m.http[0]},
		Retry: client.Backoff{PerTry: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				d, err := rc.Check(ctx, "default", fmt.Sprint("k", w, "-", i), 1)
				cancel()
				if err != nil || !d.Allowed {
					t.Errorf("caller %d check %d: %+v, %v", w, i, d, err)
				}
			}
		})
	}
	wg.Wait()
	if n := tried.Load(); n > 10 {
		t.Errorf("the hung member was tried %d times for 40 checks, want at most about one per caller (8)", n)
	}
}

// Ring.CheckBatch answers a batch in order, exactly, and refuses it whole
// with the member's *api.Error naming the entry, both on the data plane
// (the view in hand) and over HTTP (no view): the same batch gives the
// same answers either way.
func TestRingCheckBatch(t *testing.T) {
	m := startMembers(t, 2,
		limiter.Rule{Name: "ten", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Hour},
		limiter.Rule{Name: "three", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Hour})
	cost := func(n int64) *int64 { return &n }
	run := func(rc *client.Ring, how string) {
		t.Helper()
		// 12 checks of one key under "ten" between checks of other keys
		// under "three": the answers come back where they were asked.
		var batch []api.CheckRequest
		for i := range 24 {
			if i%2 == 0 {
				batch = append(batch, api.CheckRequest{Rule: "ten", Key: how + "-shared"})
			} else {
				batch = append(batch, api.CheckRequest{Rule: "three", Key: fmt.Sprintf("%s-%d", how, i), Cost: cost(3)})
			}
		}
		ds, err := rc.CheckBatch(t.Context(), batch)
		if err != nil || len(ds) != len(batch) {
			t.Fatalf("%s: CheckBatch = %d decisions, %v; want %d", how, len(ds), err, len(batch))
		}
		admitted := 0
		for i, d := range ds {
			switch {
			case d.Degraded:
				t.Errorf("%s: checks[%d] degraded on a healthy cluster", how, i)
			case i%2 == 1 && (d.Limit != 3 || !d.Allowed || d.Remaining != 0):
				t.Errorf("%s: checks[%d] (three, cost 3, fresh key) = %+v; want allowed, limit 3, remaining 0", how, i, d)
			case i%2 == 0 && d.Limit != 10:
				t.Errorf("%s: checks[%d] (ten) has limit %d; want 10", how, i, d.Limit)
			case i%2 == 0 && d.Allowed:
				admitted++
			}
		}
		if admitted != 10 {
			t.Errorf("%s: admitted %d of 12 checks of one key; want exactly 10", how, admitted)
		}
		// An invalid entry refuses the batch whole: nothing is spent.
		for _, tc := range []struct {
			bad    api.CheckRequest
			status int
			code   string
		}{
			{api.CheckRequest{Rule: "nope", Key: "k"}, 404, api.CodeUnknownRule},
			{api.CheckRequest{Rule: "three", Key: "k", Cost: cost(4)}, 400, api.CodeBadRequest},
			{api.CheckRequest{Rule: "three", Key: "\xff"}, 400, api.CodeBadRequest},
		} {
			fresh := how + "-untouched"
			_, err := rc.CheckBatch(t.Context(), []api.CheckRequest{{Rule: "three", Key: fresh}, {Rule: "three", Key: fresh}, tc.bad})
			var e *api.Error
			if !errors.As(err, &e) || e.Status != tc.status || e.Code != tc.code || !strings.HasPrefix(e.Message, "checks[2]: ") {
				t.Errorf("%s: CheckBatch with %+v third = %v; want %d %s naming checks[2]", how, tc.bad, err, tc.status, tc.code)
			}
			if d, err := rc.Check(t.Context(), "three", fresh, 0); err != nil || d.Remaining != 3 {
				t.Errorf("%s: after the refused batch %q has remaining %d (err %v); want 3, nothing spent", how, fresh, d.Remaining, err)
			}
		}
		_, err = rc.CheckBatch(t.Context(), make([]api.CheckRequest, api.MaxBatch+1))
		if e, ok := errors.AsType[*api.Error](err); !ok || e.Status != 400 || !strings.Contains(e.Message, "more than 1000") {
			t.Errorf("%s: CheckBatch of %d = %v; want a 400 saying more than 1000", how, api.MaxBatch+1, err)
		}
		if ds, err := rc.CheckBatch(t.Context(), nil); err != nil || len(ds) != 0 {
			t.Errorf("%s: CheckBatch(nil) = %v, %v; want no decisions", how, ds, err)
		}
	}
	viewless, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: "not-the-token", Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer viewless.Close()
	run(viewless, "http")
	if viewless.HTTPFallbacks() == 0 {
		t.Error("the viewless Ring sent nothing over HTTP")
	}
	rc, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testToken, Refresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	eventually(t, "the ring client's first view", rc.Ready)
	run(rc, "dataplane")
	if n := rc.HTTPFallbacks(); n != 0 {
		t.Errorf("%d calls went over HTTP with a view in hand", n)
	}
	rc.Close()
	if _, err := rc.CheckBatch(t.Context(), []api.CheckRequest{{Rule: "ten", Key: "k"}}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("CheckBatch after Close = %v; want ErrClosed", err)
	}
}

// A Ring whose admin token the members refuse says so: ViewError is the
// members' 401, while the checks go over HTTP. With the right token it
// is nil once the view is read. Was: the fallback was silent, as the
// router's log lines go nowhere by default.
func TestRingViewErrorNamesARefusedToken(t *testing.T) {
	m := startMembers(t, 1)
	wrong, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: "not-the-token", Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	eventually(t, "the first view read to fail", func() bool { return wrong.ViewError() != nil })
	e, ok := errors.AsType[*api.Error](wrong.ViewError())
	if !ok || e.Status != 401 || !strings.Contains(wrong.ViewError().Error(), m.http[0]) {
		t.Fatalf("ViewError() = %v; want the member %s's 401", wrong.ViewError(), m.http[0])
	}
	if d, err := wrong.Check(t.Context(), "default", "k", 1); err != nil || !d.Allowed || wrong.HTTPFallbacks() != 1 {
		t.Fatalf("Check = %+v, %v with %d over HTTP; want allowed over HTTP", d, err, wrong.HTTPFallbacks())
	}
	right, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testToken, Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer right.Close()
	eventually(t, "the ring client's first view", right.Ready)
	if err := right.ViewError(); err != nil {
		t.Fatalf("ViewError() = %v with the view read; want nil", err)
	}
}

// A Ring given the members' view token routes on the data plane as one
// given the admin token does; the view token writes nothing.
func TestRingWithTheViewToken(t *testing.T) {
	m := startMembers(t, 1, limiter.Rule{Name: "two", Algorithm: limiter.TokenBucket, Limit: 2, Period: time.Hour})
	rc, err := client.NewRing(client.RingConfig{Members: m.http, AdminToken: testViewToken, Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	eventually(t, "the ring client's first view", rc.Ready)
	for i, want := range []bool{true, true, false} {
		d, err := rc.Check(t.Context(), "two", "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("check %d: %+v, %v; want allowed %v", i, d, err, want)
		}
	}
	if n := rc.HTTPFallbacks(); n != 0 {
		t.Fatalf("%d checks over HTTP; want all on the data plane", n)
	}
	_, err = client.New(m.http[0], client.WithAdminToken(testViewToken)).PutRules(t.Context(),
		[]byte(`{"rules":[{"name":"two","algorithm":"token_bucket","limit":1000,"period":"1s"}]}`), "application/json")
	if e, ok := errors.AsType[*api.Error](err); !ok || e.Status != 401 {
		t.Fatalf("PUT /v1/rules with the view token: %v; want 401", err)
	}
	if r := m.ss[0].Node.View().Rules["two"]; r == nil || r.Limit != 2 {
		t.Fatalf("rule two after the refused PUT: %+v", r)
	}
}

// Close cuts short a check on its HTTP fallback, as it does one on the
// data plane: it returns ErrClosed at once. Was: the check went on
// retrying with its caller's context after Close, and ended with that
// context's deadline. Real sockets: the member hangs.
func TestRingCloseCutsTheFallbackShort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reached := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			reached <- struct{}{}
		}
	}()
	rc, err := client.NewRing(client.RingConfig{Members: []string{ln.Addr().String()}, Retry: client.Backoff{PerTry: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := rc.Check(ctx, "default", "k", 1)
		done <- err
	}()
	<-reached // the view source's first read
	<-reached // the check's fallback try
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrClosed) {
			t.Errorf("check cut short by Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("check still running 10s after Close")
	}
}
