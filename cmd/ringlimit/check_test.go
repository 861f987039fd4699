package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// fakeAPI is an httptest server faking a node's HTTP API for the CLI
// tests: /v1/check (single and batch), /v1/cluster and /v1/cluster/leave.
type fakeAPI struct {
	srv  *httptest.Server
	addr string // host:port

	// decide answers the n-th check the server sees (from 0).
	decide func(n int64, c api.CheckRequest) api.Decision
	// failEvery > 0 fails every failEvery-th check request (the 1st,
	// failEvery+1-th, …) with 503 unavailable.
	failEvery int64
	cluster   api.Cluster
	token     string // admin token required by leave, if not empty
	onRequest func() // called at the start of every check request
	// leaveAnswers, when not empty, answers the leave requests in turn
	// with these statuses (503 unavailable, 404 not found, 200) before
	// the usual 200s.
	leaveAnswers []int
	// leaveGone, when set, makes leave requests after that many answered
	// go without an answer (the connection drops), as from a member that
	// left and stopped.
	leaveGone int
	// notReady, when set, answers GET /readyz 503 with it.
	notReady string

	checks             atomic.Int64 // checks decided
	requests           atomic.Int64 // check requests received
	singles, batches   atomic.Int64 // check requests by form
	mu                 sync.Mutex
	leaveIDs           []string // guarded by mu
	clusterGets, calls atomic.Int64
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{decide: func(_ int64, c api.CheckRequest) api.Decision {
		if strings.HasPrefix(c.Key, "deny") {
			return api.Decision{Limit: 200, RetryAfterMs: 100, ResetAfterMs: 1000}
		}
		return api.Decision{Allowed: true, Limit: 200, Remaining: 199, ResetAfterMs: 10}
	}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	f.addr = strings.TrimPrefix(f.srv.URL, "http://")
	f.cluster = api.Cluster{Leader: "n1", Epoch: 42, Partitions: 1024, RulesVersion: 7, Members: []api.Member{
		{ID: "n1", State: "active", HTTP: "10.0.0.1:8080", Raft: "10.0.0.1:8081", Peer: "10.0.0.1:8082", Partitions: 512, Voter: new(true)},
		{ID: "n2", State: "draining", HTTP: f.addr, Raft: "127.0.0.1:9", Peer: "127.0.0.1:10", Partitions: 512, Voter: new(false)},
	}}
	return f
}

// left returns the ids of the leave requests received so far.
func (f *fakeAPI) left() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.leaveIDs...)
}

func (f *fakeAPI) writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Code: code, Message: msg})
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	switch r.Method + " " + r.URL.Path {
	case "POST /v1/check":
		f.serveCheck(w, r)
	case "GET /readyz":
		if f.notReady != "" {
			f.writeErr(w, 503, api.CodeUnavailable, f.notReady)
			return
		}
		w.Write([]byte("ready\n"))
	case "GET /v1/cluster":
		f.clusterGets.Add(1)
		json.NewEncoder(w).Encode(f.cluster)
	case "POST /v1/cluster/leave":
		if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
			f.writeErr(w, 401, api.CodeUnauthorized, "wrong token")
			return
		}
		var req api.LeaveRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		if f.leaveGone > 0 && len(f.leaveIDs) >= f.leaveGone {
			f.mu.Unlock()
			panic(http.ErrAbortHandler)
		}
		f.leaveIDs = append(f.leaveIDs, req.ID)
		status := http.StatusOK
		if len(f.leaveAnswers) > 0 {
			status, f.leaveAnswers = f.leaveAnswers[0], f.leaveAnswers[1:]
		}
		f.mu.Unlock()
		switch status {
		case http.StatusServiceUnavailable:
			f.writeErr(w, status, api.CodeUnavailable, "unavailable: no leader")
		case http.StatusNotFound:
			f.writeErr(w, status, api.CodeNotFound, `not found: no member "`+req.ID+`"`)
		default:
			w.WriteHeader(status)
		}
	default:
		f.writeErr(w, 404, api.CodeNotFound, r.URL.Path)
	}
}

func (f *fakeAPI) serveCheck(w http.ResponseWriter, r *http.Request) {
	if f.onRequest != nil {
		f.onRequest()
	}
	n := f.requests.Add(1)
	var body struct {
		api.CheckRequest
		Checks []api.CheckRequest `json:"checks"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.writeErr(w, 400, api.CodeBadRequest, err.Error())
		return
	}
	if f.failEvery > 0 && (n-1)%f.failEvery == 0 {
		f.writeErr(w, 503, api.CodeUnavailable, "no leader")
		return
	}
	checks, batch := body.Checks, body.Checks != nil
	if !batch {
		checks = []api.CheckRequest{body.CheckRequest}
	}
	for i, c := range checks {
		if c.Rule != "default" && c.Rule != "public-api" {
			at := ""
			if batch {
				at = "checks[" + itoaTest(i) + "]: "
			}
			f.writeErr(w, 404, api.CodeUnknownRule, at+"unknown rule "+c.Rule)
			return
		}
	}
	ds := make([]api.Decision, len(checks))
	for i, c := range checks {
		ds[i] = f.decide(f.checks.Add(1)-1, c)
	}
	if batch {
		f.batches.Add(1)
		json.NewEncoder(w).Encode(api.BatchResponse{Results: ds})
	} else {
		f.singles.Add(1)
		json.NewEncoder(w).Encode(ds[0])
	}
}

func itoaTest(i int) string { b, _ := json.Marshal(i); return string(b) }

// envOf is a getenv over a map.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// runCmd runs one subcommand function and returns its exit code, stdout
// and stderr.
func runCmd(ctx context.Context, fn func(context.Context, []string, func(string) string, io.Writer, io.Writer) int,
	env map[string]string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := fn(ctx, args, envOf(env), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheckCommand(t *testing.T) {
	f := newFakeAPI(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		out, err string // substrings; out "" = nothing on stdout
	}{
		{"allowed", nil, []string{"--addr", f.addr, "--rule", "default", "--key", "k"}, 0,
			"allowed  remaining=199 limit=200 reset_after=10ms\n", ""},
		{"denied", nil, []string{"--addr", f.srv.URL + "/", "--rule", "default", "--key", "deny-1", "--cost", "3"}, 1,
			"denied   retry_after=100ms remaining=0 limit=200 reset_after=1s\n", ""},
		{"json allowed", nil, []string{"--addr", f.addr, "--rule", "default", "--key", "k", "--json"}, 0,
			`{"allowed":true,"limit":200,"remaining":199,"reset_after_ms":10,"retry_after_ms":0,"delay_ms":0,"degraded":false}` + "\n", ""},
		{"json denied", nil, []string{"--addr", f.addr, "--rule", "default", "--key", "deny", "--json"}, 1,
			`{"allowed":false,"limit":200,"remaining":0,"reset_after_ms":1000,"retry_after_ms":100,"delay_ms":0,"degraded":false}` + "\n", ""},
		{"env addr", map[string]string{"RINGLIMIT_ADDR": f.addr}, []string{"--rule", "default", "--key", "k"}, 0, "allowed", ""},
		{"env for every flag", map[string]string{"RINGLIMIT_ADDR": f.addr, "RINGLIMIT_RULE": "default", "RINGLIMIT_KEY": "deny", "RINGLIMIT_JSON": "true"},
			nil, 1, `"allowed":false`, ""},
		{"flag wins over env", map[string]string{"RINGLIMIT_ADDR": "127.0.0.1:1"}, []string{"--addr", f.addr, "--rule", "default", "--key", "k"}, 0, "allowed", ""},
		{"unknown rule", nil, []string{"--addr", f.addr, "--rule", "nope", "--key", "k"}, 2, "", "unknown_rule (404)"},
		{"missing key", nil, []string{"--addr", f.addr, "--rule", "default"}, 2, "", "--rule and --key are required"},
		{"missing rule", nil, []string{"--addr", f.addr, "--key", "k"}, 2, "", "--rule and --key are required"},
		{"negative cost", nil, []string{"--addr", f.addr, "--rule", "default", "--key", "k", "--cost", "-1"}, 2, "", "--cost -1"},
		{"bad flag", nil, []string{"--bogus"}, 2, "", "flag provided but not defined"},
		{"bad env", map[string]string{"RINGLIMIT_COST": "many"}, []string{"--rule", "default", "--key", "k"}, 2, "", "RINGLIMIT_COST"},
		{"stray argument", nil, []string{"--rule", "default", "--key", "k", "extra"}, 2, "", `unexpected argument "extra"`},
		{"help", nil, []string{"-h"}, 0, "", "-rule"},
		{"unreachable", nil, []string{"--addr", "127.0.0.1:1", "--rule", "default", "--key", "k"}, 2, "", "ringlimit check: client: POST http://127.0.0.1:1/v1/check: dial tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runCmd(ctx, runCheck, tc.env, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, errs)
			}
			if tc.out == "" && out != "" || !strings.Contains(out, tc.out) {
				t.Errorf("stdout %q, want %q", out, tc.out)
			}
			if strings.HasSuffix(tc.out, "\n") && out != tc.out {
				t.Errorf("stdout %q, want exactly %q", out, tc.out)
			}
			if !strings.Contains(errs, tc.err) || tc.err == "" && errs != "" {
				t.Errorf("stderr %q, want %q", errs, tc.err)
			}
		})
	}
}

func TestFormatDecision(t *testing.T) {
	for _, tc := range []struct {
		d    api.Decision
		want string
	}{
		{api.Decision{Allowed: true, Limit: 200, Remaining: 199, ResetAfterMs: 10},
			"allowed  remaining=199 limit=200 reset_after=10ms"},
		{api.Decision{Limit: 5, RetryAfterMs: 12000, ResetAfterMs: 60000, Degraded: true},
			"denied   retry_after=12s remaining=0 limit=5 reset_after=1m0s degraded"},
		{api.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfterMs: 1500, DelayMs: 250},
			"allowed  remaining=0 limit=10 reset_after=1.5s delay=250ms"},
	} {
		if got := formatDecision(tc.d); got != tc.want {
			t.Errorf("formatDecision(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
