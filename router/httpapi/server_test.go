package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// countingConn counts the writes that reach a connection.
type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// countingListener hands out its connections' write counters.
type countingListener struct {
	net.Listener
	conns chan *countingConn
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: c}
	l.conns <- cc
	return cc, nil
}

// startDateRefresh starts fasthttp's process-wide Date refresh (a
// goroutine it starts at its first answer) outside any synctest bubble,
// which would otherwise own it and never end.
func startDateRefresh() {
	var h fasthttp.ResponseHeader
	_ = h.AppendBytes(nil)
}

// serveEnv serves e's handler with a Server on a loopback listener until
// the test ends; the listener reports each connection it accepts.
func serveEnv(t *testing.T, e *env) (*Server, countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(e.h)
	cl := countingListener{Listener: ln, conns: make(chan *countingConn, 16)}
	done := make(chan error, 1)
	go func() { done <- s.Serve(cl) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve after Shutdown = %v, want http.ErrServerClosed", err)
		}
	})
	return s, cl
}

// rawConn is a client connection that writes requests by hand.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// do writes req and reads the answer whole.
func (r *rawConn) do(req string) (*http.Response, []byte) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, req); err != nil {
		r.t.Fatal(err)
	}
	var sent *http.Request // the answer to a HEAD has no body, whatever its length says
	if strings.HasPrefix(req, "HEAD ") {
		sent = &http.Request{Method: http.MethodHead}
	}
	resp, err := http.ReadResponse(r.br, sent)
	if err != nil {
		r.t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		r.t.Fatal(err)
	}
	return resp, body
}

func postCheck(body string) string {
	return fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// A check answer is the API's: intact, with its length and headers, and a
// batch of 100 leaves in one write, on a connection that stays open for
// the next request.
func TestServerAnswersChecks(t *testing.T) {
	e := newEnv(t, "")
	_, cl := serveEnv(t, e)
	c := dialRaw(t, cl.Addr().String())
	out := <-cl.conns
	for _, n := range []int{100, 3, 300} {
		before := out.n.Load()
		resp, got := c.do(postCheck(batchBody(n, -1, "")))
		if resp.StatusCode != 200 || resp.ContentLength != int64(len(got)) {
			t.Fatalf("%d checks: %d, Content-Length %d, %d bytes", n, resp.StatusCode, resp.ContentLength, len(got))
		}
		if ct, ns := resp.Header.Get("Content-Type"), resp.Header.Get("X-Content-Type-Options"); ct != "application/json" || ns != "nosniff" {
			t.Errorf("%d checks: Content-Type %q, X-Content-Type-Options %q", n, ct, ns)
		}
		if d, err := http.ParseTime(resp.Header.Get("Date")); err != nil || time.Since(d).Abs() > time.Minute {
			t.Errorf("%d checks: Date %q (%v)", n, resp.Header.Get("Date"), err)
		}
		var b api.BatchResponse
		if err := json.Unmarshal(got, &b); err != nil || len(b.Results) != n {
			t.Fatalf("%d checks: answer %.80s…: %v", n, got, err)
		}
		if w := out.n.Load() - before; n <= 100 && w != 1 {
			t.Errorf("%d checks: the answer (%d bytes) took %d writes, want 1", n, len(got), w)
		}
	}
	resp, got := c.do(postCheck(`{"rule":"default","key":"k"}`))
	var d api.Decision
	if err := json.Unmarshal(got, &d); err != nil || resp.StatusCode != 200 || !d.Allowed || d.Remaining != 199 {
		t.Fatalf("single check: %d %s", resp.StatusCode, got)
	}
	if m := scrape(t, e); !strings.Contains(m, `ringlimit_http_requests_total{code="200",endpoint="/v1/check",method="POST"} 4`) {
		t.Errorf("the checks are not counted as 4 answered 200:\n%s", m)
	}

	// The API's errors, as the handler answers them.
	resp, got = c.do(postCheck(`{"rule":"nope","key":"k"}`))
	var ae api.Error
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 404 || ae.Code != api.CodeUnknownRule {
		t.Errorf("unknown rule: %d %s", resp.StatusCode, got)
	}
	resp, got = c.do(postCheck(`{"rule":"default"`))
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 400 || ae.Code != api.CodeBadRequest {
		t.Errorf("truncated body: %d %s", resp.StatusCode, got)
	}
}

// Every other request reaches the handler through net/http's types: its
// routes, methods, headers and the caller's address.
func TestServerServesTheRestThroughTheHandler(t *testing.T) {
	e := newEnv(t, "")
	_, cl := serveEnv(t, e)
	c := dialRaw(t, cl.Addr().String())
	resp, got := c.do("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp.StatusCode != 200 || strings.TrimSpace(string(got)) != `{"status":"ok"}` || resp.Header.Get("Date") == "" {
		t.Errorf("GET /healthz: %d %s, Date %q", resp.StatusCode, got, resp.Header.Get("Date"))
	}
	// A path fasthttp would normalise to /v1/check is the handler's, as
	// written: 404, as net/http answered it.
	for _, path := range []string{"//v1/check", "/x/../v1/check", "/v1/./check"} {
		if resp, _ := c.do("POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"); resp.StatusCode != 404 {
			t.Errorf("POST %s: %d, want 404", path, resp.StatusCode)
		}
	}
	if resp, _ := c.do(postCheck(`{"rule":"default","key":"q"}`)[:len("POST /v1/check")] + "?x=1" + postCheck(`{"rule":"default","key":"q"}`)[len("POST /v1/check"):]); resp.StatusCode != 200 {
		t.Errorf("POST /v1/check?x=1: %d", resp.StatusCode)
	}
	resp, _ = c.do("GET /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/check: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp, _ = c.do("GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp.StatusCode != 404 {
		t.Errorf("GET /nope: %d", resp.StatusCode)
	}
	// An admin call from loopback without a token is allowed: the
	// handler saw the caller's address.
	resp, got = c.do("GET /v1/cluster/view HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/cluster/view from loopback: %d %s", resp.StatusCode, got)
	}
	resp, _ = c.do("HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Errorf("HEAD /healthz: %d", resp.StatusCode)
	}
}

// A body over the limit is answered 413 as the API answers it, and the
// connection is closed; so is a request whose headers do not fit.
func TestServerRefusesOversizedRequests(t *testing.T) {
	e := newEnv(t, "")
	_, cl := serveEnv(t, e)
	c := dialRaw(t, cl.Addr().String())
	fmt.Fprintf(c.c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", api.MaxBodySize+1)
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ae api.Error
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 413 || ae.Code != api.CodeTooLarge {
		t.Fatalf("oversized body: %d %s", resp.StatusCode, got)
	}
	if _, err := c.br.ReadByte(); err == nil {
		t.Error("the connection stayed open after a 413")
	}

	c2 := dialRaw(t, cl.Addr().String())
	resp, got = c2.do("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", readBufferSize) + "\r\n\r\n")
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers over %d bytes: %d %s", readBufferSize, resp.StatusCode, got)
	}

	// A body that is not HTTP (a bad chunk size): the API's 400.
	c3 := dialRaw(t, cl.Addr().String())
	resp, got = c3.do("POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 400 || ae.Code != api.CodeBadRequest {
		t.Errorf("bad chunk size: %d %s", resp.StatusCode, got)
	}

	// Expect: 100-continue with a declared body over the limit: 413 before
	// the body, no 100 first.
	c4 := dialRaw(t, cl.Addr().String())
	fmt.Fprintf(c4.c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", api.MaxBodySize+1)
	resp, err = http.ReadResponse(c4.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || ae.Code != api.CodeTooLarge {
		t.Errorf("100-continue over the limit: %d %q, want the API's 413 at once", resp.StatusCode, got)
	}

	// What fasthttp answered itself is in the API's metrics: under its
	// endpoint while fasthttp still holds the request's headers, else
	// under other (it drops them when a chunked body fails).
	m := scrape(t, e)
	for _, want := range []string{
		`ringlimit_http_requests_total{code="413",endpoint="/v1/check",method="POST"} 2`,
		`ringlimit_http_requests_total{code="400",endpoint="other",method="other"} 1`,
		`ringlimit_http_requests_total{code="431",endpoint="other",method="other"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

// A panic in the check path is the API's 500 and the server goes on.
func TestServerCheckPanicIs500(t *testing.T) {
	e := newEnv(t, "")
	e.c.decide = func(q router.Request) router.Result {
		if q.Key == "boom" {
			panic("boom")
		}
		return router.Result{}
	}
	_, cl := serveEnv(t, e)
	c := dialRaw(t, cl.Addr().String())
	resp, got := c.do(postCheck(`{"rule":"default","key":"boom"}`))
	var ae api.Error
	if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 500 || ae.Code != api.CodeInternal {
		t.Fatalf("panicking check: %d %s", resp.StatusCode, got)
	}
	if !strings.Contains(e.logs.String(), "panic in handler") {
		t.Error("the panic was not logged")
	}
	c = dialRaw(t, cl.Addr().String())
	if resp, _ := c.do(postCheck(`{"rule":"default","key":"ok"}`)); resp.StatusCode != 200 {
		t.Fatalf("after the panic: %d", resp.StatusCode)
	}
}

// Serve called after Shutdown (a member stopped right after it started:
// its serving goroutine had not run yet) returns http.ErrServerClosed at
// once and closes its listener, as net/http's does. It used to accept for
// ever: fasthttp's Shutdown closes only the listeners its Serve has
// taken, and the member's stop waited for that Serve.
func TestServeAfterShutdownReturns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(http.NotFoundHandler())
	if err := s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	select {
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve after Shutdown = %v, want http.ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		_ = ln.Close()
		t.Fatal("Serve after Shutdown still serving after 10s")
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("the listener still accepts after Serve returned")
	}
}

// Shutdown lets a check in progress finish and answer before Serve
// returns.
func TestServerShutdownFinishesChecksInProgress(t *testing.T) {
	e := newEnv(t, "")
	started, release := make(chan struct{}), make(chan struct{})
	e.c.decide = func(q router.Request) router.Result {
		if q.Key == "slow" {
			close(started)
			<-release
		}
		return router.Result{Decision: limiter.Decision{Allowed: true}}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(e.h)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	c := dialRaw(t, ln.Addr().String())
	answered := make(chan int, 1)
	go func() {
		if _, err := io.WriteString(c.c, postCheck(`{"rule":"default","key":"slow"}`)); err != nil {
			answered <- 0
			return
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-started
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stopped <- s.Shutdown(ctx)
	}()
	close(release)
	if code := <-answered; code != 200 {
		t.Fatalf("the check in progress answered %d, want 200", code)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve = %v, want http.ErrServerClosed", err)
	}
}

// Once Drain is called the port is closed, and every answer on the
// connections open, checks and the rest alike, closes its connection
// after it (Connection: close); OpenConns counts the connections open.
// Was: keep-alive connections stayed open until Shutdown closed them,
// under clients sending on them that very moment.
func TestServerDrainClosesEachConnectionAfterItsAnswer(t *testing.T) {
	e := newEnv(t, "")
	s, ln := serveEnv(t, e)
	c1 := dialRaw(t, ln.Addr().String())
	if resp, _ := c1.do(postCheck(`{"rule":"default","key":"k"}`)); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before Drain: %d, Connection: close %v; want 200 on a kept connection", resp.StatusCode, resp.Close)
	}
	c2 := dialRaw(t, ln.Addr().String())
	if resp, _ := c2.do("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before Drain: /healthz %d, Connection: close %v", resp.StatusCode, resp.Close)
	}
	if n := s.OpenConns(); n != 2 {
		t.Fatalf("OpenConns = %d with two connections open, want 2", n)
	}
	s.Drain()
	for _, c := range []struct {
		conn *rawConn
		req  string
	}{{c1, postCheck(`{"rule":"default","key":"k"}`)}, {c2, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"}} {
		resp, body := c.conn.do(c.req)
		if resp.StatusCode != 200 || !resp.Close {
			t.Errorf("draining: %d %s, Connection: close %v; want 200 and the connection closed", resp.StatusCode, body, resp.Close)
		}
		_ = c.conn.c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a connection left open
		if n, err := c.conn.br.ReadByte(); err != io.EOF {
			t.Errorf("draining: after the answer read %v, %v; want EOF (closed by the server)", n, err)
		}
	}
	if n := s.OpenConns(); n != 0 {
		t.Errorf("OpenConns = %d once both were closed, want 0", n)
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("draining: a new connection was accepted; want the port closed")
	}
}

// A client still writing a body over the limit reads the 413, not a
// reset connection: the server reads and drops what it sends for a while
// before closing (lingerConn). Closed at once, Go's own client failed
// with "connection reset by peer" on some of these.
func TestServerOversizedBodyIsAnsweredNotReset(t *testing.T) {
	e := newEnv(t, "")
	_, cl := serveEnv(t, e)
	go func() { // the listener's write counters are not read here
		for range cl.conns {
		}
	}()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	body := `{"rule":"default","key":"` + strings.Repeat("x", 2<<20) + `"}`
	for i := range 40 {
		resp, err := hc.Post("http://"+cl.Addr().String()+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("post %d of a 2 MiB body: %v, want the 413", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ae api.Error
		if err := json.Unmarshal(got, &ae); err != nil || resp.StatusCode != 413 || ae.Code != api.CodeTooLarge {
			t.Fatalf("post %d: %d %s", i, resp.StatusCode, got)
		}
	}
}

// A write in progress when the drain begins runs to its answer; a
// request that waits (a long poll of the view) ends at once, so that its
// connection closes. Was: every request but checks was canceled as Drain
// began, and a rules write a follower had forwarded to the leader
// answered 503 "leader unreachable: context canceled" 40 ms into the
// member's stop, committed in 4 of 6 tries (an adversarial run with real
// processes).
func TestServerDrainLetsWritesInProgressAnswer(t *testing.T) {
	started, release := make(chan string, 3), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- r.URL.Path
		select {
		case <-release:
			w.WriteHeader(http.StatusOK)
		case <-r.Context().Done():
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	s, ln, served := serveHandler(t, h)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-served
	})
	type answer struct {
		req  string
		code int
	}
	answers := make(chan answer, 3)
	send := func(req string) {
		c := dialRaw(t, ln.Addr().String())
		go func() {
			code := 0
			if _, err := io.WriteString(c.c, req); err == nil {
				if resp, err := http.ReadResponse(c.br, nil); err == nil {
					resp.Body.Close()
					code = resp.StatusCode
				}
			}
			f := strings.Fields(req)
			answers <- answer{f[0] + " " + f[1], code}
		}()
	}
	body := `{"rules":[]}`
	send(fmt.Sprintf("PUT /v1/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	send("POST /v1/cluster/leave HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	send("GET /v1/cluster/view?after=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	for range 3 {
		<-started
	}
	s.Drain()
	got := map[string]int{}
	for range 2 { // the poll and the leave end at Drain
		a := <-answers
		got[a.req] = a.code
	}
	close(release)
	a := <-answers
	got[a.req] = a.code
	want := map[string]int{"GET /v1/cluster/view?after=1": 503, "POST /v1/cluster/leave": 503, "PUT /v1/rules": 200}
	if !maps.Equal(got, want) {
		t.Fatalf("answers %v, want %v: the write in progress answered, the poll and the leave ended by the drain", got, want)
	}
}

// A rules write still running as Shutdown's deadline nears is ended
// (writeMargin before it, at most half of what is left), so that it
// answers and Shutdown ends in time rather than report its deadline
// passed with the write under way (and the member's stop go on to close
// the node under it).
func TestServerShutdownEndsWritesBeforeItsDeadline(t *testing.T) {
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	s, ln, served := serveHandler(t, h)
	c := dialRaw(t, ln.Addr().String())
	answered := make(chan int, 1)
	go func() {
		body := `{"rules":[]}`
		code := 0
		if _, err := fmt.Fprintf(c.c, "PUT /v1/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err == nil {
			if resp, err := http.ReadResponse(c.br, nil); err == nil {
				resp.Body.Close()
				code = resp.StatusCode
			}
		}
		answered <- code
	}()
	<-started
	s.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v with a write under way; want it ended before the deadline", err)
	}
	if code := <-answered; code != http.StatusServiceUnavailable {
		t.Fatalf("the write answered %d, want the 503 of its ended context", code)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
}

// serveHandler serves h with a Server on a loopback listener; the
// channel gets what Serve returns.
func serveHandler(t *testing.T, h http.Handler) (*Server, net.Listener, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(h)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	return s, ln, served
}
