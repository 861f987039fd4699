package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "ringlimit-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binDir = d
	code := m.Run()
	if nodeStop != nil {
		nodeStop()
	}
	os.RemoveAll(d)
	os.Exit(code)
}

// binary builds ./cmd/ringlimit once per test run the way the image gets
// it: static (CGO_ENABLED=0) for linux on the host's architecture; or
// returns $RINGLIMIT_TEST_BINARY when set.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if b := os.Getenv("RINGLIMIT_TEST_BINARY"); b != "" {
			builtBin = b // a binary built elsewhere, e.g. from another branch
			return
		}
		builtBin = filepath.Join(binDir, "ringlimit")
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", builtBin, "./cmd/ringlimit")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/ringlimit: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// flagDefaults returns the flags `ringlimit <cmd> -h` lists, with their
// defaults ("" when none is printed), or ok=false when the binary has no
// such command.
func flagDefaults(t *testing.T, cmd string) (flags map[string]string, ok bool) {
	t.Helper()
	out, _ := exec.Command(binary(t), cmd, "-h").CombinedOutput()
	if !strings.Contains(string(out), "Usage of ringlimit "+cmd) {
		return nil, false
	}
	flags = map[string]string{}
	nameRe := regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)`)
	defRe := regexp.MustCompile(`\(default "?(.*?)"?\)$`)
	last := ""
	for _, line := range strings.Split(string(out), "\n") {
		if m := nameRe.FindStringSubmatch(line); m != nil {
			last = m[1]
			flags[last] = ""
		}
		if m := defRe.FindStringSubmatch(line); m != nil && last != "" {
			flags[last] = m[1]
		}
	}
	if len(flags) == 0 {
		t.Fatalf("ringlimit %s -h lists no flags:\n%s", cmd, out)
	}
	return flags, true
}

// testNode is a single-node cluster of the built binary on loopback ports
// the kernel picks.
type testNode struct {
	url     string
	metrics string // /metrics after one check per rule
}

var (
	nodeOnce sync.Once
	node     *testNode
	nodeErr  error
	nodeStop func()
)

// startNode starts (once per test run) `ringlimit serve` on 127.0.0.1:0
// ports, waits until it is ready, spends one check and scrapes /metrics.
func startNode(t *testing.T) *testNode {
	t.Helper()
	bin := binary(t)
	nodeOnce.Do(func() { node, nodeErr = runNode(bin) })
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	return node
}

func runNode(bin string) (*testNode, error) {
	dir, err := os.MkdirTemp(binDir, "node-")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", "--id", "deploy-test",
		"--http", "127.0.0.1:0", "--raft", "127.0.0.1:0", "--peer", "127.0.0.1:0", "--data-dir", dir)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	nodeStop = func() { cancel(); _ = cmd.Wait() }
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			var line struct{ Msg, HTTP string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ringlimit serving" && !sent {
				addr <- line.HTTP
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	var http string
	select {
	case a, ok := <-addr:
		if !ok {
			return nil, fmt.Errorf("ringlimit serve exited before serving")
		}
		http = a
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("ringlimit serve did not log its address within 60s")
	}
	n := &testNode{url: "http://" + http}
	if err := waitHTTP(n.url+"/readyz", 60*time.Second); err != nil {
		return nil, err
	}
	// One check so that the labelled families (decisions per rule) exist.
	if _, err := post(n.url+"/v1/check", `{"rule":"default","key":"deploy-test"}`); err != nil {
		return nil, err
	}
	body, err := get(n.url + "/metrics")
	if err != nil {
		return nil, err
	}
	n.metrics = body
	return n, nil
}

func waitHTTP(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s: not 200 within %v: %v", url, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func get(url string) (string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

func post(url, body string) (string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("POST %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

// scrapeFollowers starts a `ringlimit router` and a `ringlimit gateway
// --cluster` in front of the test node, sends one request through the
// gateway, and returns both /metrics pages.
func scrapeFollowers(t *testing.T, n *testNode) []string {
	t.Helper()
	bin := binary(t)
	ports := loopbackPorts(t, 3)
	member := strings.TrimPrefix(n.url, "http://")
	router := startProcess(t, bin, "router", "--http", ports[0], "--cluster", member)
	gateway := startProcess(t, bin, "gateway", "--listen", ports[1], "--admin", ports[2], "--upstream", n.url, "--cluster", member)
	defer router()
	defer gateway()
	var pages []string
	for _, u := range []string{"http://" + ports[0], "http://" + ports[2]} {
		if err := waitHTTP(u+"/readyz", 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := get("http://" + ports[1] + "/healthz"); err != nil {
		t.Fatalf("through the gateway: %v", err)
	}
	for _, u := range []string{"http://" + ports[0], "http://" + ports[2]} {
		body, err := get(u + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, body)
	}
	return pages
}

// loopbackPorts returns n loopback addresses free a moment ago.
func loopbackPorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ln.Addr().String())
		defer ln.Close()
	}
	return out
}

// startProcess starts bin with args and returns a function that stops it
// (SIGTERM, then kill after 15s) and waits for it.
func startProcess(t *testing.T, bin string, args ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	return func() { cancel(); _ = cmd.Wait() }
}
