package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// These tests build the real binary and drive `ringlimit serve`
// processes over HTTP on free loopback ports, as a user would.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ringlimit-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "ringlimit")
		out, err := exec.Command("go", "build", "-race", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proc is one running `ringlimit serve`.
type proc struct {
	id, http, dir string
	cmd           *exec.Cmd
	log           *logbuf.Buffer
	done          chan struct{}
	exitErr       error
	quitAt        int // length of log when await sent SIGQUIT; 0 if it did not
}

func startServe(t *testing.T, id, dir string, extra ...string) *proc {
	t.Helper()
	for attempt := 0; ; attempt++ {
		p := launchServe(t, id, dir, extra...)
		lost := false // a free port was taken by another test's process meanwhile
		waitFor(t, id+" ready", func() bool {
			select {
			case <-p.done:
				lost = strings.Contains(p.log.String(), "address already in use")
				return lost
			default:
			}
			return get(p.http, "/readyz", nil) == 200
		})
		if !lost {
			return p
		}
		if attempt == 2 {
			t.Fatalf("%s: ports kept being taken:\n%s", id, lastLines(p.log.String(), 5))
		}
	}
}

// launchServe starts `ringlimit serve` without waiting for it.
func launchServe(t *testing.T, id, dir string, extra ...string) *proc {
	t.Helper()
	p := &proc{id: id, http: freePort(t), dir: dir, done: make(chan struct{})}
	args := []string{"serve"}
	if id != "" { // "": no --id, as the image's own command
		args = append(args, "--id", id)
	}
	args = append(append(args, "--http", p.http, "--raft", freePort(t), "--peer", freePort(t), "--data-dir", dir, "--log-level", "debug"), extra...)
	p.cmd = exec.Command(binary(t), args...)
	p.log = &logbuf.Buffer{}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, lastLines(p.logText(), 40))
		}
	})
	return p
}

// logText is the process's log up to the goroutine dump, if await took
// one (the failure that asked for it shows the dump).
func (p *proc) logText() string {
	s := p.log.String()
	if p.quitAt > 0 {
		s = s[:p.quitAt]
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGINT and waits for the process to exit.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	if dump, ok := p.await(20 * time.Second); !ok {
		t.Errorf("%s did not stop within 20s of SIGINT; its goroutines then:\n%s", p.id, dump)
	}
}

// await waits up to d for the process to exit and reports whether it
// did. If it did not, await sends it SIGQUIT, on which the Go runtime
// writes every goroutine's stack to stderr and exits, and returns what
// the process wrote from then on: that dump (the process is killed if
// it is still running 10s later).
func (p *proc) await(d time.Duration) (dump string, exited bool) {
	select {
	case <-p.done:
		return "", true
	case <-time.After(d):
	}
	p.quitAt = len(p.log.String())
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.log.String()[p.quitAt:], false
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var httpc = &http.Client{Timeout: 10 * time.Second}

func get(addr, path string, out any) int {
	resp, err := httpc.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

func send(t *testing.T, method, addr, path, contentType, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestServeSingleNode(t *testing.T) {
	dir := t.TempDir()
	p := startServe(t, "solo", dir, "--admin-token", "s3cret")
	auth := []string{"Authorization", "Bearer s3cret"}

	// Default rules: the built-in default.
	var rs api.Rules
	if code := get(p.http, "/v1/rules", &rs); code != 200 || len(rs.Rules) != 1 || rs.Rules[0].Name != "default" || rs.Rules[0].Burst != 200 {
		t.Fatalf("GET /v1/rules = %d %+v, want the built-in default", code, rs)
	}
	code, body := send(t, "PUT", p.http, "/v1/rules", "application/yaml",
		"rules:\n  - name: worked\n    algorithm: token_bucket\n    limit: 10\n    period: 1s\n    burst: 100\n", auth...)
	if code != 200 {
		t.Fatalf("PUT rules: %d %s", code, body)
	}

	// The worked example: 150 at once → exactly 100 admitted.
	var batch strings.Builder
	batch.WriteString(`{"checks":[`)
	for i := range 150 {
		if i > 0 {
			batch.WriteString(",")
		}
		batch.WriteString(`{"rule":"worked","key":"tenant-42"}`)
	}
	batch.WriteString("]}")
	code, body = send(t, "POST", p.http, "/v1/check", "application/json", batch.String())
	var br api.BatchResponse
	if err := json.Unmarshal(body, &br); code != 200 || err != nil {
		t.Fatalf("batch check: %d %s", code, body)
	}
	admitted, firstDenied := 0, -1
	for i, d := range br.Results {
		if d.Allowed {
			admitted++
		} else if firstDenied < 0 {
			firstDenied = i
		}
	}
	if admitted != 100 || firstDenied != 100 {
		t.Fatalf("150 at once: admitted %d, first denial at %d; want 100 and 100", admitted, firstDenied)
	}
	if d := br.Results[100]; d.RetryAfterMs != 100 || d.Limit != 100 || d.Remaining != 0 {
		t.Fatalf("first denial %+v, want retry_after_ms 100, limit 100, remaining 0", d)
	}

	// Each error of the contract.
	big := strings.Repeat("x", 1025)
	for _, tc := range []struct {
		method, path, ctype, body string
		hdr                       []string
		status                    int
		code                      string
	}{
		{"POST", "/v1/check", "application/json", `{"rule":`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"rule":"worked","key":""}`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"rule":"worked","key":"` + big + `"}`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"rule":"worked","key":"k","cost":-1}`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"rule":"worked","key":"k","cost":101}`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"checks":[` + strings.Repeat(`{"rule":"worked","key":"k"},`, 1000) + `{"rule":"worked","key":"k"}]}`, nil, 400, "bad_request"},
		{"POST", "/v1/check", "application/json", `{"rule":"nope","key":"k"}`, nil, 404, "unknown_rule"},
		{"POST", "/v1/check", "application/json", `{"checks":[{"rule":"worked","key":"a"},{"rule":"nope","key":"b"}]}`, nil, 404, "unknown_rule"},
		{"POST", "/v1/check", "application/json", `{"rule":"worked","key":"` + strings.Repeat("x", 2<<20) + `"}`, nil, 413, "body_too_large"},
		{"PUT", "/v1/rules", "application/yaml", "rules:\n  - name: bad\n    algorithm: token_bucket\n    limit: 0\n    period: 1s\n", auth, 400, "invalid_rules"},
		{"PUT", "/v1/rules", "application/yaml", "rules: []\n", nil, 401, "unauthorized"},
		{"PUT", "/v1/rules", "application/yaml", "rules: []\n", []string{"Authorization", "Bearer wrong"}, 401, "unauthorized"},
		{"POST", "/v1/cluster/leave", "application/json", `{"id":"nobody"}`, auth, 404, ""},
	} {
		code, body := send(t, tc.method, p.http, tc.path, tc.ctype, tc.body, tc.hdr...)
		var e api.Error
		_ = json.Unmarshal(body, &e)
		if code != tc.status || (tc.code != "" && e.Code != tc.code) || e.Message == "" {
			t.Errorf("%s %s %.60q: %d %s, want %d %s with a message", tc.method, tc.path, tc.body, code, lastLines(string(body), 1), tc.status, tc.code)
		}
	}
	// The batch with an unknown rule spent nothing: key "a" is untouched.
	code, body = send(t, "POST", p.http, "/v1/check", "application/json", `{"rule":"worked","key":"a","cost":0}`)
	if var1 := (api.Decision{}); code != 200 || json.Unmarshal(body, &var1) != nil || var1.Remaining != 100 {
		t.Errorf("after a refused batch, key a: %d %s, want remaining 100", code, body)
	}

	// The check CLI: exit 0 allowed, 1 denied, 2 error.
	for _, tc := range []struct {
		args []string
		exit int
	}{
		{[]string{"check", "--addr", p.http, "--rule", "worked", "--key", "cli"}, 0},
		{[]string{"check", "--addr", "http://" + p.http, "--rule", "worked", "--key", "tenant-42", "--cost", "100", "--json"}, 1},
		{[]string{"check", "--addr", p.http, "--rule", "nope", "--key", "cli"}, 2},
	} {
		err := exec.Command(binary(t), tc.args...).Run()
		exit := 0
		if ee, ok := err.(*exec.ExitError); ok {
			exit = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if exit != tc.exit {
			t.Errorf("ringlimit %s: exit %d, want %d", strings.Join(tc.args, " "), exit, tc.exit)
		}
	}

	// Restart with the same data dir: the PUT rules are still in force.
	p.stop(t)
	if p.exitErr != nil {
		t.Fatalf("SIGINT: %v, want a clean exit", p.exitErr)
	}
	// From the first moment it answers, the restarted node knows the
	// rule or says it is unavailable; it never forgets it (404).
	p2 := launchServe(t, "solo", dir)
	waitFor(t, "the restarted node decides", func() bool {
		resp, err := httpc.Post("http://"+p2.http+"/v1/check", "application/json", strings.NewReader(`{"rule":"worked","key":"again","cost":0}`))
		if err != nil {
			return false // not listening yet
		}
		resp.Body.Close()
		if resp.StatusCode != 200 && resp.StatusCode != 503 {
			t.Fatalf("check during restart: %d, want 503 until the log is replayed, then 200", resp.StatusCode)
		}
		return resp.StatusCode == 200
	})
	waitFor(t, "restarted node ready", func() bool { return get(p2.http, "/readyz", nil) == 200 })
	if code := get(p2.http, "/v1/rules", &rs); code != 200 || len(rs.Rules) != 2 || rs.Rules[1].Name != "worked" {
		t.Fatalf("after restart GET /v1/rules = %d %+v, want default and worked", code, rs)
	}
}

func TestServeRulesFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n")
	p := startServe(t, "f", filepath.Join(dir, "data"), "--rules", file)
	names := func() string {
		var rs api.Rules
		get(p.http, "/v1/rules", &rs)
		var n []string
		for _, r := range rs.Rules {
			n = append(n, fmt.Sprintf("%s/%d", r.Name, r.Limit))
		}
		return strings.Join(n, ",")
	}
	waitFor(t, "rules file applied", func() bool { return names() == "default/100,a/5" })
	write("rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 7\n    period: 1m\n")
	waitFor(t, "changed rules file applied", func() bool { return names() == "default/100,a/7" })
	write("rules:\n  - name: a\n    algorithm: fixed_window\n    limit: -1\n    period: 1m\n")
	waitFor(t, "invalid rules file logged", func() bool { return strings.Contains(p.log.String(), "rules file refused") })
	if got := names(); got != "default/100,a/7" {
		t.Fatalf("after an invalid file the rules are %s, want the previous ones", got)
	}
	// A serve started with an invalid file refuses to start.
	out, err := exec.Command(binary(t), "serve", "--data-dir", filepath.Join(dir, "other"), "--rules", file, "--http", freePort(t)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "limit") {
		t.Fatalf("serve with an invalid rules file: %v\n%s", err, out)
	}
}

// loadedBudgets are serve flags for tests that count exactly and want no
// degraded answer from -race processes on a loaded 2-core CI machine: an
// owner may take seconds to answer a forwarded check, not the default
// 250ms (which a burst of 300 checks once overran for every forward to
// one owner, dial included). It stays below the test client's 10s.
var loadedBudgets = []string{"--forward-timeout", "5s"}

func TestServeThreeProcesses(t *testing.T) {
	n1 := startServe(t, "n1", t.TempDir(), loadedBudgets...)
	n2 := startServe(t, "n2", t.TempDir(), append([]string{"--join", n1.http}, loadedBudgets...)...)
	n3 := startServe(t, "n3", t.TempDir(), append([]string{"--join", "http://" + n1.http}, loadedBudgets...)...)
	nodes := []*proc{n1, n2, n3}
	var views [3]api.Cluster
	waitFor(t, "the same /v1/cluster on every node, with 3 members", func() bool {
		for i, p := range nodes {
			views[i] = api.Cluster{}
			if get(p.http, "/v1/cluster", &views[i]) != 200 || len(views[i].Members) != 3 {
				return false
			}
			// silent_ms is the leader's alone (its failure detector's):
			// the rest of the answer is the same everywhere.
			for k := range views[i].Members {
				views[i].Members[k].SilentMS = nil
			}
			if !reflect.DeepEqual(views[i], views[0]) {
				return false
			}
		}
		return true
	})
	total := 0
	for _, m := range views[0].Members {
		if m.State != "active" || m.Partitions == 0 {
			t.Fatalf("member %+v: want active with partitions", m)
		}
		total += m.Partitions
	}
	if total != views[0].Partitions {
		t.Fatalf("members own %d partitions of %d", total, views[0].Partitions)
	}
	// Rules written on a follower reach everybody.
	code, body := send(t, "PUT", n3.http, "/v1/rules", "application/json",
		`{"rules":[{"name":"login","algorithm":"sliding_log","limit":50,"period":"1h","failure_mode":"closed"}]}`)
	if code != 200 {
		t.Fatalf("PUT on n3: %d %s", code, body)
	}
	for _, p := range nodes {
		waitFor(t, "rules on "+p.id, func() bool {
			var rs api.Rules
			return get(p.http, "/v1/rules", &rs) == 200 && len(rs.Rules) == 2
		})
	}
	var allowed, degraded atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := send(t, "POST", nodes[i%3].http, "/v1/check", "application/json", `{"rule":"login","key":"alice"}`)
			var d api.Decision
			if code != 200 || json.Unmarshal(body, &d) != nil {
				t.Errorf("check: %d %s", code, body)
				return
			}
			if d.Allowed {
				allowed.Add(1)
			}
			if d.Degraded {
				degraded.Add(1)
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 50 || degraded.Load() != 0 {
		t.Fatalf("3 processes admitted %d of 300 (degraded %d), want exactly 50", allowed.Load(), degraded.Load())
	}

	// ringlimit bench against the three nodes: it ends by itself and
	// reports what it sent.
	out, err := exec.Command(binary(t), "bench", "--addr", n1.http+","+n2.http+","+n3.http, "--rule", "login",
		"--keys", "20", "--concurrency", "4", "--batch", "10", "--duration", "1s", "--json").Output()
	var rep struct {
		Checks, Errors, Allowed, Denied, Degraded int64
	}
	if err != nil || json.Unmarshal(out, &rep) != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	if rep.Checks == 0 || rep.Errors != 0 || rep.Degraded != 0 || rep.Allowed+rep.Denied != rep.Checks || rep.Allowed > 20*50 {
		t.Fatalf("bench report %+v: want checks, no errors, allowed ≤ 20 keys × 50", rep)
	}

	// The same through the binary data plane, bench acting as a stateless
	// router: it reads the cluster view and hashes keys itself.
	out, err = exec.Command(binary(t), "bench", "--addr", n2.http, "--protocol", "peer", "--rule", "login",
		"--keys", "20", "--concurrency", "4", "--batch", "10", "--duration", "1s", "--json").Output()
	rep.Checks, rep.Allowed = 0, 0
	if err != nil || json.Unmarshal(out, &rep) != nil {
		t.Fatalf("bench --protocol peer: %v\n%s", err, out)
	}
	if rep.Checks == 0 || rep.Errors != 0 || rep.Allowed > 20*50 {
		t.Fatalf("bench --protocol peer report %+v: want checks, no errors, allowed ≤ 20 keys × 50", rep)
	}

	// ringlimit leave removes n3 for good; its process exits. Under load
	// Raft may be between leaders for a moment: leave is then answered
	// 503 (no leader) with nothing changed, and is asked again.
	waitFor(t, "ringlimit leave to be answered by a leader", func() bool {
		out, err = exec.Command(binary(t), "leave", "--addr", n1.http, "--id", "n3").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "unavailable (503)") {
			t.Fatalf("leave: %v\n%s", err, out)
		}
		if err != nil {
			t.Logf("leave: %s; asking again", bytes.TrimSpace(out))
		}
		return err == nil
	})
	if dump, ok := n3.await(20 * time.Second); !ok {
		t.Fatalf("n3 still running 20s after leave; its goroutines then:\n%s", dump)
	}
	waitFor(t, "n3 gone from the cluster", func() bool {
		var c api.Cluster
		return get(n2.http, "/v1/cluster", &c) == 200 && len(c.Members) == 2
	})
	if code, body := send(t, "POST", n2.http, "/v1/check", "application/json", `{"rule":"login","key":"bob"}`); code != 200 {
		t.Fatalf("check after leave: %d %s", code, body)
	}
}

// A second process started with the id of a live member is refused by
// the cluster (409 conflict) and exits 1 with a message, leaving the live
// member as it was.
func TestServeDuplicateIDExits(t *testing.T) {
	n1 := startServe(t, "n1", t.TempDir())
	n2 := startServe(t, "n2", t.TempDir(), "--join", n1.http)
	dup := launchServe(t, "n2", t.TempDir(), "--join", n1.http)
	if dump, ok := dup.await(30 * time.Second); !ok {
		t.Fatalf("the duplicate is still running after 30s; its goroutines then:\n%s", dump)
	}
	var ee *exec.ExitError
	if !errors.As(dup.exitErr, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("duplicate exited with %v, want exit status 1", dup.exitErr)
	}
	if !strings.Contains(dup.log.String(), "held by another live process") {
		t.Fatalf("duplicate's log does not say why:\n%s", lastLines(dup.log.String(), 10))
	}
	if strings.Contains(dup.log.String(), errShutdownHung.Error()) {
		t.Fatalf("the duplicate's stop hung; it exited on serve's bound:\n%s", lastLines(dup.log.String(), 10))
	}
	var c api.Cluster
	if get(n1.http, "/v1/cluster", &c) != 200 {
		t.Fatal("cluster unreadable")
	}
	for _, m := range c.Members {
		if m.ID == "n2" && (m.State != "active" || m.HTTP != n2.http) {
			t.Fatalf("the live n2 was touched: %+v", m)
		}
	}
}
