package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestComposeCluster builds the image the no-pull way (scripts/image.sh,
// FROM scratch), starts deploy/compose, waits for 3 active members, shows
// the exact global limit across them, stops the Raft leader's container
// and shows the survivors still answering with the state it handed off,
// starts it again and sees it rejoin as itself, and removes every
// container, network, volume and the image it made.
// Skipped only when no Docker engine answers.
func TestComposeCluster(t *testing.T) {
	if out, err := run(context.Background(), 20*time.Second, nil, "docker", "version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("no Docker engine answers (docker version: %v: %s); the Compose cluster test needs one", err, strings.TrimSpace(out))
	}
	compose := composeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()

	id := fmt.Sprintf("ci%d", os.Getpid())
	tag := "ringlimit:" + id
	project := "ringlimit-" + id
	ports := freePorts(t, 6)
	env := []string{"RINGLIMIT_IMAGE=" + tag,
		"RL_N1_HTTP=" + ports[0], "RL_N2_HTTP=" + ports[1], "RL_N3_HTTP=" + ports[2],
		"RL_ROUTER_HTTP=" + ports[3], "RL_GATEWAY_HTTP=" + ports[4], "RL_GATEWAY_ADMIN=" + ports[5]}
	url := map[string]string{"n1": "http://127.0.0.1:" + ports[0], "n2": "http://127.0.0.1:" + ports[1], "n3": "http://127.0.0.1:" + ports[2],
		"router": "http://127.0.0.1:" + ports[3], "gateway": "http://127.0.0.1:" + ports[4], "gateway-admin": "http://127.0.0.1:" + ports[5]}
	// The router and the gateway are in the Compose file once their
	// commands exist in the binary; until then the members are tested.
	services := loadCompose(t).Services
	_, hasRouter := services["router"]
	_, hasGateway := services["gateway"]
	dc := func(timeout time.Duration, args ...string) (string, error) {
		full := append(append(compose[1:], "-p", project, "-f", "compose/docker-compose.yml"), args...)
		return run(ctx, timeout, env, compose[0], full...)
	}

	// Cleanup is registered before anything is made, so a failure at any
	// step still removes what the earlier steps created.
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := dc(time.Minute, "logs", "--no-color", "--tail", "40")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := run(context.Background(), 2*time.Minute, env, compose[0],
			append(compose[1:], "-p", project, "-f", "compose/docker-compose.yml", "down", "-v", "--remove-orphans", "-t", "5")...); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
		if out, err := run(context.Background(), time.Minute, nil, "docker", "rmi", "-f", tag); err != nil {
			t.Errorf("docker rmi %s: %v\n%s", tag, err, out)
		}
	})

	bin := binary(t)
	if out, err := run(ctx, 3*time.Minute, []string{"RINGLIMIT_BINARY=" + bin}, "../scripts/image.sh", tag); err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, out)
	}
	t.Logf("image %s built from scratch in %v", tag, time.Since(start).Round(time.Millisecond))
	if out, err := dc(2*time.Minute, "up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	up := time.Now()
	cl := waitCluster(t, ctx, url["n1"], 90*time.Second, func(c cluster) bool { return c.active() == 3 && c.Leader != "" })
	t.Logf("3 active members %v after %v (leader %s, epoch %d, partitions %v)", cl.ids(), time.Since(up).Round(time.Millisecond), cl.Leader, cl.Epoch, cl.partitions())

	// Exact global limit: tenant-daily admits 100 per key per day; 150
	// checks spread round-robin over the three members admit exactly 100.
	key := "exact-" + id
	all := []string{url["n1"], url["n2"], url["n3"]}
	// Ready as a load balancer sees it: active, a leader, and the rules
	// file in force (until then its rules answer 404 unknown_rule).
	for _, u := range all {
		if err := waitHTTP(u+"/readyz", 60*time.Second); err != nil {
			t.Fatalf("%s not ready: %v", u, err)
		}
	}
	if got := spend(t, all, key, 150); got != 100 {
		t.Fatalf("key %s: %d of 150 checks over 3 members allowed, want exactly the limit 100", key, got)
	}
	t.Logf("exact global limit: 100 of 150 checks allowed, round-robin over 3 members")
	if hasRouter {
		if err := waitHTTP(url["router"]+"/readyz", 60*time.Second); err != nil {
			t.Fatalf("router: %v", err)
		}
		if got := spend(t, []string{url["router"]}, "router-"+id, 150); got != 100 {
			t.Fatalf("through the router: %d of 150 allowed, want exactly 100", got)
		}
		if got := spend(t, append([]string{url["router"]}, all...), "mixed-"+id, 150); got != 100 {
			t.Fatalf("round-robin over the router and the 3 members: %d of 150 allowed, want exactly 100", got)
		}
		t.Logf("through the router: 100 of 150; round-robin over router + 3 members: 100 of 150")
	}
	if hasGateway {
		if err := waitHTTP(url["gateway-admin"]+"/readyz", 60*time.Second); err != nil {
			t.Fatalf("gateway: %v", err)
		}
		ok, limited, retry := proxy(t, url["gateway"], "gw-"+id, 150)
		if ok != 100 || limited != 50 {
			t.Fatalf("through the gateway: %d forwarded and %d answered 429 of 150, want exactly 100 and 50", ok, limited)
		}
		t.Logf("through the gateway: 100 of 150 forwarded to the upstream, 50 answered 429 (Retry-After %s s)", retry)
	}

	// The members' health check (status --ready, the image has no curl)
	// says healthy once they are ready: by now, within a few of its 5 s
	// intervals. A check the binary cannot run would leave them unhealthy.
	healthDeadline := time.Now().Add(45 * time.Second)
	for _, svc := range []string{"n1", "n2", "n3"} {
		for {
			idOut, _ := dc(30*time.Second, "ps", "-q", svc)
			health, _ := run(ctx, 30*time.Second, nil, "docker", "inspect", "--format", "{{.State.Health.Status}}", strings.TrimSpace(idOut))
			if strings.TrimSpace(health) == "healthy" {
				break
			}
			if time.Now().After(healthDeadline) {
				t.Fatalf("%s: health %q, want healthy once ready", svc, strings.TrimSpace(health))
			}
			time.Sleep(time.Second)
		}
	}
	t.Logf("3 members healthy (status --ready) after %v", time.Since(up).Round(time.Millisecond))

	// Stop the leader's container (SIGTERM: drain, hand off, step down).
	leader := cl.Leader
	var survivors []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if n != leader {
			survivors = append(survivors, url[n])
		}
	}
	stop := time.Now()
	if out, err := dc(time.Minute, "stop", "-t", "20", leader); err != nil {
		t.Fatalf("compose stop %s: %v\n%s", leader, err, out)
	}
	t.Logf("stopped the leader %s in %v", leader, time.Since(stop).Round(time.Millisecond))
	cl = waitCluster(t, ctx, survivors[0], 60*time.Second, func(c cluster) bool {
		return c.active() == 2 && c.Leader != "" && c.Leader != leader
	})
	t.Logf("after the stop: leader %s, epoch %d, members %v, %v after the stop", cl.Leader, cl.Epoch, cl.states(), time.Since(stop).Round(time.Millisecond))
	if got := spend(t, survivors, key, 20); got != 0 {
		t.Errorf("key %s (spent before the stop): %d of 20 allowed on the survivors, want 0: its state was not handed off", key, got)
	}
	key2 := "after-" + id
	if got := spend(t, survivors, key2, 150); got != 100 {
		t.Fatalf("key %s: %d of 150 checks over the 2 survivors allowed, want exactly 100", key2, got)
	}
	t.Logf("with %s stopped: the spent key stays spent (0 of 20), a new key gets exactly 100 of 150 over the survivors", leader)
	// Routers and gateways follow a ring change within a second (API.md);
	// until then a check may still go to the stopped owner and be answered
	// by the failure mode. Wait for their views to reach the epoch.
	if hasRouter {
		waitViewEpoch(t, url["router"], cl.Epoch)
	}
	if hasGateway {
		waitViewEpoch(t, url["gateway-admin"], cl.Epoch)
	}
	if hasRouter {
		if got := spend(t, []string{url["router"]}, "router-after-"+id, 150); got != 100 {
			t.Fatalf("through the router with %s stopped: %d of 150 allowed, want exactly 100", leader, got)
		}
		t.Logf("through the router with %s stopped: 100 of 150", leader)
	}
	if hasGateway {
		if ok, limited, _ := proxy(t, url["gateway"], "gw-after-"+id, 150); ok != 100 || limited != 50 {
			t.Fatalf("through the gateway with %s stopped: %d forwarded, %d answered 429 of 150, want 100 and 50", leader, ok, limited)
		}
		t.Logf("through the gateway with %s stopped: 100 forwarded, 50 answered 429", leader)
	}

	// Start it again: same volume, same id; it rejoins as itself and takes
	// partitions back with their state.
	restart := time.Now()
	if out, err := dc(time.Minute, "start", leader); err != nil {
		t.Fatalf("compose start %s: %v\n%s", leader, err, out)
	}
	cl = waitCluster(t, ctx, url[leader], 90*time.Second, func(c cluster) bool { return c.active() == 3 && len(c.Members) == 3 })
	t.Logf("%s restarted: back as itself after %v, members %v, partitions %v", leader, time.Since(restart).Round(time.Millisecond), cl.states(), cl.partitions())
	if got := spend(t, all, key, 30); got != 0 {
		t.Errorf("key %s after %s came back: %d of 30 allowed, want 0 (state lost in the hand-back)", key, leader, got)
	}
	if hasGateway {
		// A recreated upstream (`up --force-recreate`, or `down` then
		// `up`) is a new container, with a new host name: it must start
		// again. Was: its id was the host name and its data dir a named
		// volume, so every start after a recreate was refused (the dir
		// held the Raft state of a member of another id): a crash loop,
		// and 502 for every request the gateway allowed (an audit).
		if out, err := dc(2*time.Minute, "up", "-d", "--no-deps", "--force-recreate", "upstream"); err != nil {
			t.Fatalf("compose up --force-recreate upstream: %v\n%s", err, out)
		}
		recreated := time.Now()
		for attempt := 0; ; attempt++ {
			code := gatewayGet(t, url["gateway"], fmt.Sprintf("gw-recreated-%s-%d", id, attempt))
			if code == http.StatusOK {
				break
			}
			if time.Since(recreated) > 60*time.Second {
				out, _ := dc(time.Minute, "logs", "--no-color", "--tail", "10", "upstream")
				t.Fatalf("through the gateway, %v after the upstream was recreated: %d, want 200; upstream logs:\n%s", time.Since(recreated).Round(time.Second), code, out)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("the upstream recreated: forwarded to again after %v", time.Since(recreated).Round(time.Millisecond))
	}
	t.Logf("whole test %v", time.Since(start).Round(time.Second))
}

// gatewayGet sends one GET /healthz through the gateway as apiKey and
// returns the status (0 when the gateway does not answer).
func gatewayGet(t *testing.T, gateway, apiKey string) int {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", gateway+"/healthz", nil)
	req.Header.Set("X-API-Key", apiKey)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// composeCommand is docker-compose (v1) or the `docker compose` plugin.
func composeCommand(t *testing.T) []string {
	t.Helper()
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	if _, err := run(context.Background(), 20*time.Second, nil, "docker", "compose", "version"); err == nil {
		return []string{"docker", "compose"}
	}
	t.Fatal("a Docker engine answers but neither docker-compose nor `docker compose` is installed")
	return nil
}

func run(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// freePorts finds n free loopback ports at or above 27000.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var ports []string
	// From a start that differs per process, round the range: was up
	// to 28000 only, so a process whose pid ended in 199 (mod 200)
	// started at 27995 and found 5 ports at most (CI, 2026-12-06).
	start := (os.Getpid() % 200) * 5
	for i := 0; i < 1000 && len(ports) < n; i++ {
		p := 27000 + (start+i)%1000
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		ports = append(ports, fmt.Sprint(p))
	}
	if len(ports) < n {
		t.Fatalf("found only %d free ports in 27000-27999", len(ports))
	}
	return ports
}

type cluster struct {
	Leader  string `json:"leader"`
	Epoch   uint64 `json:"epoch"`
	Members []struct {
		ID         string `json:"id"`
		State      string `json:"state"`
		Partitions int    `json:"partitions"`
	} `json:"members"`
}

func (c cluster) active() int {
	n := 0
	for _, m := range c.Members {
		if m.State == "active" {
			n++
		}
	}
	return n
}

func (c cluster) ids() []string {
	var s []string
	for _, m := range c.Members {
		s = append(s, m.ID)
	}
	return s
}

func (c cluster) states() []string {
	var s []string
	for _, m := range c.Members {
		s = append(s, m.ID+"="+m.State)
	}
	return s
}

func (c cluster) partitions() map[string]int {
	p := map[string]int{}
	for _, m := range c.Members {
		p[m.ID] = m.Partitions
	}
	return p
}

// waitCluster polls GET /v1/cluster until ok holds.
func waitCluster(t *testing.T, ctx context.Context, url string, within time.Duration, ok func(cluster) bool) cluster {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		body, err := get(url + "/v1/cluster")
		var c cluster
		if err == nil && json.Unmarshal([]byte(body), &c) == nil && ok(c) {
			return c
		}
		last = fmt.Sprint(body, err)
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("GET %s/v1/cluster: not there within %v; last: %s", url, within, last)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// spend sends n checks of rule tenant-daily for key, round-robin over
// urls, and returns how many were allowed. Any error or degraded answer
// fails the test: the figure must come from the owners.
func spend(t *testing.T, urls []string, key string, n int) int {
	t.Helper()
	allowed := 0
	for i := range n {
		body, err := post(urls[i%len(urls)]+"/v1/check", fmt.Sprintf(`{"rule":"tenant-daily","key":%q}`, key))
		if err != nil {
			t.Fatalf("check %d of %s: %v", i, key, err)
		}
		var d struct{ Allowed, Degraded bool }
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatalf("check %d: %v: %s", i, err, body)
		}
		if d.Degraded {
			t.Fatalf("check %d of %s via %s: degraded (owner unreachable): %s", i, key, urls[i%len(urls)], body)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// proxy sends n GET /healthz through the gateway as API key apiKey and
// counts the answers forwarded to the upstream (200) and refused (429).
func proxy(t *testing.T, gateway, apiKey string, n int) (ok, limited int, retryAfter string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	for i := range n {
		req, _ := http.NewRequest("GET", gateway+"/healthz", nil)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("gateway request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
			retryAfter = resp.Header.Get("Retry-After")
		default:
			t.Fatalf("gateway request %d: %s", i, resp.Status)
		}
	}
	return ok, limited, retryAfter
}

// waitViewEpoch waits until the router or gateway at url reports a view
// (ringlimit_router_view_epoch) of at least epoch.
func waitViewEpoch(t *testing.T, url string, epoch uint64) {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < 10*time.Second {
		body, err := get(url + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "ringlimit_router_view_epoch "); ok {
				last = v
				if f, err := strconv.ParseFloat(v, 64); err == nil && uint64(f) >= epoch {
					t.Logf("%s follows epoch %d after %v", url, epoch, time.Since(start).Round(time.Millisecond))
					return
				}
			}
		}
		if err != nil {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: view epoch not at %d within 10s (API.md: within 1 s); last: %s", url, epoch, last)
}
