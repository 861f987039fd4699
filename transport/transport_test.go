package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo answers every check with figures derived from it, so a caller can
// tell its own answer from anybody else's.
func echo(_ context.Context, req *BatchRequest, resp *BatchResponse) {
	resp.Epoch = req.Epoch + 1
	for i, c := range req.Checks {
		resp.Results[i] = Result{
			Status:     StatusOK,
			Allowed:    c.Cost%2 == 0,
			Limit:      int64(c.Partition),
			Remaining:  int64(c.KeyHash),
			ResetAfter: time.Duration(len(c.Rule)),
		}
	}
}

func checkEcho(t testing.TB, req *BatchRequest, resp *BatchResponse) {
	t.Helper()
	if resp.Epoch != req.Epoch+1 || len(resp.Results) != len(req.Checks) {
		t.Fatalf("answer has epoch %d and %d results; want epoch %d and %d results",
			resp.Epoch, len(resp.Results), req.Epoch+1, len(req.Checks))
	}
	for i, c := range req.Checks {
		r := resp.Results[i]
		if r.Status != StatusOK || r.Remaining != int64(c.KeyHash) || r.Limit != int64(c.Partition) ||
			r.Allowed != (c.Cost%2 == 0) || r.ResetAfter != time.Duration(len(c.Rule)) {
			t.Fatalf("result %d = %+v, not the echo of %+v", i, r, c)
		}
	}
}

type testServer struct {
	*Server
	addr string
	errc chan error
	once sync.Once
}

// startServer serves h on addr ("127.0.0.1:0" for any port); prep, if set,
// runs before Serve. The server is closed when the test ends.
func startServer(t *testing.T, addr string, cfg ServerConfig, h Handler, prep func(*Server)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, cfg, h, prep)
}

func serveOn(t *testing.T, ln net.Listener, cfg ServerConfig, h Handler, prep func(*Server)) *testServer {
	ts := &testServer{Server: NewServer(cfg, h), addr: ln.Addr().String(), errc: make(chan error, 1)}
	if prep != nil {
		prep(ts.Server)
	}
	go func() { ts.errc <- ts.Serve(ln) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// stop closes the server and checks that Serve returned ErrServerClosed.
func (ts *testServer) stop(t *testing.T) {
	ts.once.Do(func() {
		_ = ts.Close()
		if err := <-ts.errc; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
}

func dial(t *testing.T, addr string, cfg ClientConfig) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testCtx bounds a test step so that a bug fails the test instead of
// hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// countingListener counts accepted connections and reports Close.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
	closed   chan struct{}
	once     sync.Once
}

func newCountingListener(t *testing.T) *countingListener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &countingListener{Listener: ln, closed: make(chan struct{})}
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func (l *countingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Many callers share one connection and each gets its own answers.
func TestConcurrentCallersShareOneConnection(t *testing.T) {
	ln := newCountingListener(t)
	ts := serveOn(t, ln, DefaultServerConfig(), HandlerFunc(echo), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	ctx := testCtx(t)

	const callers, calls = 32, 50
	rules := []string{"login", "api", "search", ""}
	errc := make(chan error, callers)
	for g := range callers {
		go func() {
			var req BatchRequest
			var resp BatchResponse
			for k := range calls {
				n := 1 + (g*calls+k)%300
				req.Epoch = uint64(g)
				req.Checks = req.Checks[:0]
				for i := range n {
					req.Checks = append(req.Checks, Check{
						Rule:      rules[(g+i)%len(rules)],
						KeyHash:   uint64(g)<<40 | uint64(k)<<20 | uint64(i),
						Partition: uint32(i),
						Cost:      uint64(g + i),
					})
				}
				if err := c.Do(ctx, &req, &resp); err != nil {
					errc <- fmt.Errorf("caller %d call %d: %w", g, k, err)
					return
				}
				for i, r := range resp.Results {
					if r.Remaining != int64(req.Checks[i].KeyHash) || resp.Epoch != uint64(g)+1 {
						errc <- fmt.Errorf("caller %d call %d result %d: got %+v (epoch %d), not its own answer", g, k, i, r, resp.Epoch)
						return
					}
				}
			}
			errc <- nil
		}()
	}
	for range callers {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if n := ln.accepted.Load(); n != 1 {
		t.Errorf("server accepted %d connections, want 1", n)
	}
}

// Requests are pipelined: the handler only returns once `inFlight` batches
// of one connection are in it at the same time.
func TestPipelining(t *testing.T) {
	const inFlight = 16
	var entered atomic.Int32
	all := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		if entered.Add(1) == inFlight {
			close(all)
		}
		select {
		case <-all:
		case <-ctx.Done():
		}
		echo(ctx, req, resp)
	})
	ln := newCountingListener(t)
	ts := serveOn(t, ln, DefaultServerConfig(), h, nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	ctx := testCtx(t)
	errc := make(chan error, inFlight)
	for i := range inFlight {
		go func() {
			req := batchOf(1+i, "r")
			var resp BatchResponse
			err := c.Do(ctx, req, &resp)
			if err == nil {
				checkEcho(t, req, &resp)
			}
			errc <- err
		}()
	}
	for range inFlight {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if n := ln.accepted.Load(); n != 1 {
		t.Errorf("server accepted %d connections, want 1", n)
	}
}

// A caller whose deadline passes gets ctx's error; the handler saw the
// deadline; the late answer is dropped and the connection still works.
func TestDeadlineExpiry(t *testing.T) {
	release := make(chan struct{})
	sawDeadline := make(chan time.Duration, 1)
	h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		if req.Checks[0].Rule == "slow" {
			dl, ok := ctx.Deadline()
			if !ok {
				dl = time.Now().Add(time.Hour)
			}
			sawDeadline <- time.Until(dl)
			<-release
		}
		echo(ctx, req, resp)
	})
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(h), nil)
	c := dial(t, ts.addr, DefaultClientConfig())

	const budget = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	var resp BatchResponse
	err := c.Do(ctx, batchOf(3, "slow"), &resp)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do past its deadline = %v, want context.DeadlineExceeded", err)
	}
	if left := <-sawDeadline; left > budget {
		t.Errorf("handler's deadline was %v away, want ≤ %v (the caller's budget)", left, budget)
	}
	close(release) // the late answer goes out now and must be dropped

	for i := range 5 {
		req := batchOf(10+i, "fast")
		if err := c.Do(testCtx(t), req, &resp); err != nil {
			t.Fatalf("Do after an expired call: %v", err)
		}
		checkEcho(t, req, &resp)
	}
}

func TestDoWithSpentDeadline(t *testing.T) {
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(echo), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := c.Do(ctx, batchOf(1, "r"), new(BatchResponse)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do with a past deadline = %v, want context.DeadlineExceeded", err)
	}
}

// rawConn speaks frames to a server without a Client.
type rawConn struct {
	t  *testing.T
	nc net.Conn
}

func dialRaw(t *testing.T, addr string) *rawConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, nc: nc}
}

func (r *rawConn) send(frame []byte) {
	if _, err := r.nc.Write(frame); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) read() ([]byte, error) { return ReadFrame(r.nc, nil) }

// A frame whose budget is spent when a worker picks it up is answered
// UNAVAILABLE per check without calling the handler.
func TestSpentFrameNotHandled(t *testing.T) {
	var calls atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		calls.Add(1)
		echo(ctx, req, resp)
	})
	var tick atomic.Int64
	base := time.Now()
	clock := func(s *Server) {
		// Every reading of the clock is 1ms after the previous one.
		s.now = func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Millisecond) }
	}
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), h, clock)
	rc := dialRaw(t, ts.addr)

	rc.send(AppendBatchRequest(nil, 77, time.Millisecond, batchOf(5, "r")))
	frame, err := rc.read()
	if err != nil {
		t.Fatal(err)
	}
	var resp BatchResponse
	id, err := DecodeBatchResponse(frame, &resp)
	if err != nil || id != 77 || len(resp.Results) != 5 {
		t.Fatalf("answer = id %d, %d results, %v; want id 77, 5 results", id, len(resp.Results), err)
	}
	for i, r := range resp.Results {
		if r.Status != StatusUnavailable {
			t.Errorf("result %d status = %v, want %v", i, r.Status, StatusUnavailable)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("handler called %d times for a spent frame, want 0", n)
	}

	// A frame without a deadline on the same connection is handled.
	req := batchOf(3, "r")
	rc.send(AppendBatchRequest(nil, 78, 0, req))
	if frame, err = rc.read(); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeBatchResponse(frame, &resp); err != nil {
		t.Fatal(err)
	}
	checkEcho(t, req, &resp)
}

// A frame whose body does not decode gets an error frame; the connection
// stays up.
func TestMalformedBodyGetsErrorFrame(t *testing.T) {
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(echo), nil)
	rc := dialRaw(t, ts.addr)

	bad := AppendBatchRequest(nil, 5, 0, batchOf(4, "r"))
	bad[HeaderSize+2] = 60 // claims 60 checks
	rc.send(bad)
	frame, err := rc.read()
	if err != nil {
		t.Fatal(err)
	}
	id, rerr, err := DecodeError(frame)
	if err != nil || id != 5 || rerr.Code != CodeMalformed {
		t.Fatalf("answer to a malformed body = id %d, %v, %v; want id 5, code %v", id, rerr, err, CodeMalformed)
	}

	req := batchOf(2, "r")
	rc.send(AppendBatchRequest(nil, 6, 0, req))
	if frame, err = rc.read(); err != nil {
		t.Fatal(err)
	}
	var resp BatchResponse
	if id, err := DecodeBatchResponse(frame, &resp); err != nil || id != 6 {
		t.Fatalf("next answer: id %d, %v", id, err)
	}
	checkEcho(t, req, &resp)
}

// A frame of an unknown version or type ends the connection, and the
// server says why in its error log.
func TestProtocolViolationClosesConnection(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mangle func([]byte)
		want   any
	}{
		{"version", func(f []byte) { f[4] = 9 }, new(*UnsupportedVersionError)},
		{"type", func(f []byte) { f[5] = 200 }, new(*UnknownFrameTypeError)},
		{"response to server", func(f []byte) { f[5] = byte(FrameBatchResponse) }, new(*UnknownFrameTypeError)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logged := make(chan error, 4)
			cfg := DefaultServerConfig()
			cfg.ErrorLog = func(err error) { logged <- err }
			ts := startServer(t, "127.0.0.1:0", cfg, HandlerFunc(echo), nil)
			rc := dialRaw(t, ts.addr)
			f := AppendBatchRequest(nil, 1, 0, batchOf(1, "r"))
			tt.mangle(f)
			rc.send(f)
			frame, err := rc.read()
			if err != nil {
				t.Fatal(err)
			}
			if id, rerr, err := DecodeError(frame); err != nil || id != 1 || rerr.Code != CodeMalformed {
				t.Fatalf("answer to a bad frame = %d, %v, %v; want an error frame for id 1", id, rerr, err)
			}
			if _, err := rc.read(); !errors.Is(err, io.EOF) {
				t.Fatalf("read after a bad frame = %v, want EOF (connection closed)", err)
			}
			if err := <-logged; !errors.As(err, tt.want) {
				t.Errorf("logged %v, want %T", err, tt.want)
			}
		})
	}
}

// blockingHandler signals entry and blocks until ctx ends.
func blockingHandler(entered chan<- struct{}) Handler {
	return HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		entered <- struct{}{}
		<-ctx.Done()
		for i := range resp.Results {
			resp.Results[i] = Result{Status: StatusUnavailable}
		}
	})
}

// Closing the server under callers ends each call: with ErrConnClosed, or
// with the answer its handler gave when the close ended its context (a
// worker that finds the writer idle writes that answer at once, so it may
// beat the close of the connection) — never a success. Every goroutine
// ends.
func TestServerClosedMidFlight(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs after the other cleanups
	const callers = 16
	entered := make(chan struct{}, callers)
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), blockingHandler(entered), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	ctx := testCtx(t)

	type outcome struct {
		err  error
		resp *BatchResponse
	}
	done := make(chan outcome, callers)
	for range callers {
		go func() {
			resp := new(BatchResponse)
			err := c.Do(ctx, batchOf(10, "r"), resp)
			done <- outcome{err, resp}
		}()
	}
	for range callers {
		<-entered
	}
	ts.stop(t)
	for range callers {
		o := <-done
		if o.err != nil {
			if !errors.Is(o.err, ErrConnClosed) {
				t.Errorf("Do while the server closed = %v, want ErrConnClosed", o.err)
			}
			continue
		}
		for i, r := range o.resp.Results {
			if r.Status != StatusUnavailable {
				t.Errorf("Do while the server closed answered result %d %v, want UNAVAILABLE (the handler's answer at close)", i, r.Status)
			}
		}
	}
	if err := c.Do(ctx, batchOf(1, "r"), new(BatchResponse)); err == nil {
		t.Errorf("Do to a closed server succeeded")
	}
	_ = c.Close()
}

// Shutdown lets the batches in flight finish and their answers arrive.
func TestShutdownFinishesInFlight(t *testing.T) {
	const callers = 8
	entered := make(chan struct{}, callers)
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		entered <- struct{}{}
		<-release
		echo(ctx, req, resp)
	})
	ln := newCountingListener(t)
	ts := serveOn(t, ln, DefaultServerConfig(), h, nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	ctx := testCtx(t)

	errc := make(chan error, callers)
	for i := range callers {
		go func() {
			req := batchOf(i+1, "r")
			var resp BatchResponse
			err := c.Do(ctx, req, &resp)
			if err == nil {
				checkEcho(t, req, &resp)
			}
			errc <- err
		}()
	}
	for range callers {
		<-entered
	}
	shut := make(chan error, 1)
	go func() { shut <- ts.Shutdown(ctx) }()
	<-ln.closed // shutdown has begun
	close(release)
	for range callers {
		if err := <-errc; err != nil {
			t.Errorf("Do in flight during Shutdown = %v, want its answer", err)
		}
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	if err := <-ts.errc; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve = %v, want ErrServerClosed", err)
	}
	ts.errc <- ErrServerClosed // for the cleanup's stop
}

// Shutdown whose context ends first closes everything and says so.
func TestShutdownContextEnds(t *testing.T) {
	entered := make(chan struct{}, 1)
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), blockingHandler(entered), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	errc := make(chan error, 1)
	go func() { errc <- c.Do(testCtx(t), batchOf(1, "r"), new(BatchResponse)) }()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown(canceled ctx) = %v, want context.Canceled", err)
	}
	if err := <-errc; !errors.Is(err, ErrConnClosed) {
		t.Errorf("Do = %v, want ErrConnClosed", err)
	}
}

// After the server restarts on the same address, the client redials.
func TestRedialAfterServerRestart(t *testing.T) {
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(echo), nil)
	cfg := DefaultClientConfig()
	cfg.RedialBackoff = 0
	c := dial(t, ts.addr, cfg)
	ctx := testCtx(t)
	req := batchOf(5, "r")
	var resp BatchResponse
	if err := c.Do(ctx, req, &resp); err != nil {
		t.Fatal(err)
	}
	ts.stop(t)
	if err := c.Do(ctx, req, &resp); err == nil {
		t.Fatal("Do with the server down succeeded")
	}
	startServer(t, ts.addr, DefaultServerConfig(), HandlerFunc(echo), nil)
	if err := c.Do(ctx, req, &resp); err != nil {
		t.Fatalf("Do after the server restarted: %v", err)
	}
	checkEcho(t, req, &resp)
}

// A failed dial is not retried until RedialBackoff has passed.
func TestRedialBackoff(t *testing.T) {
	refused := errors.New("refused")
	var dials atomic.Int32
	cfg := DefaultClientConfig()
	cfg.Dial = func(context.Context, string) (net.Conn, error) {
		dials.Add(1)
		return nil, refused
	}
	checkRedialBackoff(t, "peer:1", cfg, &dials, refused)
}

// checkRedialBackoff makes calls through a client of cfg (RedialBackoff
// set to 1 s) for addr, on a clock it moves, each failing with an error
// that is want, and checks how many dials (counted in dials by cfg.Dial)
// they made: one, then none until the back-off has passed.
func checkRedialBackoff(t *testing.T, addr string, cfg ClientConfig, dials *atomic.Int32, want error) {
	t.Helper()
	cfg.RedialBackoff = time.Second
	c := newClient(addr, cfg)
	defer c.Close()
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ctx := testCtx(t)
	for i, s := range []struct {
		advance   time.Duration
		wantDials int32
	}{
		{0, 1},
		{0, 1},
		{999 * time.Millisecond, 1},
		{time.Millisecond, 2},
		{500 * time.Millisecond, 2},
	} {
		now = now.Add(s.advance)
		err := c.Do(ctx, batchOf(1, "r"), new(BatchResponse))
		if !errors.Is(err, want) {
			t.Fatalf("call %d: Do = %v, want %v", i, err, want)
		}
		if got := dials.Load(); got != s.wantDials {
			t.Fatalf("call %d, after advancing %v: %d dials, want %d", i, s.advance, got, s.wantDials)
		}
	}
}

// A dial is bounded by DialTimeout and Close, not by the deadline of the
// call that found the connection down: that call gives up alone, and the
// dial goes on for the calls after it. Was: dialed under that call's
// context — a short deadline made the dial fail ("i/o timeout", before
// the context said so), the failure was cached for RedialBackoff and
// every caller got it; a router took the owner for gone (an audit: a
// healthy cluster's checks answered fail-open by the thousand).
func TestDialOutlivesTheCallThatStartedIt(t *testing.T) {
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(echo), nil)
	t.Run("short deadline", func(t *testing.T) {
		var dials atomic.Int32
		cfg := DefaultClientConfig()
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			if d, ok := ctx.Deadline(); ok && time.Until(d) < cfg.DialTimeout/2 {
				// As net.Dialer's socket deadline can: a timeout a
				// moment before ctx reports it.
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
		c := newClient(ts.addr, cfg)
		defer c.Close()
		short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		req := batchOf(2, "r")
		if err := c.Do(short, req, new(BatchResponse)); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a call with a short deadline failed with %v; want an answer or its own deadline", err)
		}
		answeredOnOneDial(t, c, &dials)
	})
	t.Run("caller gone", func(t *testing.T) {
		var dials atomic.Int32
		started, release := make(chan struct{}), make(chan struct{})
		cfg := DefaultClientConfig()
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			if dials.Add(1) == 1 {
				close(started)
			}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
		c := newClient(ts.addr, cfg)
		defer c.Close()
		first, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Do(first, batchOf(1, "r"), new(BatchResponse)) }()
		<-started
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled call returned %v, want context.Canceled", err)
		}
		close(release)
		answeredOnOneDial(t, c, &dials)
	})
}

// answeredOnOneDial checks that a call through c, after calls that gave
// up on their own, is answered, and that dials counted one dial in all
// (the first went on without its caller).
func answeredOnOneDial(t *testing.T, c *Client, dials *atomic.Int32) {
	t.Helper()
	req := batchOf(3, "r")
	var resp BatchResponse
	if err := c.Do(testCtx(t), req, &resp); err != nil {
		t.Fatalf("the next call failed with %v; want an answer", err)
	}
	checkEcho(t, req, &resp)
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1 (the first goes on without its caller)", n)
	}
}

// A peer that answers no dial (its packets dropped) fails its calls
// with ErrDialSlow once the dial has gone on for SlowDial: those waiting
// for it then, and those after at once, while the dial goes on. A call
// that gives up before that gets its own context's error. Was: each
// waited its own deadline (a router's 250 ms per check) for a dial
// bounded by DialTimeout.
func TestUnansweredDialFailsCallsFast(t *testing.T) {
	var dials atomic.Int32
	started := make(chan struct{}, 4)
	cfg := DefaultClientConfig()
	cfg.SlowDial = 100 * time.Millisecond
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		started <- struct{}{}
		<-ctx.Done() // a SYN never answered
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
	c := newClient("peer:1", cfg)
	defer c.Close()
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	early, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Do(early, batchOf(1, "r"), new(BatchResponse)) }()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) || errors.Is(err, ErrDialSlow) {
		t.Fatalf("a call that gave up 0 ms into the dial: %v, want its context's error alone", err)
	}
	advance(cfg.SlowDial / 2)
	if err := c.Do(testCtx(t), batchOf(1, "r"), new(BatchResponse)); !errors.Is(err, ErrDialSlow) {
		t.Fatalf("a call waiting from %v into the dial: %v, want ErrDialSlow once SlowDial is reached", cfg.SlowDial/2, err)
	}
	advance(cfg.SlowDial / 2)
	for i := range 3 {
		if err := c.Do(testCtx(t), batchOf(1, "r"), new(BatchResponse)); !errors.Is(err, ErrDialSlow) {
			t.Fatalf("call %d, %v into the dial: %v, want ErrDialSlow", i, cfg.SlowDial, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1 (going on)", n)
	}
}

func TestClientCloseFailsInFlight(t *testing.T) {
	entered := make(chan struct{}, 1)
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), blockingHandler(entered), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	errc := make(chan error, 1)
	go func() { errc <- c.Do(testCtx(t), batchOf(1, "r"), new(BatchResponse)) }()
	<-entered
	_ = c.Close()
	err := <-errc
	if !errors.Is(err, ErrClientClosed) || !errors.Is(err, ErrConnClosed) {
		t.Errorf("Do in flight during Close = %v, want ErrClientClosed and ErrConnClosed", err)
	}
	if err := c.Do(testCtx(t), batchOf(1, "r"), new(BatchResponse)); !errors.Is(err, ErrClientClosed) {
		t.Errorf("Do after Close = %v, want ErrClientClosed", err)
	}
}

func TestHandlerFaults(t *testing.T) {
	logged := make(chan error, 1)
	cfg := DefaultServerConfig()
	cfg.ErrorLog = func(err error) { logged <- err }
	h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		switch req.Checks[0].Rule {
		case "panic":
			resp.Results[0].Status = StatusOK
			panic("boom")
		case "short":
			resp.Results = resp.Results[:1]
		default:
			echo(ctx, req, resp)
		}
	})
	ts := startServer(t, "127.0.0.1:0", cfg, h, nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	for _, rule := range []string{"panic", "short"} {
		var resp BatchResponse
		if err := c.Do(testCtx(t), batchOf(3, rule), &resp); err != nil {
			t.Fatalf("%s: %v", rule, err)
		}
		for i, r := range resp.Results {
			if r.Status != StatusInternal {
				t.Errorf("%s: result %d = %v, want %v", rule, i, r.Status, StatusInternal)
			}
		}
	}
	if err := <-logged; err == nil {
		t.Error("panic not logged")
	}
	req := batchOf(3, "fine")
	var resp BatchResponse
	if err := c.Do(testCtx(t), req, &resp); err != nil {
		t.Fatal(err)
	}
	checkEcho(t, req, &resp)
}

func TestBatchLimits(t *testing.T) {
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(echo), nil)

	// The client refuses a batch over its own limit without sending it.
	cfg := DefaultClientConfig()
	cfg.Limits.MaxChecks = 10
	c := dial(t, ts.addr, cfg)
	var tooMany *TooManyChecksError
	if err := c.Do(testCtx(t), batchOf(11, "r"), new(BatchResponse)); !errors.As(err, &tooMany) {
		t.Errorf("Do(11 checks, limit 10) = %v, want *TooManyChecksError", err)
	}
	var tooLarge *FrameTooLargeError
	cfg = DefaultClientConfig()
	cfg.Limits.MaxFrameSize = 1024
	c = dial(t, ts.addr, cfg)
	if err := c.Do(testCtx(t), batchOf(200, "r"), new(BatchResponse)); !errors.As(err, &tooLarge) {
		t.Errorf("Do(200 checks, 1 KiB frames) = %v, want *FrameTooLargeError", err)
	}

	// The server answers a batch over its limit with an error frame.
	cfg = DefaultClientConfig()
	cfg.Limits.MaxChecks = 2 * DefaultMaxChecks
	c = dial(t, ts.addr, cfg)
	var remote *RemoteError
	if err := c.Do(testCtx(t), batchOf(DefaultMaxChecks+1, "r"), new(BatchResponse)); !errors.As(err, &remote) || remote.Code != CodeMalformed {
		t.Errorf("Do(%d checks) = %v, want *RemoteError %v", DefaultMaxChecks+1, err, CodeMalformed)
	}
	req := batchOf(DefaultMaxChecks, "r")
	var resp BatchResponse
	if err := c.Do(testCtx(t), req, &resp); err != nil {
		t.Fatalf("Do(%d checks) = %v", DefaultMaxChecks, err)
	}
	checkEcho(t, req, &resp)
}

func TestPool(t *testing.T) {
	epochOf := func(epoch uint64) Handler {
		return HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			echo(ctx, req, resp)
			resp.Epoch = epoch
		})
	}
	a := startServer(t, "127.0.0.1:0", DefaultServerConfig(), epochOf(1), nil)
	b := startServer(t, "127.0.0.1:0", DefaultServerConfig(), epochOf(2), nil)
	p := NewPool(DefaultClientConfig())
	defer p.Close()
	ctx := testCtx(t)
	var resp BatchResponse
	for round := range 3 {
		for _, tt := range []struct {
			addr  string
			epoch uint64
		}{{a.addr, 1}, {b.addr, 2}} {
			if err := p.Do(ctx, tt.addr, batchOf(4, "r"), &resp); err != nil || resp.Epoch != tt.epoch {
				t.Fatalf("round %d: Do(%s) = epoch %d, %v; want epoch %d", round, tt.addr, resp.Epoch, err, tt.epoch)
			}
		}
		if round == 1 {
			if err := p.Remove(a.addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	ca, _ := p.Client(a.addr)
	cb, _ := p.Client(b.addr)
	if ca == cb || ca.Addr() != a.addr {
		t.Errorf("Pool.Client mixed up addresses")
	}
	_ = p.Close()
	if err := p.Do(ctx, a.addr, batchOf(1, "r"), &resp); !errors.Is(err, ErrClientClosed) {
		t.Errorf("Do on a closed pool = %v, want ErrClientClosed", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	scfg := DefaultServerConfig()
	scfg.MaxConcurrentBatches = 0
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := NewServer(scfg, HandlerFunc(echo)).Serve(ln); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Serve with bad config = %v, want ErrInvalidConfig", err)
	}
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := NewServer(DefaultServerConfig(), nil).Serve(ln); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Serve with nil handler = %v, want ErrInvalidConfig", err)
	}
	ccfg := DefaultClientConfig()
	ccfg.DialTimeout = 0
	if _, err := Dial(testCtx(t), "127.0.0.1:1", ccfg); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Dial with bad config = %v, want ErrInvalidConfig", err)
	}
	if err := NewPool(ccfg).Do(testCtx(t), "x", batchOf(1, "r"), new(BatchResponse)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Pool.Do with bad config = %v, want ErrInvalidConfig", err)
	}
	s := NewServer(DefaultServerConfig(), HandlerFunc(echo))
	_ = s.Close()
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve after Close = %v, want ErrServerClosed", err)
	}
}
