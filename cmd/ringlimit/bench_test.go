package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/loadgen"
	"github.com/ringlimit/ringlimit/limiter"
)

// alternate allows every other check the server sees and marks every
// fourth degraded, so that any whole run of 4k checks splits exactly.
func alternate(n int64, _ api.CheckRequest) api.Decision {
	return api.Decision{Allowed: n%2 == 0, Limit: 10, Degraded: n%4 == 0}
}

// benchJSON runs runBench with --json and decodes the report.
func benchJSON(t *testing.T, ctx context.Context, env map[string]string, args ...string) (int, benchReport, string) {
	t.Helper()
	code, out, errs := runCmd(ctx, runBench, env, append(args, "--json")...)
	var rep benchReport
	if out != "" {
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("bench --json printed %q: %v", out, err)
		}
	}
	return code, rep, errs
}

func TestBenchDuration(t *testing.T) {
	f := newFakeAPI(t)
	f.decide = alternate
	start := time.Now()
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--duration", "200ms", "--concurrency", "4")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if took < 200*time.Millisecond || took > 10*time.Second || rep.ElapsedSeconds < 0.2 {
		t.Errorf("bench --duration 200ms took %v (reported %.3fs)", took, rep.ElapsedSeconds)
	}
	if rep.Requests == 0 || rep.Errors != 0 {
		t.Errorf("requests %d, errors %d; want some and none (requests cut off at the end are no errors)", rep.Requests, rep.Errors)
	}
	// batch 1 = the single form; one decision per request.
	if rep.Checks != rep.Requests || f.batches.Load() != 0 {
		t.Errorf("checks %d for %d requests; %d batch requests sent", rep.Checks, rep.Requests, f.batches.Load())
	}
	if rep.Allowed+rep.Denied != rep.Checks {
		t.Errorf("allowed %d + denied %d != checks %d", rep.Allowed, rep.Denied, rep.Checks)
	}
	// The server alternates; only checks cut off at the end (at most one
	// per worker) can unbalance the split.
	if d := rep.Allowed - rep.Denied; d < -5 || d > 5 {
		t.Errorf("allowed %d, denied %d: not the server's alternation", rep.Allowed, rep.Denied)
	}
	if rep.RequestsPerSecond <= 0 || rep.LatencyMs.Max <= 0 || rep.LatencyMs.P50 > rep.LatencyMs.P99 || rep.LatencyMs.P99 > rep.LatencyMs.Max {
		t.Errorf("implausible rates/latency: %+v", rep)
	}
}

func TestBenchRequestsCap(t *testing.T) {
	f := newFakeAPI(t)
	f.decide = alternate
	code, rep, errs := benchJSON(t, context.Background(), nil,
		"--addr", f.addr, "--requests", "50", "--batch", "8", "--concurrency", "4", "--duration", "1m", "--dist", "zipf", "--keys", "10")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if rep.Requests != 50 || rep.Checks != 400 || rep.Errors != 0 {
		t.Errorf("requests %d checks %d errors %d, want 50 400 0", rep.Requests, rep.Checks, rep.Errors)
	}
	if f.requests.Load() != 50 || f.batches.Load() != 50 {
		t.Errorf("server saw %d requests (%d batches), want 50 batches", f.requests.Load(), f.batches.Load())
	}
	if rep.Allowed != 200 || rep.Denied != 200 || rep.Degraded != 100 {
		t.Errorf("allowed %d denied %d degraded %d, want 200 200 100", rep.Allowed, rep.Denied, rep.Degraded)
	}
	if rep.AllowedRatio != 0.5 || rep.DeniedRatio != 0.5 || rep.DegradedRatio != 0.25 {
		t.Errorf("ratios %v %v %v, want 0.5 0.5 0.25", rep.AllowedRatio, rep.DeniedRatio, rep.DegradedRatio)
	}
	if rep.ElapsedSeconds > 30 {
		t.Errorf("a 50-request run took %.1fs: the cap did not end it", rep.ElapsedSeconds)
	}
}

func TestBenchRoundRobin(t *testing.T) {
	a, b := newFakeAPI(t), newFakeAPI(t)
	env := map[string]string{"RINGLIMIT_ADDR": a.addr + ", " + b.srv.URL, "RINGLIMIT_REQUESTS": "40"}
	code, rep, errs := benchJSON(t, context.Background(), env, "--concurrency", "1")
	if code != 0 || rep.Requests != 40 {
		t.Fatalf("exit %d, %d requests; stderr: %s", code, rep.Requests, errs)
	}
	if na, nb := a.requests.Load(), b.requests.Load(); na != 20 || nb != 20 {
		t.Errorf("one worker over two targets sent %d and %d requests, want 20 and 20", na, nb)
	}
	if len(rep.Config.Targets) != 2 {
		t.Errorf("targets %q", rep.Config.Targets)
	}
}

func TestBenchErrorsAreCountedNotFatal(t *testing.T) {
	f := newFakeAPI(t)
	f.failEvery = 3 // requests 1, 4, 7, … fail
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--requests", "30", "--concurrency", "3")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if rep.Errors != 10 || rep.Requests != 20 || rep.Checks != 20 {
		t.Errorf("errors %d requests %d checks %d, want 10 20 20", rep.Errors, rep.Requests, rep.Checks)
	}
	if len(rep.ErrorKinds) != 1 || rep.ErrorKinds["unavailable (503): no leader"] != 10 {
		t.Errorf("error kinds %v", rep.ErrorKinds)
	}

	// The text form lists them too.
	f.requests.Store(0)
	code, out, _ := runCmd(context.Background(), runBench, nil, "--addr", f.addr, "--requests", "30", "--concurrency", "3")
	if code != 0 || !strings.Contains(out, "errors     10") || !strings.Contains(out, "10× unavailable (503): no leader") {
		t.Errorf("exit %d, text report:\n%s", code, out)
	}
}

func TestBenchAllFail(t *testing.T) {
	f := newFakeAPI(t)
	f.failEvery = 1
	code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", f.addr, "--requests", "12", "--concurrency", "2")
	if code != 2 || rep.Errors != 12 || rep.Requests != 0 || !strings.Contains(errs, "all 12 requests failed") {
		t.Errorf("exit %d, errors %d, requests %d, stderr %q", code, rep.Errors, rep.Requests, errs)
	}
	// Without a cap the run still ends at --duration.
	code, _, _ = benchJSON(t, context.Background(), nil, "--addr", "127.0.0.1:1", "--duration", "200ms")
	if code != 2 {
		t.Errorf("against a closed port: exit %d, want 2", code)
	}
}

// --protocol peer against a member that hangs gives up reading the view
// (exit 2, naming it) instead of holding the run for as long as the
// member hangs. Was: 10 min 33 s with --duration 3s, until SIGCONT.
func TestBenchPeerViewReadIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	old := viewReadTimeout
	viewReadTimeout = 200 * time.Millisecond
	defer func() { viewReadTimeout = old }()
	code, _, errs := runCmd(context.Background(), runBench, nil, "--addr", ln.Addr().String(), "--protocol", "peer", "--duration", "3s")
	if code != 2 || !strings.Contains(errs, "reading the cluster view") || !strings.Contains(errs, ln.Addr().String()) {
		t.Fatalf("exit %d, stderr %q; want 2 and the view read named", code, errs)
	}
}

func TestBenchContextCancel(t *testing.T) {
	f := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	f.onRequest = func() {
		if f.requests.Load() >= 10 {
			once.Do(cancel) // as SIGINT would
		}
	}
	start := time.Now()
	code, rep, errs := benchJSON(t, ctx, nil, "--addr", f.addr, "--duration", "10m", "--concurrency", "2")
	if code != 0 || rep.Requests < 9 || rep.Errors != 0 {
		t.Errorf("exit %d, requests %d, errors %d; stderr %s", code, rep.Requests, rep.Errors, errs)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("bench took %v to stop after cancel", took)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--dist", "pareto"},
		{"--batch", "0"},
		{"--batch", "1001"},
		{"--duration", "11m"},
		{"--duration", "0s"},
		{"--concurrency", "0"},
		{"--keys", "0"},
		{"--requests", "-1"},
		{"--cost", "-1"},
		{"--addr", " , "},
		{"--rule", ""},
		{"--nope"},
	} {
		code, out, errs := runCmd(context.Background(), runBench, nil, args...)
		if code != 2 || out != "" || errs == "" {
			t.Errorf("bench %q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// The text report names what was timed: HTTP requests, or calls of the
// router when --protocol peer sent frames instead.
func TestBenchTextNamesTheUnit(t *testing.T) {
	for _, tc := range []struct {
		target, rows, unit string
	}{
		{"http://127.0.0.1:8080", "requests", "(per HTTP request)"},
		{"peer:http://127.0.0.1:8080", "calls", "(per router call)"},
	} {
		r := newBenchReport(loadgen.Config{Rule: "r", Keys: 1, Concurrency: 1, Batch: 1}, "uniform", []string{tc.target}, loadgen.Result{})
		var b strings.Builder
		if err := r.writeText(&b); err != nil {
			t.Fatal(err)
		}
		if out := b.String(); !strings.Contains(out, "\n"+tc.rows+" ") || !strings.Contains(out, tc.unit) {
			t.Errorf("target %s: report\n%s\nwant a %q row and %q", tc.target, out, tc.rows, tc.unit)
		}
	}
}

// --protocol peer follows the cluster's view as a router does: a member
// that leaves mid-run stops being asked once the ring moves on. Was: the
// view was read once, and the member's share of the checks was answered
// by the failure mode (degraded) or failed to the end of the run (26%
// of a 10 s run with one of three members killed, in an audit).
func TestBenchPeerFollowsTheView(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	n1, n2 := twoMembersWith(t, limiter.Rule{Name: "wide", Algorithm: limiter.TokenBucket, Limit: 1_000_000, Period: time.Second})
	type result struct {
		code int
		rep  benchReport
		errs string
	}
	done := make(chan result, 1)
	go func() {
		code, rep, errs := benchJSON(t, context.Background(), nil, "--addr", n1.http+","+n2.http, "--protocol", "peer",
			"--rule", "wide", "--keys", "500", "--concurrency", "4", "--duration", "6s")
		done <- result{code, rep, errs}
	}()
	// n2 leaves once it has decided some of the run's checks.
	eventually(t, "n2 deciding the run's checks", func() bool {
		o := n2.s.Node.Owner()
		return o != nil && o.Decided() > 200
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n2.s.Shutdown(ctx); err != nil {
		t.Fatalf("n2's stop: %v", err)
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("bench exit %d: %s", r.code, r.errs)
	}
	// n2 owned about half the keys for most of the run: unfollowed, that
	// half failed or was degraded from its stop to the end.
	if bad := r.rep.Degraded + r.rep.Errors; bad*5 > r.rep.Checks {
		t.Fatalf("%d degraded and %d failed of %d checks after a member left mid-run; want under a fifth (the view followed)", r.rep.Degraded, r.rep.Errors, r.rep.Checks)
	}
	t.Logf("%d checks, %d degraded, %d errors", r.rep.Checks, r.rep.Degraded, r.rep.Errors)
}
