// Package chaos runs the real ringlimit binary as separate processes (and,
// for the network partition and the one-way cut, in Docker containers)
// and injects the faults a deployment meets: SIGKILL, SIGSTOP/SIGCONT,
// leader loss, rolling restarts, membership changes, a cut network link,
// a link cut one way. Each scenario drives
// load through the HTTP API from goroutines of the test, measures what the
// clients saw, asserts the targets of issue 8, writes its figures to a
// summary file and t.Log, and draws a timeline PNG.
//
// The suite is slow by nature (about 4-6 minutes on a 2-core machine): it
// is skipped by `go test -short` and by race-enabled builds (the race
// detector would only slow the load generator down; the product's own
// packages carry the race tests). .ci/run runs it on its own line without
// -race. Output goes to $CHAOS_OUT (default: a new temporary directory,
// logged at the start).
package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error

	outOnce sync.Once
	outDir  string
)

// skipUnlessChaos skips the scenario in -short mode and in race builds.
func skipUnlessChaos(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("chaos: runs real processes for minutes; skipped with -short")
	}
	if raceEnabled {
		t.Skip("chaos: skipped under -race (it only slows the load generator); .ci/run runs `go test ./test/chaos/` without -race")
	}
}

// binary builds cmd/ringlimit once, statically (CGO_ENABLED=0), so the
// same file runs on the host and in a FROM scratch image. $CHAOS_BINARY,
// when set, names a binary to run instead (static too, for the Docker
// scenarios): another build, such as one from before a fix, to see
// whether a scenario tells the two apart.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("CHAOS_BINARY"); p != "" {
			binPath, buildErr = filepath.Abs(p)
			if buildErr == nil {
				_, buildErr = os.Stat(binPath)
			}
			return
		}
		dir, err := os.MkdirTemp("", "ringlimit-chaos-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "ringlimit")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/ringlimit/ringlimit/cmd/ringlimit")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// output returns the directory for one scenario's summary, plot and logs.
func output(t *testing.T) string {
	t.Helper()
	outOnce.Do(func() {
		outDir = os.Getenv("CHAOS_OUT")
		if outDir == "" {
			outDir, _ = os.MkdirTemp("", "ringlimit-chaos-out")
		}
	})
	dir := filepath.Join(outDir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("output in %s", dir)
	return dir
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// member is one `ringlimit serve` process; a restart reuses the same
// command line (and so the same ports and data dir).
type member struct {
	id, http string
	args     []string
	logPath  string

	mu   sync.Mutex // guards cmd, done
	cmd  *exec.Cmd
	done chan struct{}
}

// cluster is the set of members one scenario started.
type cluster struct {
	t         *testing.T
	dir       string
	deadAfter time.Duration
	members   []*member
}

func newCluster(t *testing.T, deadAfter time.Duration) *cluster {
	return &cluster{t: t, dir: output(t), deadAfter: deadAfter}
}

// add starts a member (joining via the first member unless it is the
// first) and waits until it is ready.
func (c *cluster) add(id string) *member {
	t := c.t
	t.Helper()
	m := &member{id: id, logPath: filepath.Join(c.dir, id+".log")}
	c.members = append(c.members, m)
	t.Cleanup(func() { m.kill() })
	// A port freeAddr found free may be taken before the member binds
	// it (an outgoing connection's local port: loopback ports come from
	// the same ephemeral range): such a start exits at once saying so,
	// and is tried again on other ports and a fresh data dir. Was: a
	// 60 s wait for a member that had exited (CI, 2026-12-06).
	for attempt := 1; ; attempt++ {
		m.http = freeAddr(t)
		m.args = []string{"serve", "--id", id, "--http", m.http, "--raft", freeAddr(t), "--peer", freeAddr(t),
			"--data-dir", filepath.Join(t.TempDir(), id), "--admin-token", adminToken}
		if c.deadAfter > 0 {
			m.args = append(m.args, "--dead-after", c.deadAfter.String())
		}
		if len(c.members) > 1 {
			m.args = append(m.args, "--join", c.members[0].http)
		}
		before, _ := os.Stat(m.logPath) // this attempt's lines come after
		m.start(t)
		_, done := m.proc()
		ready := false
		waitFor(t, id+" ready", 60*time.Second, func() bool {
			select {
			case <-done: // exited
				return true
			default:
			}
			ready = status(m.http, "/readyz") == 200
			return ready
		})
		if ready {
			return m
		}
		log, _ := os.ReadFile(m.logPath)
		if before != nil {
			log = log[min(before.Size(), int64(len(log))):]
		}
		if attempt < 3 && strings.Contains(string(log), "address already in use") {
			t.Logf("%s: a port was taken before it bound it; starting it again on others", id)
			continue
		}
		t.Fatalf("%s exited before it was ready; its log:\n%s", id, log)
	}
}

func (m *member) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the test process, whatever way it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
}

func (m *member) proc() (*exec.Cmd, chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd, m.done
}

func (m *member) signal(sig syscall.Signal) {
	cmd, _ := m.proc()
	_ = cmd.Process.Signal(sig)
}

// kill sends SIGKILL (after SIGCONT, harmless) and reaps the process.
func (m *member) kill() {
	cmd, done := m.proc()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
}

// exited waits up to d for the process to exit.
func (m *member) exited(d time.Duration) bool {
	_, done := m.proc()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func (c *cluster) byID(id string) *member {
	for _, m := range c.members {
		if m.id == id {
			return m
		}
	}
	c.t.Fatalf("no member %s", id)
	return nil
}

// settled reports whether every member in want answers /v1/cluster with
// exactly the members in want, all active, on one epoch, with its
// partitions received (/readyz).
func (c *cluster) settled(want []*member) bool {
	var epoch uint64
	for i, m := range want {
		var cl api.Cluster
		if getJSON(m.http, "/v1/cluster", &cl) != 200 || status(m.http, "/readyz") != 200 {
			return false
		}
		if i == 0 {
			epoch = cl.Epoch
		}
		if cl.Epoch != epoch || len(cl.Members) != len(want) {
			return false
		}
		for _, mm := range cl.Members {
			if mm.State != "active" || mm.Partitions == 0 {
				return false
			}
		}
	}
	return true
}

func (c *cluster) waitSettled(want []*member) {
	c.t.Helper()
	waitFor(c.t, "cluster settled", 60*time.Second, func() bool { return c.settled(want) })
}

// start3 starts a 3-member cluster and writes the rules.
func start3(t *testing.T, deadAfter time.Duration, rules []api.Rule) *cluster {
	t.Helper()
	c := newCluster(t, deadAfter)
	for _, id := range []string{"n1", "n2", "n3"} {
		c.add(id)
	}
	c.waitSettled(c.members)
	// Members join as Raft non-voters and are promoted once caught up: a
	// fault before then can leave two voters of which one is the victim,
	// and no quorum to elect a leader or mark anyone dead (scenario 7
	// once stopped its leader with n3 still a non-voter).
	c.waitVoters(3)
	c.setRules(rules)
	return c
}

// waitVoters waits until the first member lists n Raft voters.
func (c *cluster) waitVoters(n int) {
	c.t.Helper()
	waitFor(c.t, fmt.Sprintf("%d voters", n), 30*time.Second, func() bool {
		var cl api.Cluster
		if getJSON(c.members[0].http, "/v1/cluster", &cl) != 200 {
			return false
		}
		voters := 0
		for _, m := range cl.Members {
			if m.Voter != nil && *m.Voter {
				voters++
			}
		}
		return voters == n
	})
}

// setRules writes the rules through the first member and waits until
// every member lists them: a PUT is in force where it was acknowledged,
// and the load goes to every member.
func (c *cluster) setRules(rules []api.Rule) {
	c.t.Helper()
	putRules(c.t, c.members[0].http, rules)
	for _, m := range c.members {
		waitFor(c.t, "rules on "+m.id, 30*time.Second, func() bool {
			var rs api.Rules
			return getJSON(m.http, "/v1/rules", &rs) == 200 && len(rs.Rules) == len(rules)+1
		})
	}
}

func putRules(t *testing.T, addr string, rules []api.Rule) {
	t.Helper()
	body, _ := json.Marshal(api.Rules{Rules: rules})
	code, out := post(addr, "/v1/rules", "PUT", body)
	if code != 200 {
		t.Fatalf("PUT /v1/rules = %d %s", code, out)
	}
}

// leader returns the member that leads, as the given member sees it.
func (c *cluster) leader(from *member) *member {
	c.t.Helper()
	var cl api.Cluster
	waitFor(c.t, "a leader", 30*time.Second, func() bool {
		return getJSON(from.http, "/v1/cluster", &cl) == 200 && cl.Leader != ""
	})
	return c.byID(cl.Leader)
}

// leaderAndFollowers returns the Raft leader (as the first member sees
// it) and the other members.
func (c *cluster) leaderAndFollowers() (lead *member, followers []*member) {
	lead = c.leader(c.members[0])
	for _, m := range c.members {
		if m != lead {
			followers = append(followers, m)
		}
	}
	return lead, followers
}

// ownerView is the ring as a router computes it, to find keys' owners.
type ownerView struct{ v *router.View }

func viewOf(t *testing.T, addr string) ownerView {
	t.Helper()
	var av api.ClusterView
	if code := getJSON(addr, "/v1/cluster/view", &av); code != 200 {
		t.Fatalf("GET /v1/cluster/view = %d", code)
	}
	v, err := router.ViewFromAPI(av)
	if err != nil {
		t.Fatal(err)
	}
	return ownerView{v}
}

func (o ownerView) owner(key string) string {
	_, m, _ := o.v.Ring.OwnerOfKey(limiter.KeyHash(o.v.Seed, key))
	return m.ID
}

// keysOwnedBy returns n keys named prefix-i whose owner is (or, with
// not, is not) id.
func (o ownerView) keysOwnedBy(prefix, id string, n int, not bool) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := prefix + "-" + strconv.Itoa(i)
		if (o.owner(k) == id) != not {
			keys = append(keys, k)
		}
	}
	return keys
}

// activeIDs returns the ids in the ring of the member at addr (nil if it
// does not answer).
func activeIDs(addr string) []string {
	var av api.ClusterView
	if getJSON(addr, "/v1/cluster/view", &av) != 200 {
		return nil
	}
	ids := make([]string, 0, len(av.Members))
	for _, m := range av.Members {
		ids = append(ids, m.ID)
	}
	return ids
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// metric returns the value of an unlabelled Prometheus metric at addr.
func metric(addr, name string) (float64, bool) {
	resp, err := ctlClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// waitFor polls cond every 20 ms until it holds or d has passed.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ctlClient is for control-plane calls; the load has its own client.
var ctlClient = &http.Client{Timeout: 2 * time.Second, Transport: authTransport{}}

// adminToken is every member's --admin-token: the containers' admin
// endpoints are not called from loopback.
const adminToken = "chaos-admin-token"

// authTransport sends the admin token with every control-plane request.
type authTransport struct{}

func (authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+adminToken)
	return http.DefaultTransport.RoundTrip(r)
}

func status(addr, path string) int {
	resp, err := ctlClient.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func getJSON(addr, path string, out any) int {
	resp, err := ctlClient.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(out) != nil {
		return 0
	}
	return resp.StatusCode
}

func post(addr, path, method string, body []byte) (int, string) {
	req, err := http.NewRequest(method, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ctlClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// report collects a scenario's figures for t.Log and summary.txt.
type report struct {
	t     *testing.T
	dir   string
	lines []string
}

func newReport(t *testing.T, dir string) *report { return &report{t: t, dir: dir} }

func (r *report) add(format string, args ...any) {
	r.t.Helper()
	line := fmt.Sprintf(format, args...)
	r.t.Log(line)
	r.lines = append(r.lines, line)
}

func (r *report) write() {
	if err := os.WriteFile(filepath.Join(r.dir, "summary.txt"), []byte(strings.Join(r.lines, "\n")+"\n"), 0o644); err != nil {
		r.t.Error(err)
	}
}
