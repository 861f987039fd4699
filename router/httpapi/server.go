package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/ringlimit/ringlimit/api"
)

// Server serves a node's API over HTTP/1.1 with fasthttp
// (github.com/valyala/fasthttp). POST /v1/check, the request every
// caller makes, is answered by the API's own check path on fasthttp's
// request; every other request goes to Handler, the API as net/http sees
// it, through fasthttpadaptor.
//
// Why not net/http: on the machines ringlimit is measured on, net/http's
// per-request work was most of a single check's CPU. A handler that
// answers a fixed decision cost 16.0 µs of server CPU per request under
// net/http and 10.3 µs under fasthttp (bench/cmd/httpfloor, 32 callers;
// a bare read/write loop 9.2 µs), and ringlimit's check path adds ~2 µs
// to either. fasthttp reuses a request's memory and goroutine for the
// next one; it speaks HTTP/1.1 only (as net/http does without TLS).
//
// Limits against slow or oversized clients: 5 s to read a request, 10 s
// to write an answer, 120 s for an idle keep-alive connection, 16 KiB of
// request line and headers, bodies up to api.MaxBodySize (413 and the
// connection closed beyond it).
type Server struct {
	// Handler is the API in net/http's form (New, NewFront): it serves
	// every request but POST /v1/check when it is New's or NewFront's,
	// and all of them otherwise.
	Handler http.Handler
	// ErrorLog receives fasthttp's own lines; nil = discarded.
	ErrorLog *log.Logger

	fs         *fasthttp.Server
	api        *handler                // Handler, when it is ours: its check path is served natively
	other      fasthttp.RequestHandler // Handler through fasthttpadaptor
	base       context.Context         // the checks' context: ends once Shutdown is done
	cancel     context.CancelFunc
	stopping   context.Context // the other requests' context: ends as Shutdown begins
	stop       context.CancelFunc
	writes     context.Context // the rules writes' context: see detached
	endWrites  context.CancelFunc
	shutdown   atomic.Bool
	drainState               // Drain was called: every answer closes its connection
	held       chan struct{} // closed as Shutdown begins: Accept, held since Drain, returns
	// mu orders Serve's taking a listener with Shutdown: fasthttp's
	// Shutdown closes only the listeners its Serve has taken already.
	mu         sync.Mutex
	listeners  []net.Listener // guarded by mu: Serve's, closed by Shutdown
	closedHeld bool           // guarded by mu: held is closed
}

// Timeouts and sizes of a Server (see Server).
const (
	// readTimeout bounds the read of a whole request, headers and body:
	// as net/http's header timeout did, it keeps a client that trickles
	// its headers from holding a member's stop (its drain, 10 s by
	// default) for long.
	readTimeout  = 5 * time.Second
	writeTimeout = 10 * time.Second // handlers that wait answer well inside it (writeBudget)
	idleTimeout  = 120 * time.Second
	// readBufferSize bounds the request line and headers (fasthttp
	// answers 431 beyond it) and is held per open connection; a body that
	// does not fit is read into a buffer of its own.
	readBufferSize = 16 << 10
	// writeBufferSize holds the answer to a batch of 100 (~11 KiB) with
	// its headers, so that it leaves in one write.
	writeBufferSize = 16 << 10
	// workerIdle is how long an idle serving goroutine is kept; the
	// pool's cleaner, which wakes this often, ends within it of Shutdown.
	workerIdle = 10 * time.Second
)

// NewServer returns a Server for h; Serve takes the listener.
func NewServer(h http.Handler) *Server {
	s := &Server{Handler: h}
	s.api, _ = h.(*handler)
	s.held = make(chan struct{})
	s.base, s.cancel = context.WithCancel(context.Background())
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.writes, s.endWrites = context.WithCancel(context.Background())
	s.other = fasthttpadaptor.NewFastHTTPHandler(s.detached(h))
	s.fs = &fasthttp.Server{
		Handler:                      s.serve,
		ErrorHandler:                 s.serveError,
		ExpectHandler:                s.expect,
		ReadTimeout:                  readTimeout,
		WriteTimeout:                 writeTimeout,
		IdleTimeout:                  idleTimeout,
		ReadBufferSize:               readBufferSize,
		WriteBufferSize:              writeBufferSize,
		MaxIdleWorkerDuration:        workerIdle,
		MaxRequestBodySize:           api.MaxBodySize,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       discard{},
	}
	return s
}

// detached serves h with a request context of its own, ended as
// Shutdown begins (as fasthttp's was). fasthttpadaptor gives a request
// fasthttp's RequestCtx as its context, which fasthttp resets for the
// next request once the handler returns, while a context derived from
// it may still read it then: a long poll's timeout firing cancels from
// its timer's goroutine, which looks up the parent's values as the
// handler, woken by that very cancel, returns (a data race, seen once
// in CI under -race).
//
// A rules write runs to its answer instead, until Shutdown's deadline
// is near (writeMargin before it) or Shutdown is done: canceled at
// Drain, it answered 503 "leader unreachable: context canceled" for a
// write its member had forwarded to the leader, which committed it (4 of
// 6 tries, 40 ms into a member's stop, in an adversarial run with real
// processes). Other writes still end at Drain: a leave or a state change
// may be the stopping member's own, and a join is rare.
func (s *Server) detached(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parent := s.stopping
		if outlivesDrain(r) {
			parent = s.writes
		}
		ctx, cancel := context.WithCancel(parent)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// outlivesDrain reports whether r is a write whose context runs past
// Drain (see detached).
func outlivesDrain(r *http.Request) bool {
	return r.Method == http.MethodPut && r.URL.Path == "/v1/rules"
}

// writeMargin is how long before Shutdown's deadline the writes that
// outlive Drain are ended (at most half of what is left), so that they
// answer (503, their outcome unknown) and Shutdown ends in time.
const writeMargin = 500 * time.Millisecond

// discard is a fasthttp.Logger that drops its lines.
type discard struct{}

func (discard) Printf(string, ...any) {}

// Serve serves connections from l until Shutdown, and then returns
// http.ErrServerClosed (as http.Server.Serve does).
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		_ = l.Close()
		return http.ErrServerClosed
	}
	s.listeners = append(s.listeners, l)
	if s.ErrorLog != nil {
		s.fs.Logger = s.ErrorLog
	}
	s.mu.Unlock()
	err := s.fs.Serve(lingerListener{l, &s.open, &s.draining, s.held})
	if s.shutdown.Load() {
		return http.ErrServerClosed
	}
	return err
}

// Shutdown stops accepting connections, lets the requests in progress
// finish, closes the connections and returns; ctx bounds the wait (its
// error is returned when it ends first). Checks still running then see
// their context canceled.
//
// A Serve called after Shutdown returns http.ErrServerClosed, and one
// called just before, whose fasthttp Serve has not taken its listener
// yet (fasthttp's Shutdown would not see it), ends as well: Shutdown
// closes the listeners Serve was given.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown.Store(true)
	listeners := s.listeners
	if !s.closedHeld {
		s.closedHeld = true
		close(s.held)
	}
	s.mu.Unlock()
	s.stop()
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		t := time.AfterFunc(left-min(writeMargin, left/2), s.endWrites)
		defer t.Stop()
	}
	err := s.fs.ShutdownWithContext(ctx)
	s.endWrites()
	if errors.Is(err, net.ErrClosed) {
		err = nil // a listener Drain closed
	}
	for _, l := range listeners {
		_ = l.Close() // after fasthttp's own Close, which reports a second one as an error
	}
	s.cancel()
	return err
}

// Drain begins a stop's first step: the port closes (a new connection
// is refused, nothing sent on it) while the connections open are still
// served, and every answer from now on carries Connection: close and
// closes its connection, so that a keep-alive client opens its next one
// elsewhere (another router or member, behind a load balancer) after an
// answer, never under a request. Shutdown then closes the connections
// that sent nothing since. Without it, Shutdown closed idle keep-alive
// connections under clients that were sending a request on them that
// very moment: a POST that left and got EOF or a reset, which its
// client cannot tell from one that was counted. Kept accepting while
// draining, each request came on a new connection, and those waiting
// in the kernel's accept queue when the port closed were reset.
//
// Requests other than checks that wait (a long poll of the cluster view)
// end now, as they would at Shutdown, so that their connections close.
func (s *Server) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Swap(true) {
		return
	}
	s.stop()
	for _, l := range s.listeners {
		_ = l.Close() // its Accept waits for Shutdown (lingerListener)
	}
}

// drainState is what a draining front door (Server, NetHTTPDrain)
// knows of its connections.
type drainState struct {
	draining atomic.Bool  // every answer closes its connection
	open     atomic.Int64 // client connections accepted and not yet closed
	lastReq  atomic.Int64 // while draining: when a request last came (Unix ns)
}

// OpenConns is the number of client connections open now.
func (d *drainState) OpenConns() int { return int(d.open.Load()) }

// LastRequest is when a request last came while draining (the zero time
// before any).
func (d *drainState) LastRequest() time.Time {
	if ns := d.lastReq.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// request notes a request and reports whether its answer must close its
// connection (draining).
func (d *drainState) request() bool {
	if !d.draining.Load() {
		return false
	}
	d.lastReq.Store(time.Now().UnixNano())
	return true
}

// Drainer is a front door that drains as Server does (Server.Drain):
// Drain closes its port and makes every answer close its connection;
// OpenConns counts the connections still open, LastRequest says when
// one last answered a request since.
type Drainer interface {
	Drain()
	OpenConns() int
	LastRequest() time.Time
}

// NetHTTPDrain drains a net/http server (the gateway's) as Server.Drain
// does its own: Drain closes its port (net/http goes on serving the
// connections it has), and every answer from then on carries
// Connection: close (net/http then closes the connection after it);
// hijacked connections leave the count.
type NetHTTPDrain struct {
	drainState
	ln   net.Listener
	once sync.Once
}

// ServeDraining serves srv on ln (on a goroutine of its own) so that it
// can drain, and returns its Drainer. Call it instead of srv.Serve.
func ServeDraining(srv *http.Server, ln net.Listener) *NetHTTPDrain {
	d := &NetHTTPDrain{ln: ln}
	h := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.request() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			d.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			d.open.Add(-1)
		}
	}
	go func() { _ = srv.Serve(onceListener{ln, &d.once}) }()
	return d
}

// Drain closes the port and makes every answer close its connection.
func (d *NetHTTPDrain) Drain() {
	d.draining.Store(true)
	_ = onceListener{d.ln, &d.once}.Close()
}

// onceListener closes its listener once, by Drain or by the server's
// Shutdown (which would report the second close as its error).
type onceListener struct {
	net.Listener
	once *sync.Once
}

func (l onceListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

// DrainQuiet is how long the connections left open must have sent
// nothing for DrainConns to stop waiting for them: a client that sends
// at all sends within it, gets its answer and its connection closed; the
// rest are idle, and waiting longer for them closes nothing.
const DrainQuiet = 250 * time.Millisecond

// WaitDrained waits, once d is draining, until none of its connections
// is open, or none has sent a request for DrainQuiet, or most has
// passed, or half of what is left of ctx (the other half is for the
// requests in progress once the connections are closed).
func WaitDrained(ctx context.Context, d Drainer, most time.Duration) {
	if dl, ok := ctx.Deadline(); ok {
		most = min(most, time.Until(dl)/2)
	}
	ctx, cancel := context.WithTimeout(ctx, most)
	defer cancel()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for d.OpenConns() > 0 {
		last := d.LastRequest()
		if last.Before(start) {
			last = start
		}
		if time.Since(last) >= DrainQuiet {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// serve routes a request: POST /v1/check to the API's check path, the
// rest to Handler. The path is compared as the client wrote it (fasthttp
// normalises //v1/check and /x/../v1/check to /v1/check; Handler sees
// them as they are, and answers 404).
//
// Whether the answer closes its connection (draining) is read before the
// handler runs, as NetHTTPDrain does: a request that came before the
// drain is answered as it would have been. Was: read after, so a
// readiness check that found the process ready was answered with
// Connection: close when the drain began meanwhile (a flaky
// TestRouterStopDrainsItsConnections: "no cluster view yet", closing).
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	closes := s.request()
	if s.api != nil && ctx.IsPost() && isCheckPath(ctx.Request.Header.RequestURI()) {
		s.api.serveCheckFast(s.base, ctx)
	} else {
		s.other(ctx)
	}
	if closes {
		ctx.SetConnectionClose() // after the handler: fasthttpadaptor sets the response anew
	}
}

// isCheckPath reports whether the request target uri is /v1/check, with
// or without a query.
func isCheckPath(uri []byte) bool {
	const p = "/v1/check"
	return len(uri) >= len(p) && string(uri[:len(p)]) == p && (len(uri) == len(p) || uri[len(p)] == '?')
}

// endpoint is the metrics endpoint of a request fasthttp read (its
// headers at least); epOther for headers it could not read or dropped
// (their RequestURI is then "/").
func endpoint(h *fasthttp.RequestHeader) int {
	uri := h.RequestURI()
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	return endpointOf(string(uri))
}

// expect answers a request that expects 100-continue: the API's 413 at
// once for a declared body over the limit, before the client sends it;
// else 100.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	if ctx.Request.Header.ContentLength() > api.MaxBodySize {
		e := tooLarge(&http.MaxBytesError{Limit: api.MaxBodySize})
		s.count(&ctx.Request.Header, e.Status)
		writeFast(ctx, e.Status, marshalLine(e))
		lingerOnClose(ctx)
		return e.Status
	}
	return http.StatusContinue
}

// count records an answer fasthttp wrote itself in the API's metrics.
// A request whose path is no endpoint's (fasthttp dropped its headers)
// is counted under method other: fasthttp reports GET for a method it
// did not read.
func (s *Server) count(h *fasthttp.RequestHeader, status int) {
	if s.api == nil {
		return
	}
	ep, method := endpoint(h), ""
	if ep != epOther {
		method = string(h.Method())
	}
	s.api.eps[ep].observe(method, status, 0)
}

// serveError answers a request fasthttp could not read, in the API's
// error form, counted in its metrics, and closes the connection: a body
// over the limit 413 as the API answers one, headers over the read
// buffer 431, a request not read in time 408, anything else 400.
func (s *Server) serveError(ctx *fasthttp.RequestCtx, err error) {
	e := &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest, Message: "malformed request: " + truncate(err.Error())}
	var se *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = tooLarge(&http.MaxBytesError{Limit: api.MaxBodySize})
	case errors.As(err, &se):
		e.Status, e.Message = http.StatusRequestHeaderFieldsTooLarge, "request line and headers over "+strconv.Itoa(readBufferSize)+" bytes"
	case isTimeout(err):
		e.Status, e.Message = http.StatusRequestTimeout, "request not read within "+readTimeout.String()
	}
	s.count(&ctx.Request.Header, e.Status) // other when fasthttp dropped the headers
	writeFast(ctx, e.Status, marshalLine(e))
	ctx.SetConnectionClose()
	lingerOnClose(ctx)
}

// lingerOnClose makes the close of ctx's connection, which follows an
// answer given before the whole request was read, linger (lingerConn).
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*lingerConn); ok {
		c.linger.Store(true)
	}
}

// lingerListener hands out lingerConns, counting them in open while
// they are open. Closed by Drain, its Accept returns only once held is
// closed (Shutdown): fasthttp's Serve, seeing its listener fail, would
// stop serving the connections it still has.
type lingerListener struct {
	net.Listener
	open     *atomic.Int64
	draining *atomic.Bool
	held     <-chan struct{}
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		if l.draining.Load() {
			<-l.held
		}
		return nil, err
	}
	l.open.Add(1)
	return &lingerConn{Conn: c, open: l.open}, nil
}

// lingerConn closes a connection whose request was answered before it was
// read whole (a body over the limit, a malformed one) as net/http does:
// it ends its side first and reads what the client still sends, for at
// most lingerFor, before closing. Closed at once, the unread bytes made
// the kernel reset the connection, and a client still writing its body
// saw the reset instead of the 413 (cmd/ringlimit's e2e test, once).
type lingerConn struct {
	net.Conn
	linger atomic.Bool // the answer went before the request was read whole
	closed atomic.Bool
	open   *atomic.Int64 // its listener's count of open connections
}

// lingerFor bounds the discard before a lingering close.
const lingerFor = 500 * time.Millisecond

func (c *lingerConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.Conn.Close() // the error of a second Close, as it was
	}
	c.open.Add(-1) // before the socket closes: a client that saw it close sees it uncounted
	if c.linger.Load() {
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = c.Conn.SetReadDeadline(time.Now().Add(lingerFor))
		_, _ = io.Copy(io.Discard, c.Conn)
	}
	return c.Conn.Close()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// serveCheckFast is serveCheck on fasthttp's request: the same decoding,
// decision and answer, the same metrics and panic answer as ServeHTTP
// gives it. base is the checks' context.
func (h *handler) serveCheckFast(base context.Context, ctx *fasthttp.RequestCtx) {
	start := h.now()
	status := http.StatusOK
	defer func() {
		if p := recover(); p != nil {
			h.log.Error("httpapi: panic in handler", "endpoint", endpointNames[epCheck], "method", http.MethodPost,
				"panic", p, "stack", string(debug.Stack()))
			status = http.StatusInternalServerError
			ctx.Response.Reset()
			writeFast(ctx, status, marshalLine(&api.Error{Status: status, Code: api.CodeInternal, Message: "internal error"}))
		}
		h.eps[epCheck].observe(http.MethodPost, status, h.now().Sub(start))
	}()
	s := h.scratch.Get().(*checkScratch)
	defer h.scratch.Put(s)
	s.reset()
	if e := h.decideCheck(base, s, ctx.PostBody(), nil); e != nil {
		status = e.Status
		writeFast(ctx, status, marshalLine(e))
		return
	}
	writeFast(ctx, status, s.buf)
}

// writeFast answers status with body, which is JSON, as writeBody does.
// fasthttp copies the body.
func writeFast(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(contentTypeJSONBytes)
	ctx.Response.Header.SetBytesKV(headerNoSniff, noSniffBytes)
	ctx.Response.SetBody(body)
}

var (
	contentTypeJSONBytes = []byte("application/json")
	headerNoSniff        = []byte("X-Content-Type-Options")
	noSniffBytes         = []byte("nosniff")
)
