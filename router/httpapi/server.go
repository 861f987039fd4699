package httpapi

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"runtime/debug"
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
// Limits against slow or oversized clients: 10 s to read a request, 10 s
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

	fs       *fasthttp.Server
	api      *handler                // Handler, when it is ours: its check path is served natively
	other    fasthttp.RequestHandler // Handler through fasthttpadaptor
	base     context.Context         // the checks' context: ends once Shutdown is done
	cancel   context.CancelFunc
	shutdown atomic.Bool

	dateSec atomic.Int64           // the second of dateVal
	dateVal atomic.Pointer[[]byte] // the Date header's value for that second
}

// Timeouts and sizes of a Server (see Server).
const (
	readTimeout  = 10 * time.Second
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

// NewServer returns a Server for h; addr is informational (Serve takes
// the listener).
func NewServer(addr string, h http.Handler) *Server {
	_ = addr
	s := &Server{Handler: h, other: fasthttpadaptor.NewFastHTTPHandler(h)}
	s.api, _ = h.(*handler)
	s.base, s.cancel = context.WithCancel(context.Background())
	s.fs = &fasthttp.Server{
		Handler:                      s.serve,
		ErrorHandler:                 s.serveError,
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
		NoDefaultDate:                true, // its refresh goroutine is process-wide (Server.date instead)
		CloseOnShutdown:              true,
		Logger:                       discard{},
	}
	return s
}

// discard is a fasthttp.Logger that drops its lines.
type discard struct{}

func (discard) Printf(string, ...any) {}

// Serve serves connections from l until Shutdown, and then returns
// http.ErrServerClosed (as http.Server.Serve does).
func (s *Server) Serve(l net.Listener) error {
	if s.ErrorLog != nil {
		s.fs.Logger = s.ErrorLog
	}
	err := s.fs.Serve(l)
	if s.shutdown.Load() {
		return http.ErrServerClosed
	}
	return err
}

// Shutdown stops accepting connections, lets the requests in progress
// finish, closes the connections and returns; ctx bounds the wait (its
// error is returned when it ends first). Checks still running then see
// their context canceled.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdown.Store(true)
	err := s.fs.ShutdownWithContext(ctx)
	s.cancel()
	return err
}

// serve routes a request: POST /v1/check to the API's check path, the
// rest to Handler.
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	if s.api != nil && ctx.IsPost() && string(ctx.Path()) == "/v1/check" {
		s.api.serveCheckFast(s.base, ctx)
	} else {
		s.other(ctx)
	}
	ctx.Response.Header.SetBytesKV(headerDate, s.date())
}

// date is the Date header's value now, formatted once a second.
func (s *Server) date() []byte {
	now := time.Now()
	if sec := now.Unix(); s.dateSec.Load() != sec || s.dateVal.Load() == nil {
		b := now.UTC().AppendFormat(make([]byte, 0, len(http.TimeFormat)), http.TimeFormat)
		s.dateVal.Store(&b)
		s.dateSec.Store(sec)
		return b
	}
	return *s.dateVal.Load()
}

// serveError answers a request fasthttp could not read: a body over the
// limit as the API answers one (413, then the connection is closed),
// anything else as fasthttp does.
func (s *Server) serveError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		e := tooLarge(&http.MaxBytesError{Limit: api.MaxBodySize})
		writeFast(ctx, e.Status, marshalError(e))
		ctx.SetConnectionClose()
		return
	}
	var se *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &se):
		ctx.Error("Request Header Fields Too Large", fasthttp.StatusRequestHeaderFieldsTooLarge)
	case isTimeout(err):
		ctx.Error("Request Timeout", fasthttp.StatusRequestTimeout)
	default:
		ctx.Error("Bad Request", fasthttp.StatusBadRequest)
	}
	ctx.SetConnectionClose()
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
			writeFast(ctx, status, marshalError(&api.Error{Status: status, Code: api.CodeInternal, Message: "internal error"}))
		}
		h.eps[epCheck].observe(status, h.now().Sub(start))
	}()
	s := h.scratch.Get().(*checkScratch)
	defer h.scratch.Put(s)
	s.reset()
	if e := h.decideCheck(base, s, ctx.PostBody(), nil); e != nil {
		status = e.Status
		writeFast(ctx, status, marshalError(e))
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
	headerDate           = []byte("Date")
	noSniffBytes         = []byte("nosniff")
)
