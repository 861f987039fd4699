package httpapi

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
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
	if isLoopback(r.RemoteAddr) {
		return true
	}
	writeError(w, &api.Error{Status: http.StatusForbidden, Code: api.CodeForbidden,
		Message: "admin endpoint: no admin token is configured, so only loopback callers may use it"})
	return false
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
	writeJSON(w, http.StatusOK, rulesBody(h.admin.Rules()))
}

func (h *handler) servePutRules(w http.ResponseWriter, r *http.Request) {
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
	written, err := rules.Parse(data)
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	set, err := h.admin.PutRules(r.Context(), written)
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, rulesBody(set))
}

func (h *handler) serveCluster(w http.ResponseWriter, r *http.Request) {
	c, err := h.admin.Cluster(r.Context())
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	if c.Members == nil {
		c.Members = []api.Member{}
	}
	writeJSON(w, http.StatusOK, c)
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
	if err := h.admin.Join(r.Context(), req); err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

func (h *handler) serveLeave(w http.ResponseWriter, r *http.Request) {
	var req api.LeaveRequest
	if e := decodeStrict(limitBody(w, r), &req); e != nil {
		writeError(w, e)
		return
	}
	if err := h.admin.Leave(r.Context(), req.ID); err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

func (h *handler) serveView(w http.ResponseWriter, r *http.Request) {
	v, err := h.admin.RouterView(r.Context())
	if err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, v)
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
	if err := h.admin.SetState(r.Context(), req.ID, req.State); err != nil {
		writeError(w, h.errorOf(r, err))
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

// decodeStrict decodes one JSON object from body into v: no unknown
// fields, nothing after it.
func decodeStrict(body io.Reader, v any) *api.Error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	return atEOF(dec)
}
