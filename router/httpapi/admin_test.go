package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// adminCalls are one valid call of each admin endpoint.
var adminCalls = []struct{ method, path, body string }{
	{"PUT", "/v1/rules", `{"rules":[{"name":"a","algorithm":"gcra","limit":1,"period":"1s"}]}`},
	{"POST", "/v1/cluster/join", `{"id":"n2","http":"h:1","raft":"h:2","peer":"h:3"}`},
	{"POST", "/v1/cluster/leave", `{"id":"n2"}`},
	{"POST", "/v1/cluster/state", `{"id":"n2","state":"down"}`},
	{"GET", "/v1/cluster/view", ""},
}

func TestAdminAuth(t *testing.T) {
	tests := []struct {
		name   string
		token  string // configured
		hdr    []string
		status int
		code   string
	}{
		{"token: none sent", "s3cret", nil, 401, api.CodeUnauthorized},
		{"token: wrong", "s3cret", []string{"Authorization", "Bearer s3cre"}, 401, api.CodeUnauthorized},
		{"token: longer", "s3cret", []string{"Authorization", "Bearer s3crett"}, 401, api.CodeUnauthorized},
		{"token: not bearer", "s3cret", []string{"Authorization", "Basic s3cret"}, 401, api.CodeUnauthorized},
		{"token: bare", "s3cret", []string{"Authorization", "s3cret"}, 401, api.CodeUnauthorized},
		{"token: empty bearer", "s3cret", []string{"Authorization", "Bearer "}, 401, api.CodeUnauthorized},
		{"token: right", "s3cret", []string{"Authorization", "Bearer s3cret"}, 200, ""},
		{"token: right, scheme case", "s3cret", []string{"Authorization", "bearer s3cret"}, 200, ""},
		{"token: right from afar", "s3cret", []string{"Authorization", "Bearer s3cret", "RemoteAddr", "203.0.113.9:5000"}, 200, ""},
		{"token: wrong from loopback", "s3cret", []string{"Authorization", "Bearer nope", "RemoteAddr", "127.0.0.1:1"}, 401, api.CodeUnauthorized},
		{"no token: loopback v4", "", []string{"RemoteAddr", "127.0.0.1:5000"}, 200, ""},
		{"no token: loopback 127/8", "", []string{"RemoteAddr", "127.3.2.1:5000"}, 200, ""},
		{"no token: loopback v6", "", []string{"RemoteAddr", "[::1]:5000"}, 200, ""},
		{"no token: v4-mapped loopback", "", []string{"RemoteAddr", "[::ffff:127.0.0.1]:5000"}, 200, ""},
		{"no token: remote", "", []string{"RemoteAddr", "203.0.113.9:5000"}, 403, api.CodeForbidden},
		{"no token: private", "", []string{"RemoteAddr", "10.0.0.1:5000"}, 403, api.CodeForbidden},
		{"no token: unspecified", "", []string{"RemoteAddr", "0.0.0.0:5000"}, 403, api.CodeForbidden},
		{"no token: garbage addr", "", []string{"RemoteAddr", "localhost"}, 403, api.CodeForbidden},
		{"no token: bearer sent anyway", "", []string{"RemoteAddr", "203.0.113.9:5000", "Authorization", "Bearer x"}, 403, api.CodeForbidden},
	}
	for _, tt := range tests {
		for _, c := range adminCalls {
			t.Run(tt.name+" "+c.path, func(t *testing.T) {
				e := newEnv(t, tt.token)
				w := e.do(c.method, c.path, c.body, tt.hdr...)
				if tt.status == 200 {
					if w.Code != 200 {
						t.Fatalf("status %d: %s", w.Code, w.Body)
					}
					return
				}
				apiError(t, w, tt.status, tt.code)
				if got := w.Header().Get("WWW-Authenticate"); (tt.status == 401) != (got == "Bearer") {
					t.Errorf("WWW-Authenticate = %q", got)
				}
				if len(e.a.joins)+len(e.a.leaves) != 0 || e.a.written != nil {
					t.Errorf("an unauthorized call reached the node")
				}
			})
		}
	}
}

// Non-admin endpoints need no token, from anywhere.
func TestPublicEndpointsNeedNoToken(t *testing.T) {
	e := newEnv(t, "s3cret")
	for _, p := range []string{"/v1/rules", "/v1/cluster", "/healthz", "/readyz", "/metrics"} {
		if w := e.do("GET", p, "", "RemoteAddr", "203.0.113.9:1"); w.Code != 200 {
			t.Errorf("GET %s: %d %s", p, w.Code, w.Body)
		}
	}
	if w := e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`, "RemoteAddr", "203.0.113.9:1"); w.Code != 200 {
		t.Errorf("POST /v1/check: %d %s", w.Code, w.Body)
	}
}

var wantDefault = api.Rule{Name: "default", Algorithm: "token_bucket", Limit: 100, Period: "1s", Burst: 200, FailureMode: "open"}

func TestRulesGet(t *testing.T) {
	e := newEnv(t, "")
	e.a.written = []limiter.Rule{
		{Name: "login", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Minute, FailureMode: limiter.FailClosed},
		{Name: "api", Algorithm: limiter.GCRA, Limit: 10, Period: time.Second},
	}
	var got api.Rules
	decodeOK(t, e.do("GET", "/v1/rules", ""), &got)
	want := []api.Rule{
		wantDefault,
		{Name: "login", Algorithm: "sliding_log", Limit: 5, Period: "1m", Burst: 5, FailureMode: "closed"},
		{Name: "api", Algorithm: "gcra", Limit: 10, Period: "1s", Burst: 10, FailureMode: "open"},
	}
	if !reflect.DeepEqual(got.Rules, want) {
		t.Errorf("rules = %+v, want %+v", got.Rules, want)
	}
}

func TestRulesPut(t *testing.T) {
	tests := []struct {
		name, ctype, body string
	}{
		{"json", "application/json", `{"rules":[{"name":"login","algorithm":"sliding_log","limit":5,"period":"1m","failure_mode":"closed"},
			{"name":"public-api","algorithm":"token_bucket","limit":100,"period":"1s","burst":300}]}`},
		{"yaml", "application/yaml", `
rules:
  - name: login
    algorithm: sliding_log
    limit: 5
    period: 1m
    failure_mode: closed
  - name: public-api
    algorithm: token_bucket   # capacity 300
    limit: 100
    period: 1s
    burst: 300
`},
		{"yaml without content type", "", "rules:\n- {name: login, algorithm: sliding_log, limit: 5, period: 1m, failure_mode: closed}\n- {name: public-api, algorithm: token_bucket, limit: 100, period: 1s, burst: 300}\n"},
	}
	want := []api.Rule{
		wantDefault,
		{Name: "login", Algorithm: "sliding_log", Limit: 5, Period: "1m", Burst: 5, FailureMode: "closed"},
		{Name: "public-api", Algorithm: "token_bucket", Limit: 100, Period: "1s", Burst: 300, FailureMode: "open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// With a token, so that a write without a Content-Type is
			// allowed (without one it is refused as browser-borne).
			e := newEnv(t, "tok")
			hdr := []string{"Authorization", "Bearer tok", "Content-Type", tt.ctype}
			var got api.Rules
			decodeOK(t, e.do("PUT", "/v1/rules", tt.body, hdr...), &got)
			if !reflect.DeepEqual(got.Rules, want) {
				t.Errorf("PUT answered %+v, want %+v", got.Rules, want)
			}
			if len(e.a.written) != 2 || e.a.written[1].Burst != 300 {
				t.Errorf("node got %+v", e.a.written)
			}
			var again api.Rules
			decodeOK(t, e.do("GET", "/v1/rules", ""), &again)
			if !reflect.DeepEqual(again, got) {
				t.Errorf("GET after PUT = %+v, want %+v", again, got)
			}
		})
	}
}

func TestRulesPutErrors(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		putErr error
		status int
		code   string
		msg    string // substring
	}{
		{"unknown algorithm", `{"rules":[{"name":"x","algorithm":"magic","limit":1,"period":"1s"}]}`, nil, 400, api.CodeInvalidRules, `rule "x": algorithm: unknown algorithm "magic"`},
		{"limit 0", "rules:\n- {name: why, algorithm: gcra, limit: 0, period: 1s}\n", nil, 400, api.CodeInvalidRules, `rule "why": limit`},
		{"unknown field", "rules:\n- {name: why, algorithm: gcra, limit: 1, period: 1s, colour: red}\n", nil, 400, api.CodeInvalidRules, `rule "why": colour: unknown field`},
		{"duplicate", "rules:\n- {name: why, algorithm: gcra, limit: 1, period: 1s}\n- {name: why, algorithm: gcra, limit: 1, period: 1s}\n", nil, 400, api.CodeInvalidRules, "duplicate name"},
		{"not yaml", "rules: [", nil, 400, api.CodeInvalidRules, "not valid YAML or JSON"},
		{"empty", "  \n", nil, 400, api.CodeInvalidRules, "empty body"},
		{"no rules list", `{}`, nil, 400, api.CodeInvalidRules, `names no rules list`},
		{"comments only", "# rules to come\n", nil, 400, api.CodeInvalidRules, `names no rules list`},
		{"routes", "rules: []\nroutes:\n- {name: r, path: /*, limits: [{rule: default}]}\n", nil, 400, api.CodeInvalidRules, "routes: not written through the rules API"},
		{"over 1 MiB", "rules: []\n" + strings.Repeat("#", api.MaxBodySize), nil, 413, api.CodeTooLarge, "request body over"},
		{"no leader", `{"rules":[]}`, fmt.Errorf("node: %w: no leader", api.ErrUnavailable), 503, api.CodeUnavailable, "no leader"},
		{"node rejects", `{"rules":[]}`, fmt.Errorf("node: %w", &rules.Error{Index: -1, Field: "rules", Msg: "too many"}), 400, api.CodeInvalidRules, "too many"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "")
			e.a.putErr = tt.putErr
			got := apiError(t, e.do("PUT", "/v1/rules", tt.body), tt.status, tt.code)
			if !strings.Contains(got.Message, tt.msg) {
				t.Errorf("message = %q, want it to contain %q", got.Message, tt.msg)
			}
			if e.a.written != nil {
				t.Errorf("rules written: %+v", e.a.written)
			}
		})
	}
}

// An error's message is written as it reads: "must be > 0", not
// encoding/json's HTML-escaped "must be \u003e 0" (a new user's walk
// through the README, reading curl's output).
func TestErrorMessagesAreNotHTMLEscaped(t *testing.T) {
	e := newEnv(t, "")
	rec := e.do("PUT", "/v1/rules", "rules:\n- {name: a, algorithm: gcra, limit: -5, period: 1s}\n")
	if body := rec.Body.String(); rec.Code != 400 || !strings.Contains(body, `limit: must be > 0, got -5`) {
		t.Fatalf("%d %s; want 400 with the message as written", rec.Code, body)
	}
}

// A rules write whose node side would take longer than the server's
// write timeout (up to 12s for the Raft write, then 5s for the rules to
// be in force) answers 503 within its budget instead, with the node's
// reason, while the server can still write it; a write forwarded by
// another member answers a second earlier, before that member's own
// budget runs out.
func TestRulesPutAnswersWithinTheWriteTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  []string
		want time.Duration
	}{
		{"from a client", nil, 8 * time.Second},
		{"forwarded by a member", []string{api.HeaderForwarded, "1"}, 7 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, "")
				e.a.putTakes = 17 * time.Second
				start := time.Now()
				w := e.do("PUT", "/v1/rules", `{"rules":[]}`, tc.hdr...)
				took := time.Since(start)
				got := apiError(t, w, http.StatusServiceUnavailable, api.CodeUnavailable)
				if took != tc.want || took >= writeTimeout || !strings.Contains(got.Message, "ran out of time (context deadline exceeded)") {
					t.Errorf("PUT /v1/rules answered %q after %v; want the node's reason after %v, within the write timeout", got.Message, took, tc.want)
				}
			})
		})
	}
}

// A leave or a member state change, which wait on Raft as a rules write
// does (a leave of the leader hands the lead on first), answer 503
// within the same budget, with the node's reason, rather than be cut off
// by the server's write timeout.
func TestMembershipWritesAnswerWithinTheWriteTimeout(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		hdr              []string
		want             time.Duration
	}{
		{"leave", "/v1/cluster/leave", `{"id":"n2"}`, nil, 8 * time.Second},
		{"leave, forwarded", "/v1/cluster/leave", `{"id":"n2"}`, []string{api.HeaderForwarded, "1"}, 7 * time.Second},
		{"state", "/v1/cluster/state", `{"id":"n2","state":"down"}`, nil, 8 * time.Second},
		{"state, forwarded", "/v1/cluster/state", `{"id":"n2","state":"down"}`, []string{api.HeaderForwarded, "1"}, 7 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, "")
				e.a.memberTakes = 17 * time.Second
				start := time.Now()
				w := e.do("POST", tc.path, tc.body, tc.hdr...)
				took := time.Since(start)
				got := apiError(t, w, http.StatusServiceUnavailable, api.CodeUnavailable)
				if took != tc.want || !strings.Contains(got.Message, "ran out of time (context deadline exceeded)") {
					t.Errorf("POST %s answered %q after %v; want the node's reason after %v, within the write timeout", tc.path, got.Message, took, tc.want)
				}
			})
		})
	}
}

func TestCluster(t *testing.T) {
	e := newEnv(t, "")
	var got map[string]any
	decodeOK(t, e.do("GET", "/v1/cluster", ""), &got)
	if m, ok := got["members"].([]any); !ok || len(m) != 0 {
		t.Errorf("no members = %v, want []", got["members"])
	}
	e.a.cluster = api.Cluster{Leader: "n1", Epoch: 42, Partitions: 1024, Members: []api.Member{
		{ID: "n1", State: "active", HTTP: "127.0.0.1:8080", Raft: "127.0.0.1:8081", Peer: "127.0.0.1:8082", Partitions: 341, Voter: new(true)},
		{ID: "n2", State: "active", HTTP: "127.0.0.1:9080", Raft: "127.0.0.1:9081", Peer: "127.0.0.1:9082", Partitions: 341, Voter: new(false)},
		{ID: "n3", State: "down", HTTP: "127.0.0.1:7080", Raft: "127.0.0.1:7081", Peer: "127.0.0.1:7082"},
	}}
	w := e.do("GET", "/v1/cluster", "")
	var c api.Cluster
	decodeOK(t, w, &c)
	if !reflect.DeepEqual(c, e.a.cluster) {
		t.Errorf("cluster = %+v, want %+v", c, e.a.cluster)
	}
	// voter follows the existing fields, and is left out where unknown.
	for _, want := range []string{`"partitions":341,"voter":true}`, `"partitions":341,"voter":false}`, `"peer":"127.0.0.1:7082","partitions":0}`} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("body %s lacks %s", w.Body, want)
		}
	}
	// The router view does not report voters.
	if w := e.do("GET", "/v1/cluster/view", ""); w.Code != 200 || strings.Contains(w.Body.String(), "voter") {
		t.Errorf("GET /v1/cluster/view: %d %s; want 200 without voter", w.Code, w.Body)
	}
}

// A view query that is not one is refused, whatever else it names; a
// wait with nothing to wait for is answered at once. Was: a bad wait was
// ignored when neither after nor rules_after came with it.
func TestViewQueryErrors(t *testing.T) {
	e := newEnv(t, "")
	for _, q := range []string{"after=x", "rules_after=-1", "after=1&wait=banana", "wait=banana", "wait=-1s"} {
		got := apiError(t, e.do("GET", "/v1/cluster/view?"+q, ""), 400, api.CodeBadRequest)
		if !strings.Contains(got.Message, "wait") {
			t.Errorf("?%s: message %q, want it to say what wait must be", q, got.Message)
		}
	}
	if w := e.do("GET", "/v1/cluster/view?wait=5s", ""); w.Code != 200 {
		t.Errorf("?wait=5s alone: %d %s, want 200 at once", w.Code, w.Body)
	}
}

// A join's answer carries the epoch from which the cluster lists the
// member (the node side's answer); without one (0) the answer is the
// bare {"status":"ok"} that members answered before the field.
func TestJoinAnswersItsEpoch(t *testing.T) {
	for _, tt := range []struct {
		epoch uint64
		want  string
	}{
		{42, `{"status":"ok","epoch":42}`},
		{0, `{"status":"ok"}`},
	} {
		e := newEnv(t, "")
		e.a.joinEpoch = tt.epoch
		w := e.do("POST", "/v1/cluster/join", `{"id":"n2","http":"h:1","raft":"h:2","peer":"h:3"}`)
		var got api.JoinResponse
		decodeOK(t, w, &got)
		if body := strings.TrimSpace(w.Body.String()); body != tt.want || got != (api.JoinResponse{Status: "ok", Epoch: tt.epoch}) {
			t.Errorf("join answered with epoch %d: %s, want %s", tt.epoch, body, tt.want)
		}
	}
}

func TestJoin(t *testing.T) {
	e := newEnv(t, "")
	var ok api.JoinResponse
	decodeOK(t, e.do("POST", "/v1/cluster/join", `{"id":"n2","http":"h:1","raft":"h:2","peer":"h:3"}`), &ok)
	if want := (api.JoinRequest{ID: "n2", HTTP: "h:1", Raft: "h:2", Peer: "h:3"}); len(e.a.joins) != 1 || e.a.joins[0] != want {
		t.Errorf("joins = %+v", e.a.joins)
	}
	decodeOK(t, e.do("POST", "/v1/cluster/join", `{"id":"n2","http":"h:1","raft":"h:2","peer":"h:3","incarnation":"x","listed":9,"listed_term":2}`), &ok)
	if want := (api.JoinRequest{ID: "n2", HTTP: "h:1", Raft: "h:2", Peer: "h:3", Incarnation: "x", Listed: 9, ListedTerm: 2}); len(e.a.joins) != 2 || e.a.joins[1] != want {
		t.Errorf("joins = %+v", e.a.joins)
	}
	tests := []struct {
		body    string
		joinErr error
		status  int
		code    string
		msg     string
	}{
		{`{"http":"h:1","raft":"h:2","peer":"h:3"}`, nil, 400, api.CodeBadRequest, "id is empty"},
		{`{"id":"n","raft":"h:2","peer":"h:3"}`, nil, 400, api.CodeBadRequest, "http is empty"},
		{`{"id":"n","http":"h:1","peer":"h:3"}`, nil, 400, api.CodeBadRequest, "raft is empty"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":""}`, nil, 400, api.CodeBadRequest, "peer is empty"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3","x":1}`, nil, 400, api.CodeBadRequest, `unknown field "x"`},
		{`{"ID":"n","http":"h:1","raft":"h:2","peer":"h:3"}`, nil, 400, api.CodeBadRequest, `unknown field "ID": field names are matched exactly (want "id")`},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3","id":"n2"}`, nil, 400, api.CodeBadRequest, `repeated field "id"`},
		{`{"id":5}`, nil, 400, api.CodeBadRequest, "id: must be a string, got number"},
		{`{"id":"n"`, nil, 400, api.CodeBadRequest, "malformed JSON"},
		{``, nil, 400, api.CodeBadRequest, "empty body"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3"}`, fmt.Errorf("%w: id n taken by another address", api.ErrBadRequest), 400, api.CodeBadRequest, "taken"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3"}`, fmt.Errorf("%w: no leader", api.ErrUnavailable), 503, api.CodeUnavailable, "no leader"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3","listed":9,"listed_term":2}`, fmt.Errorf("%w: member n left the cluster", api.ErrLeft), 409, api.CodeLeft, "left the cluster"},
		{`{"id":"n","http":"h:1","raft":"h:2","peer":"h:3"}` + strings.Repeat(" ", api.MaxBodySize), nil, 413, api.CodeTooLarge, "over"},
	}
	for _, tt := range tests {
		e := newEnv(t, "")
		e.a.joinErr = tt.joinErr
		got := apiError(t, e.do("POST", "/v1/cluster/join", tt.body), tt.status, tt.code)
		if !strings.Contains(got.Message, tt.msg) {
			t.Errorf("%s: message %q, want it to contain %q", tt.body, got.Message, tt.msg)
		}
	}
}

func TestLeave(t *testing.T) {
	e := newEnv(t, "")
	var ok statusBody
	decodeOK(t, e.do("POST", "/v1/cluster/leave", `{"id":"n2"}`), &ok)
	decodeOK(t, e.do("POST", "/v1/cluster/leave", `{}`), &ok) // this node
	if !reflect.DeepEqual(e.a.leaves, []string{"n2", ""}) {
		t.Errorf("leaves = %q", e.a.leaves)
	}
	e.a.leaveErr = fmt.Errorf("node: %w: member n9", api.ErrNotFound)
	got := apiError(t, e.do("POST", "/v1/cluster/leave", `{"id":"n9"}`), 404, api.CodeNotFound)
	if !strings.Contains(got.Message, "n9") {
		t.Errorf("message %q", got.Message)
	}
	e.a.leaveErr = fmt.Errorf("node: %w: no leader", api.ErrUnavailable)
	apiError(t, e.do("POST", "/v1/cluster/leave", `{"id":"n9"}`), 503, api.CodeUnavailable)
	apiError(t, e.do("POST", "/v1/cluster/leave", `{"id":"n9"} x`), 400, api.CodeBadRequest)
}

func TestSetState(t *testing.T) {
	e := newEnv(t, "")
	var ok statusBody
	decodeOK(t, e.do("POST", "/v1/cluster/state", `{"id":"n2","state":"down"}`), &ok)
	decodeOK(t, e.do("POST", "/v1/cluster/state", `{"id":"n2","state":"active"}`), &ok)
	if !reflect.DeepEqual(e.a.states, []string{"n2=down", "n2=active"}) {
		t.Errorf("states = %q", e.a.states)
	}
	for _, body := range []string{`{"id":"n2","state":"dead"}`, `{"state":"down"}`, `{"id":"n2"}`, `{"id":"n2","state":"down","x":1}`} {
		apiError(t, e.do("POST", "/v1/cluster/state", body), 400, api.CodeBadRequest)
	}
	if len(e.a.states) != 2 {
		t.Errorf("invalid requests reached the node: %q", e.a.states)
	}
}

func TestHealthAndReady(t *testing.T) {
	e := newEnv(t, "")
	var s statusBody
	decodeOK(t, e.do("GET", "/healthz", ""), &s)
	if s.Status != "ok" {
		t.Errorf("healthz = %+v", s)
	}
	decodeOK(t, e.do("GET", "/readyz", ""), &s)
	if s.Status != "ready" {
		t.Errorf("readyz = %+v", s)
	}
	e.a.ready = fmt.Errorf("%w: no leader yet", api.ErrUnavailable)
	got := apiError(t, e.do("GET", "/readyz", ""), 503, api.CodeUnavailable)
	if got.Message != "no leader yet" { // the code says unavailable
		t.Errorf("reason = %q", got.Message)
	}
	decodeOK(t, e.do("GET", "/healthz", ""), &s) // up even when not ready
	if w := e.do("HEAD", "/healthz", ""); w.Code != 200 {
		t.Errorf("HEAD /healthz = %d", w.Code)
	}
}

func TestMethodNotAllowed(t *testing.T) {
	tests := []struct {
		path    string
		allow   string
		methods []string
	}{
		{"/v1/check", "POST", []string{"GET", "PUT", "DELETE", "HEAD", "OPTIONS"}},
		{"/v1/rules", "GET, HEAD, PUT", []string{"POST", "DELETE", "PATCH"}},
		{"/v1/cluster", "GET, HEAD", []string{"POST", "PUT", "DELETE"}},
		{"/v1/cluster/join", "POST", []string{"GET", "PUT", "DELETE"}},
		{"/v1/cluster/leave", "POST", []string{"GET", "PUT", "DELETE"}},
		{"/healthz", "GET, HEAD", []string{"POST", "PUT"}},
		{"/readyz", "GET, HEAD", []string{"POST", "DELETE"}},
		{"/metrics", "GET, HEAD", []string{"POST", "PUT"}},
	}
	for _, tt := range tests {
		for _, m := range tt.methods {
			// With a token configured and none sent: 405 comes before 401.
			e := newEnv(t, "s3cret")
			w := e.do(m, tt.path, `{}`)
			if got := w.Header().Get("Allow"); got != tt.allow {
				t.Errorf("%s %s: Allow = %q, want %q", m, tt.path, got, tt.allow)
			}
			if m == "HEAD" {
				if w.Code != 405 {
					t.Errorf("HEAD %s = %d", tt.path, w.Code)
				}
				continue
			}
			apiError(t, w, 405, api.CodeMethod)
		}
	}
}

func TestUnknownPath(t *testing.T) {
	e := newEnv(t, "")
	for _, p := range []string{"/", "/v1", "/v1/check/", "/v1/checks", "/V1/check"} {
		apiError(t, e.do("GET", p, ""), 404, api.CodeNotFound)
	}
}

func TestPanicIsA500(t *testing.T) {
	e := newEnv(t, "")
	e.a.panicIn = "rules"
	got := apiError(t, e.do("GET", "/v1/rules", ""), 500, api.CodeInternal)
	if strings.Contains(got.Message, "boom") {
		t.Errorf("500 leaks the panic: %q", got.Message)
	}
	logs := e.logs.String()
	for _, want := range []string{"level=ERROR", "panic", "fakeAdmin: boom", "goroutine", "httpapi.(*handler).serveRules"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	// The checker panicking too, on the hot path.
	e.c.decide = func(router.Request) router.Result { panic("checker boom") }
	apiError(t, e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`), 500, api.CodeInternal)
	// And the handler goes on answering.
	e.c.decide = nil
	if w := e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`); w.Code != 200 {
		t.Errorf("after a panic: %d %s", w.Code, w.Body)
	}
	if !strings.Contains(scrape(t, e), `ringlimit_http_requests_total{code="500",endpoint="/v1/rules",method="GET"} 1`) {
		t.Errorf("the 500 was not counted")
	}
}

// A panic over a real connection still answers (no dropped connection).
func TestPanicOverTheWire(t *testing.T) {
	e := newEnv(t, "")
	e.a.panicIn = "rules"
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/v1/rules")
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func scrape(t *testing.T, e *env) string {
	t.Helper()
	w := e.do("GET", "/metrics", "")
	if w.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", w.Code, w.Body)
	}
	return w.Body.String()
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, "")
	e.h = New(Config{Registry: e.reg, Now: fixedClock(3 * time.Millisecond)}, e.c, e.a)
	e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`)
	e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`)
	e.do("POST", "/v1/check", `{"rule":"nope","key":"k"}`)
	e.do("GET", "/v1/check", ``)
	e.do("GET", "/nowhere", ``)
	e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`, "X", "y")
	// GET and PUT of one endpoint are told apart; a method of the
	// caller's own is counted as other, so it makes no series.
	e.do("GET", "/v1/rules", ``)
	e.do("PUT", "/v1/rules", `rules: []`, "Content-Type", "application/yaml")
	e.do("BREW", "/v1/rules", ``)
	body := scrape(t, e)
	for _, want := range []string{
		`ringlimit_http_requests_total{code="200",endpoint="/v1/rules",method="GET"} 1`,
		`ringlimit_http_requests_total{code="200",endpoint="/v1/rules",method="PUT"} 1`,
		`ringlimit_http_requests_total{code="405",endpoint="/v1/rules",method="other"} 1`,
		`ringlimit_http_requests_total{code="200",endpoint="/v1/check",method="POST"} 3`,
		`ringlimit_http_requests_total{code="404",endpoint="/v1/check",method="POST"} 1`,
		`ringlimit_http_requests_total{code="405",endpoint="/v1/check",method="GET"} 1`,
		`ringlimit_http_requests_total{code="404",endpoint="other",method="GET"} 1`,
		`ringlimit_http_request_duration_seconds_bucket{endpoint="/v1/check",le="0.0025"} 0`,
		`ringlimit_http_request_duration_seconds_bucket{endpoint="/v1/check",le="0.005"} 5`,
		`ringlimit_http_request_duration_seconds_count{endpoint="/v1/check"} 5`,
		`# TYPE ringlimit_http_request_duration_seconds histogram`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics serves the global registry")
	}
	// A second handler on the same registry shares the series.
	h2 := New(Config{Registry: e.reg}, e.c, e.a)
	h2.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/healthz", nil))
	if !strings.Contains(scrape(t, e), `ringlimit_http_requests_total{code="200",endpoint="/healthz",method="GET"} 1`) {
		t.Errorf("second handler's request not counted")
	}
}

func TestNilRegistry(t *testing.T) {
	h := New(Config{}, newFakeChecker(), &fakeAdmin{}) // a registry of its own
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "ringlimit_http_requests_total") {
		t.Errorf("/metrics = %d %s", w.Code, w.Body)
	}
}

func TestNewServer(t *testing.T) {
	h := http.NotFoundHandler()
	s := NewServer(h)
	if s.Handler == nil || s.api != nil || s.fs.ReadTimeout != 5*time.Second || s.fs.WriteTimeout != 10*time.Second ||
		s.fs.IdleTimeout != 120*time.Second || s.fs.ReadBufferSize != 16<<10 || s.fs.MaxRequestBodySize != api.MaxBodySize {
		t.Errorf("server = %+v", s.fs)
	}
	if s := NewServer(New(Config{}, newFakeChecker(), &fakeAdmin{})); s.api == nil {
		t.Error("New's handler: the check path is not served natively")
	}
}

// A join forwarded by another node reaches the node side marked as such,
// so it is not forwarded again.
func TestForwardedHeaderMarksContext(t *testing.T) {
	e := newEnv(t, "")
	body := `{"id":"n2","http":"h:1","raft":"h:2","peer":"h:3"}`
	e.do("POST", "/v1/cluster/join", body)
	req := httptest.NewRequest("POST", "/v1/cluster/join", strings.NewReader(body))
	req.RemoteAddr = "127.0.0.1:1234"
	req.Host = "localhost:8080"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.HeaderForwarded, "1")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != 200 || e.a.fwdJoins != 1 || len(e.a.joins) != 2 {
		t.Fatalf("status %d, %d of %d joins marked forwarded; want 200 and 1 of 2", rec.Code, e.a.fwdJoins, len(e.a.joins))
	}
}

// An answer's message does not repeat its code: an error that wraps one
// of api's sentinels loses the sentinel's "unavailable: " (or the like)
// at its head, and only there; other errors keep their text.
func TestReasonDropsTheSentinelPrefix(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: no leader", api.ErrUnavailable), "no leader"},
		{fmt.Errorf("%w: leader at x: %w", api.ErrUnavailable, fmt.Errorf("%w: raft did not answer", api.ErrUnavailable)), "leader at x: unavailable: raft did not answer"},
		{fmt.Errorf("%w: no member %q", api.ErrNotFound, "n9"), `no member "n9"`},
		{fmt.Errorf("%w: id taken", api.ErrConflict), "id taken"},
		{fmt.Errorf("%w: member n left", api.ErrLeft), "member n left"},
		{fmt.Errorf("%w: bad", api.ErrBadRequest), "bad"},
		{errors.New("unavailable: looks like one, is not"), "unavailable: looks like one, is not"},
		{fmt.Errorf("adding n9: %w", api.ErrUnavailable), "adding n9: unavailable"},
	} {
		if got := reason(c.err); got != c.want {
			t.Errorf("reason(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}

// The view token opens GET /v1/cluster/view alone; the admin token opens
// it too. Every other admin endpoint refuses the view token, and with
// only a view token configured they stay loopback-only.
func TestViewToken(t *testing.T) {
	tests := []struct {
		name        string
		admin, view string // configured
		hdr         []string
		viewStatus  int // GET /v1/cluster/view
		adminStatus int // every other admin endpoint
	}{
		{"both: view token", "adm", "vw", []string{"Authorization", "Bearer vw", "RemoteAddr", "203.0.113.9:1"}, 200, 401},
		{"both: admin token", "adm", "vw", []string{"Authorization", "Bearer adm", "RemoteAddr", "203.0.113.9:1"}, 200, 200},
		{"both: wrong", "adm", "vw", []string{"Authorization", "Bearer vww"}, 401, 401},
		{"both: none", "adm", "vw", nil, 401, 401},
		{"view only: view token from afar", "", "vw", []string{"Authorization", "Bearer vw", "RemoteAddr", "203.0.113.9:1"}, 200, 403},
		{"view only: loopback without it", "", "vw", nil, 401, 200},
		// An empty admin token's hash must not match an empty bearer.
		{"view only: empty bearer", "", "vw", []string{"Authorization", "Bearer "}, 401, 200},
	}
	for _, tt := range tests {
		for _, c := range adminCalls {
			t.Run(tt.name+" "+c.path, func(t *testing.T) {
				e := &env{c: newFakeChecker(), a: &fakeAdmin{}, reg: prometheus.NewRegistry()}
				e.h = New(Config{AdminToken: tt.admin, ViewToken: tt.view, Registry: e.reg}, e.c, e.a)
				want := tt.adminStatus
				if c.path == "/v1/cluster/view" {
					want = tt.viewStatus
				}
				if w := e.do(c.method, c.path, c.body, tt.hdr...); w.Code != want {
					t.Fatalf("status %d, want %d: %s", w.Code, want, w.Body)
				}
			})
		}
	}
}

// A view of the most rules a cluster takes (MaxRules written), which
// lists default too, builds a router's view: it was refused as a rule
// over the cap, so routers, the gateway in the routing tier and the Go
// client's ring could not follow such a cluster at all.
func TestViewOfTheMostRulesBuildsARouterView(t *testing.T) {
	written := make([]limiter.Rule, rules.MaxRules)
	for i := range written {
		written[i] = limiter.Rule{Name: fmt.Sprintf("tenant-%05d", i), Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
	}
	r, err := ring.New(ring.Config{Partitions: 8, ReplicationFactor: 4, Load: 1.25}, 1, []ring.Member{{ID: "a", Peer: "a:1"}})
	if err != nil {
		t.Fatal(err)
	}
	rv, err := router.ViewFromAPI(ViewOf(view.New(r, 9, rules.Effective(written), 7)))
	if err != nil {
		t.Fatalf("a view of %d written rules: %v", rules.MaxRules, err)
	}
	if len(rv.List) != rules.MaxRules+1 {
		t.Fatalf("router view holds %d rules, want %d and default", len(rv.List), rules.MaxRules)
	}
}
