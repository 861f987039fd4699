// Package httpapi is ringlimit's HTTP API (README.md, "HTTP API", with
// its errors table): checks on POST /v1/check, handed to a Checker (the
// router), and the node's rules, membership, health and metrics
// endpoints, handed to an Admin.
//
// The handler New returns is a thin shell: it decodes and validates
// bodies, enforces methods and admin authentication, maps errors to the
// contract's statuses and codes, and records two metrics per request. It
// keeps no state beyond pooled scratch memory and is safe for concurrent
// use. Every answer, error or not, is JSON; every error body is an
// api.Error. A panic in a handler becomes a 500 "internal" answer and an
// error log line with the stack.
package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// Checker decides checks (the router).
type Checker interface {
	// Check decides every request and writes its result to out, which
	// has len(reqs) elements. Its error is an *router.ItemError for an
	// invalid entry (nothing spent), or an error wrapping
	// api.ErrUnavailable, or ctx's error.
	Check(ctx context.Context, reqs []router.Request, out []router.Result) error
}

// Admin is the node side of the API: rules and membership.
type Admin interface {
	// Rules returns the set in force, default first. The handler does
	// not modify it.
	Rules() []limiter.Rule
	// PutRules replaces the written rules and returns the new set in
	// force. Errors wrapping rules.ErrInvalid answer 400 invalid_rules,
	// api.ErrUnavailable 503 (no leader). It must answer by ctx's
	// deadline, which the handler sets inside the server's write
	// timeout (writeBudget).
	PutRules(ctx context.Context, written []limiter.Rule) ([]limiter.Rule, error)
	// Cluster returns the membership GET /v1/cluster shows. An error
	// wrapping api.ErrUnavailable answers 503: the node has no view of
	// the cluster yet (it has not joined one), which an empty
	// membership would hide.
	Cluster(ctx context.Context) (view.Cluster, error)
	// Join adds a member; every field of req is non-empty. It returns
	// the epoch from which the cluster lists the member as req asks
	// (api.JoinResponse.Epoch; 0 leaves it out of the answer). Errors
	// wrapping api.ErrBadRequest answer 400, api.ErrUnavailable 503.
	Join(ctx context.Context, req api.JoinRequest) (epoch uint64, err error)
	// Leave drains and removes the member id for good. id is passed on
	// as the caller sent it; an empty id means the node serving the
	// request. An error wrapping api.ErrNotFound answers 404. It must
	// answer by ctx's deadline (writeBudget).
	Leave(ctx context.Context, id string) error
	// SetState marks member id "down" (a graceful stop: still a member,
	// owning nothing) or "active" again. api.ErrNotFound answers 404,
	// api.ErrBadRequest 400. It must answer by ctx's deadline
	// (writeBudget).
	SetState(ctx context.Context, id, state string) error
	// RouterView returns what a router that is not a member needs
	// (GET /v1/cluster/view, admin: it carries the hash seed).
	RouterView(ctx context.Context) (*view.View, error)
	// Seed answers GET /v1/cluster/seed (not admin: one bit, less than
	// GET /v1/cluster tells): whether this node holds a cluster's Raft
	// state, asked by a seed before it bootstraps (api.SeedStatus).
	Seed(ctx context.Context) (api.SeedStatus, error)
	// Ready returns nil when the node is ready, else an error wrapping
	// api.ErrUnavailable whose text is the reason.
	Ready() error
}

// Config configures the handler. The zero value works: no admin token
// (admin endpoints from loopback callers only), no logging, a private
// metrics registry.
type Config struct {
	// AdminToken is the bearer token the admin endpoints require. Empty
	// means they answer only loopback callers (403 for others).
	AdminToken string
	// ViewToken is a second bearer token that GET /v1/cluster/view alone
	// accepts (besides AdminToken): what routers, gateways and Go clients
	// need to route, without the power to change rules or membership.
	// Empty: the view is admin like the rest.
	ViewToken string
	// Logger receives panics and unexpected errors; nil discards them.
	Logger *slog.Logger
	// Registry is served on /metrics and receives the HTTP metrics; nil
	// means a new registry of the handler's own. The global default
	// registry is never used.
	Registry *prometheus.Registry
	// Now is the clock of the request duration metric; nil = time.Now.
	Now func() time.Time
}

// handler is the http.Handler New returns.
type handler struct {
	checker  Checker
	admin    Admin
	log      *slog.Logger
	now      func() time.Time
	hasToken bool
	tokenSum [sha256.Size]byte // of Config.AdminToken
	hasView  bool
	viewSum  [sha256.Size]byte // of Config.ViewToken
	metrics  http.Handler
	eps      [numEndpoints]endpointMetrics
	scratch  sync.Pool // *checkScratch
	front    bool      // NewFront: the check front door alone
}

// New returns the API handler for one node: checks go to c, the rest to a.
func New(cfg Config, c Checker, a Admin) http.Handler {
	h := &handler{checker: c, admin: a, log: cfg.Logger, now: cfg.Now}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if cfg.AdminToken != "" {
		h.hasToken = true
		h.tokenSum = sha256.Sum256([]byte(cfg.AdminToken))
	}
	if cfg.ViewToken != "" {
		h.hasView = true
		h.viewSum = sha256.Sum256([]byte(cfg.ViewToken))
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	newMetrics(reg, &h.eps)
	h.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	h.scratch.New = func() any { return new(checkScratch) }
	return h
}

// The endpoints, as indexes of the metrics table.
const (
	epCheck = iota
	epRules
	epCluster
	epJoin
	epLeave
	epState
	epView
	epSeed
	epHealthz
	epReadyz
	epMetrics
	epOther // no such endpoint
	numEndpoints
)

var endpointNames = [numEndpoints]string{
	epCheck:   "/v1/check",
	epRules:   "/v1/rules",
	epCluster: "/v1/cluster",
	epJoin:    "/v1/cluster/join",
	epLeave:   "/v1/cluster/leave",
	epState:   "/v1/cluster/state",
	epView:    "/v1/cluster/view",
	epSeed:    "/v1/cluster/seed",
	epHealthz: "/healthz",
	epReadyz:  "/readyz",
	epMetrics: "/metrics",
	epOther:   "other",
}

// Methods allowed per endpoint, as the Allow header says them. HEAD is
// allowed wherever GET is.
var endpointAllow = [numEndpoints]string{
	epCheck:   "POST",
	epRules:   "GET, HEAD, PUT",
	epCluster: "GET, HEAD",
	epJoin:    "POST",
	epLeave:   "POST",
	epState:   "POST",
	epView:    "GET, HEAD",
	epSeed:    "GET, HEAD",
	epHealthz: "GET, HEAD",
	epReadyz:  "GET, HEAD",
	epMetrics: "GET, HEAD",
}

func endpointOf(path string) int {
	switch path {
	case "/v1/check":
		return epCheck
	case "/v1/rules":
		return epRules
	case "/v1/cluster":
		return epCluster
	case "/v1/cluster/join":
		return epJoin
	case "/v1/cluster/leave":
		return epLeave
	case "/v1/cluster/state":
		return epState
	case "/v1/cluster/view":
		return epView
	case "/v1/cluster/seed":
		return epSeed
	case "/healthz":
		return epHealthz
	case "/readyz":
		return epReadyz
	case "/metrics":
		return epMetrics
	}
	return epOther
}

// ServeHTTP routes, recovers panics and records the metrics.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// HeaderForwarded is in canonical form: index the map directly
	// rather than canonicalizing the name on every request.
	if v := r.Header[api.HeaderForwarded]; len(v) > 0 && v[0] != "" {
		r = r.WithContext(api.WithForwarded(r.Context()))
	}
	ep := endpointOf(r.URL.Path)
	start := h.now()
	rec := recorderPool.Get().(*recorder)
	*rec = recorder{ResponseWriter: w}
	defer func() {
		p := recover()
		if p != nil && p != http.ErrAbortHandler {
			h.log.Error("httpapi: panic in handler", "endpoint", endpointNames[ep], "method", r.Method,
				"panic", p, "stack", string(debug.Stack()))
			if !rec.wrote {
				writeError(rec, &api.Error{Status: http.StatusInternalServerError, Code: api.CodeInternal, Message: "internal error"})
			}
		}
		h.eps[ep].observe(r.Method, rec.status, h.now().Sub(start))
		if p == http.ErrAbortHandler {
			panic(p) // net/http's own way to abort a response; it logs nothing
		}
		*rec = recorder{}
		recorderPool.Put(rec)
	}()
	h.route(ep, rec, r)
}

func (h *handler) route(ep int, w http.ResponseWriter, r *http.Request) {
	if ep == epOther {
		writeError(w, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound,
			Message: "no endpoint " + r.Method + " " + truncate(r.URL.Path)})
		return
	}
	get := r.Method == http.MethodGet || r.Method == http.MethodHead
	if h.front && !h.frontRoute(ep, w, r) {
		return
	}
	switch {
	case ep == epCheck && r.Method == http.MethodPost:
		h.serveCheck(w, r)
	case ep == epRules && get:
		h.serveRules(w, r)
	case ep == epRules && r.Method == http.MethodPut:
		if h.authorize(w, r) {
			h.servePutRules(w, r)
		}
	case ep == epCluster && get:
		h.serveCluster(w, r)
	case ep == epJoin && r.Method == http.MethodPost:
		if h.authorize(w, r) {
			h.serveJoin(w, r)
		}
	case ep == epLeave && r.Method == http.MethodPost:
		if h.authorize(w, r) {
			h.serveLeave(w, r)
		}
	case ep == epState && r.Method == http.MethodPost:
		if h.authorize(w, r) {
			h.serveState(w, r)
		}
	case ep == epView && get:
		if h.authorizeView(w, r) {
			h.serveView(w, r)
		}
	case ep == epSeed && get:
		h.serveSeed(w, r)
	case ep == epHealthz && get:
		writeJSON(w, http.StatusOK, statusBody{"ok"})
	case ep == epReadyz && get:
		h.serveReady(w, r)
	case ep == epMetrics && get:
		h.metrics.ServeHTTP(w, r)
	default:
		w.Header().Set("Allow", endpointAllow[ep])
		writeError(w, &api.Error{Status: http.StatusMethodNotAllowed, Code: api.CodeMethod,
			Message: truncate(r.Method) + " " + endpointNames[ep] + ": method not allowed (allowed: " + endpointAllow[ep] + ")"})
	}
}

// statusBody is the answer of /healthz, /readyz and leave (join's is
// api.JoinResponse).
type statusBody struct {
	Status string `json:"status"`
}

func (h *handler) serveReady(w http.ResponseWriter, _ *http.Request) {
	if err := h.admin.Ready(); err != nil {
		writeError(w, &api.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: reason(err)})
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ready"})
}

// errorOf maps an error of the Checker or the Admin to the contract's
// answer. Errors it does not know are logged and answered 500 without
// their text.
func (h *handler) errorOf(r *http.Request, err error) *api.Error {
	return h.errorAt(r.Method, r.URL.Path, err)
}

// errorAt is errorOf for a request of method on path.
func (h *handler) errorAt(method, path string, err error) *api.Error {
	e := &api.Error{Message: reason(err)}
	switch {
	case errors.Is(err, rules.ErrInvalid):
		e.Status, e.Code = http.StatusBadRequest, api.CodeInvalidRules
	case errors.Is(err, router.ErrUnknownRule):
		e.Status, e.Code = http.StatusNotFound, api.CodeUnknownRule
	case errors.Is(err, api.ErrBadRequest), errors.Is(err, limiter.ErrCost):
		e.Status, e.Code = http.StatusBadRequest, api.CodeBadRequest
	case errors.Is(err, api.ErrNotFound):
		e.Status, e.Code = http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, api.ErrConflict):
		e.Status, e.Code = http.StatusConflict, api.CodeConflict
	case errors.Is(err, api.ErrLeft):
		e.Status, e.Code = http.StatusConflict, api.CodeLeft
	case errors.Is(err, api.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// A canceled context means the caller left; the answer is moot.
		e.Status, e.Code = http.StatusServiceUnavailable, api.CodeUnavailable
	default:
		h.log.Error("httpapi: unexpected error", "endpoint", path, "method", method, "err", err)
		e.Status, e.Code, e.Message = http.StatusInternalServerError, api.CodeInternal, "internal error"
	}
	return e
}

// reason is err's text for an answer's message: without the leading
// "unavailable: " (or the like) of api's sentinel errors, which the
// answer's code already says.
func reason(err error) string {
	msg := err.Error()
	for _, s := range [...]error{api.ErrUnavailable, api.ErrNotFound, api.ErrBadRequest, api.ErrConflict, api.ErrLeft} {
		if rest, ok := strings.CutPrefix(msg, s.Error()+": "); ok && errors.Is(err, s) {
			return rest
		}
	}
	return msg
}

// writeJSON answers status with v as JSON and a trailing newline.
func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, marshalLine(v))
}

// marshalLine is v as JSON and a trailing newline.
//
// Without encoding/json's HTML escaping: an answer is application/json
// with nosniff, never HTML, and escaped, an error read "limit: must be
// \u003e 0" in curl's output.
func marshalLine(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // the bodies are plain wire types: cannot happen
		panic("httpapi: marshal " + err.Error())
	}
	return b.Bytes()
}

// writeBody answers status with body, which is JSON.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	hd := w.Header()
	// Shared, never modified value slices: Set would allocate one per
	// header and answer.
	hd["Content-Type"] = contentTypeJSON
	hd["X-Content-Type-Options"] = noSniff
	if len(body) > chunkingSize {
		// net/http computes the length of a smaller answer itself; a
		// larger one (a batch's) would go out chunked without it.
		hd["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body) // a failed write means the client left
}

// chunkingSize is the most a net/http handler may write before the
// server must choose between Content-Length and chunked encoding (its
// bufferBeforeChunkingSize).
const chunkingSize = 2048

var (
	contentTypeJSON = []string{"application/json"}
	noSniff         = []string{"nosniff"}
)

// writeError answers with e's status and body.
func writeError(w http.ResponseWriter, e *api.Error) {
	writeJSON(w, e.Status, e)
}

// maxQuoted bounds how much of a caller's input an error message repeats.
const maxQuoted = 64

// truncate cuts s to about maxQuoted bytes for a message.
func truncate(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return strings.ToValidUTF8(s[:maxQuoted], "") + "…"
}

// recorder remembers the status a handler answered, for the metrics and
// for the panic handler (which can only answer when nothing was written).
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

var recorderPool = sync.Pool{New: func() any { return new(recorder) }}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote && code >= 200 {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController and http.MaxBytesReader reach the
// server's writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// limitBody returns r.Body limited to api.MaxBodySize: reading past the
// limit fails with an *http.MaxBytesError, at once when the declared
// Content-Length is over it. It hands the limit to the server's own
// writer, so that a body over it also closes the connection after the
// answer.
//
// A body with a declared length within the limit is returned as it is:
// the server's body reader ends at the declared length, so it cannot
// exceed the limit, and the common request costs no wrapper.
func limitBody(w http.ResponseWriter, r *http.Request) io.Reader {
	if r.ContentLength > api.MaxBodySize {
		return errReader{&http.MaxBytesError{Limit: api.MaxBodySize}}
	}
	if r.Body == nil { // a Request built by hand; servers always set one
		return http.NoBody
	}
	if r.ContentLength > 0 { // 0 may be "unknown" on a Request built by hand
		return r.Body
	}
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
		w = u.Unwrap()
	}
	return http.MaxBytesReader(w, r.Body, api.MaxBodySize)
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// tooLarge is the answer to a body over api.MaxBodySize.
func tooLarge(err error) *api.Error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &api.Error{Status: http.StatusRequestEntityTooLarge, Code: api.CodeTooLarge,
			Message: "request body over " + strconv.FormatInt(mbe.Limit, 10) + " bytes"}
	}
	return nil
}

// The router is the Checker of a node.
var _ Checker = (*router.Router)(nil)
