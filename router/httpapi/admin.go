package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// authorize admits the caller of an admin endpoint or answers 401/403.
// With a token configured, the caller must send it as a bearer token
// (compared in constant time, whatever its length); without one, the
// caller must be on a loopback address.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) bool {
	if h.hasToken {
		tok, ok := bearerToken(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(tok))
		if ok && subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) == 1 {
			return true
		}
		w.Header().Set("WWW-Authenticate", "Bearer")
		msg := "admin endpoint: missing bearer token"
		if ok {
			msg = "admin endpoint: wrong bearer token"
		}
		writeError(w, &api.Error{Status: http.StatusUnauthorized, Code: api.CodeUnauthorized, Message: msg})
		return false
	}
	if !isLoopback(r.RemoteAddr) {
		writeError(w, &api.Error{Status: http.StatusForbidden, Code: api.CodeForbidden,
			Message: "admin endpoint: no admin token is configured, so only loopback callers may use it"})
		return false
	}
	if msg := browserBorne(r); msg != "" {
		writeError(w, &api.Error{Status: http.StatusForbidden, Code: api.CodeForbidden,
			Message: "admin endpoint: no admin token is configured and this request may come from a web page (" + msg + "); set --admin-token to administer from elsewhere"})
		return false
	}
	return true
}

// authorizeView is authorize for GET /v1/cluster/view, which also admits
// the view token (Config.ViewToken). With only a view token configured,
// the view takes that token and no loopback caller without it.
func (h *handler) authorizeView(w http.ResponseWriter, r *http.Request) bool {
	if !h.hasView {
		return h.authorize(w, r)
	}
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	sum := sha256.Sum256([]byte(tok))
	view := subtle.ConstantTimeCompare(sum[:], h.viewSum[:])
	admin := subtle.ConstantTimeCompare(sum[:], h.tokenSum[:])
	if ok && (view == 1 || h.hasToken && admin == 1) {
		return true
	}
	w.Header().Set("WWW-Authenticate", "Bearer")
	msg := "cluster view: missing bearer token (the view token or the admin token)"
	if ok {
		msg = "cluster view: wrong bearer token (neither the view token nor the admin token)"
	}
	writeError(w, &api.Error{Status: http.StatusUnauthorized, Code: api.CodeUnauthorized, Message: msg})
	return false
}

// browserBorne says why a loopback request may have been sent by a web
// page rather than an operator's tool, or "": a web page can reach
// loopback, but it cannot hide its Origin, it reaches us under its own
// host name after DNS rebinding, and without a CORS preflight (which we
// never grant) it can only send "simple" content types.
func browserBorne(r *http.Request) string {
	if _, ok := r.Header["Origin"]; ok {
		return "it has an Origin header"
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "none" && site != "same-origin" {
		return "Sec-Fetch-Site is " + truncate(site)
	}
	if !loopbackHost(r.Host) {
		return "its Host " + truncate(r.Host) + " is not a loopback name or address"
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !adminContentType(r.Header.Get("Content-Type")) {
		return "a write whose Content-Type is not JSON or YAML"
	}
	return ""
}

// loopbackHost reports whether a Host header names loopback: localhost
// (or a name under .localhost) or a loopback IP, with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// adminContentType reports whether a write's Content-Type is JSON or YAML.
func adminContentType(v string) bool {
	mt, _, err := mime.ParseMediaType(v)
	if err != nil {
		return false
	}
	switch mt {
	case "application/json", "application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml":
		return true
	}
	return strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+yaml")
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header value (the scheme is case-insensitive, RFC 7235).
func bearerToken(v string) (string, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	tok := strings.TrimSpace(v[len(scheme):])
	return tok, tok != ""
}

// isLoopback reports whether a RemoteAddr ("ip:port") is a loopback IP.
func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// rulesBody is the answer of GET and PUT /v1/rules.
func rulesBody(rs []limiter.Rule) api.Rules {
	body := api.Rules{Rules: make([]api.Rule, len(rs))}
	for i, r := range rs {
		body.Rules[i] = api.Rule(rules.ViewOf(r))
	}
	return body
}

func (h *handler) serveRules(w http.ResponseWriter, _ *http.Request) {
	rs := h.admin.Rules()
	if h.front && rs == nil {
		// A router knows the rules only from its view: before one, it
		// has none to list (not even default), as it has no checks to
		// decide. Was: 200 {"rules": []}. A view gone stale (the router
		// not ready) is still listed: its checks are still decided by it.
		msg := "no cluster view yet"
		if err := h.admin.Ready(); err != nil {
			msg = reason(err)
		}
		writeError(w, &api.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: msg})
		return
	}
	writeJSON(w, http.StatusOK, rulesBody(rs))
}

// A write that waits on Raft (rules, join, leave, member state) answers within
// writeBudget of its handler's start, 2s inside the server's
// writeTimeout (room to read the body and write the answer): the node's
// own bounds add up to more (a rules write: up to 12s for the Raft write
// with the default 1s Raft timeout, then up to 5s for the rules to be in
// force on this node; a leave of the leader: the hand-over of the lead
// first), and a client cut off by the write timeout learns nothing. The
// node honours the deadline in every wait and answers 503 unavailable
// saying which one ran out, and whether the outcome is unknown. A write
// a member forwarded to the leader gets forwardedWriteBudget, 1s less,
// so that the leader's answer, with its reason, reaches that member
// before the member's own deadline does.
const (
	writeBudget          = writeTimeout - 2*time.Second
	forwardedWriteBudget = writeBudget - time.Second
)

// withWriteBudget is r's context bounded by its write budget.
func withWriteBudget(r *http.Request) (context.Context, context.CancelFunc) {
	budget := writeBudget
	if api.Forwarded(r.Context()) {
		budget = forwardedWriteBudget
	}
	return context.WithTimeout(r.Context(), budget)
}

func (h *handler) servePutRules(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := withWriteBudget(r)
	defer cancel()
	data, err := io.ReadAll(limitBody(w, r))
	if err != nil {
		if e := tooLarge(err); e != nil {
			writeError(w, e)
			return
		}
		writeError(w, badRequest("reading body: "+err.Error()))
		return
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// rules.Parse reads an empty document as "no rules"; an empty PUT
		// is more likely a mistake than a wish to drop every rule.
		writeError(w, &api.Error{Status: http.StatusBadRequest, Code: api.CodeInvalidRules,
			Message: `rules document: empty body; send {"rules": []} to remove every written rule`})
		return
	}
	written, err := rules.ParseBody(data) // a document naming no rules list, or routes, is refused too
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	set, err := h.admin.PutRules(ctx, written)
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	body := rulesBody(set)
	if rv, ok := h.admin.(interface{ RulesVersion() uint64 }); ok {
		body.RulesVersion = rv.RulesVersion() // the write is in force here: this is it, or later
	}
	writeJSON(w, http.StatusOK, body)
}

func (h *handler) serveCluster(w http.ResponseWriter, r *http.Request) {
	c, err := h.admin.Cluster(r.Context())
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, ClusterOf(c))
}

func (h *handler) serveSeed(w http.ResponseWriter, r *http.Request) {
	st, err := h.admin.Seed(r.Context())
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (h *handler) serveJoin(w http.ResponseWriter, r *http.Request) {
	var req api.JoinRequest
	if e := decodeStrict(limitBody(w, r), &req); e != nil {
		writeError(w, e)
		return
	}
	for _, f := range [...]struct{ name, v string }{{"id", req.ID}, {"http", req.HTTP}, {"raft", req.Raft}, {"peer", req.Peer}} {
		if f.v == "" {
			writeError(w, badRequest(f.name+" is empty"))
			return
		}
	}
	ctx, cancel := withWriteBudget(r)
	defer cancel()
	epoch, err := h.admin.Join(ctx, req)
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, api.JoinResponse{Status: "ok", Epoch: epoch})
}

func (h *handler) serveLeave(w http.ResponseWriter, r *http.Request) {
	var req api.LeaveRequest
	if e := decodeStrict(limitBody(w, r), &req); e != nil {
		writeError(w, e)
		return
	}
	ctx, cancel := withWriteBudget(r)
	defer cancel()
	if err := h.admin.Leave(ctx, req.ID); err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

// ViewWaiter is implemented by an Admin that can hold GET
// /v1/cluster/view?after=EPOCH&rules_after=VERSION&wait=DURATION until its
// view is newer than that (a long poll), or the wait (at most 30s) ends.
// A parameter the caller left out is passed as math.MaxUint64, which no
// view is newer than: `after` alone waits for a newer epoch, `rules_after`
// alone for newer rules.
type ViewWaiter interface {
	WaitView(ctx context.Context, afterEpoch, afterRules uint64, wait time.Duration)
}

// maxViewWait bounds a long poll of the view, defaultViewWait is its wait
// when the caller names none.
const (
	maxViewWait     = 30 * time.Second
	defaultViewWait = 10 * time.Second
)

func (h *handler) serveView(w http.ResponseWriter, r *http.Request) {
	// The query is parsed whole, whether or not it waits: a bad wait with
	// nothing to wait for is refused too (was: ignored, whatever it said).
	q := r.URL.Query()
	after, rulesAfter := uint64(math.MaxUint64), uint64(math.MaxUint64)
	wait := defaultViewWait
	var err error
	if q.Has("after") {
		after, err = strconv.ParseUint(q.Get("after"), 10, 64)
	}
	if err == nil && q.Has("rules_after") {
		rulesAfter, err = strconv.ParseUint(q.Get("rules_after"), 10, 64)
	}
	if err == nil && q.Has("wait") {
		wait, err = time.ParseDuration(q.Get("wait"))
	}
	if err != nil || wait < 0 {
		writeError(w, badRequest("after and rules_after are unsigned integers, wait a non-negative duration"))
		return
	}
	if q.Has("after") || q.Has("rules_after") {
		wait = min(wait, maxViewWait)
		if vw, ok := h.admin.(ViewWaiter); ok && wait > 0 {
			// Server's write timeout counts from the handler's end
			// (fasthttp sets the deadline when it writes the answer), so
			// a poll may wait up to maxViewWait and still answer
			// (TestViewLongPollThroughServer).
			vw.WaitView(r.Context(), after, rulesAfter, wait)
		}
	}
	v, err := h.admin.RouterView(r.Context())
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, ViewOf(v))
}

func (h *handler) serveState(w http.ResponseWriter, r *http.Request) {
	var req api.StateRequest
	if e := decodeStrict(limitBody(w, r), &req); e != nil {
		writeError(w, e)
		return
	}
	if req.ID == "" || (req.State != "down" && req.State != "active") {
		writeError(w, &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest,
			Message: `want {"id": ID, "state": "down" or "active"}`})
		return
	}
	ctx, cancel := withWriteBudget(r)
	defer cancel()
	if err := h.admin.SetState(ctx, req.ID, req.State); err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

// decodeStrict decodes one JSON object from body into v (a pointer to a
// struct): no unknown fields, names matched exactly and given once
// (exactNames), nothing after it.
func decodeStrict(body io.Reader, v any) *api.Error {
	in, err := io.ReadAll(body)
	if err != nil {
		return decodeError(err)
	}
	if err := exactNames(in, jsonNames(v)); err != nil {
		return decodeError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	return atEOF(dec)
}

// ClusterOf is the wire form of a node's membership (GET /v1/cluster).
func ClusterOf(c view.Cluster) api.Cluster {
	out := api.Cluster{Leader: c.Leader, Epoch: c.Epoch, Partitions: c.Partitions, RulesVersion: c.RulesVersion, Members: make([]api.Member, 0, len(c.Members)), RaftOnly: c.RaftOnly}
	for _, m := range c.Members {
		out.Members = append(out.Members, api.Member(m))
	}
	return out
}

// ViewOf is the wire form of a view for routers that are not members
// (GET /v1/cluster/view): the ring config, the active members with their
// addresses and partition counts, the rules and their version, the seed.
func ViewOf(v *view.View) api.ClusterView {
	cfg := v.Ring.Config()
	out := api.ClusterView{Epoch: v.Epoch(), Partitions: cfg.Partitions, ReplicationFactor: cfg.ReplicationFactor,
		Load: cfg.Load, Seed: fmt.Sprintf("%016x", v.Seed), RulesVersion: v.RulesVersion,
		Members: []api.Member{}, Rules: make([]api.Rule, 0, len(v.List))}
	counts := v.Ring.Counts()
	for _, m := range v.Ring.Members() {
		out.Members = append(out.Members, api.Member{ID: m.ID, State: "active", HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer, Partitions: counts[m.ID]})
	}
	for _, r := range v.List {
		out.Rules = append(out.Rules, api.Rule(rules.ViewOf(r)))
	}
	return out
}
