package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/gateway"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
)

// A gateway whose cluster cannot be reached serves at once: a limited
// route answers 503 while it still waits for its first view, and the
// warning comes once that wait is over. Was: it waited up to 10 s for
// the view before it served, and the kernel held every connection
// unanswered meanwhile. Real loopback; the deadlines only bound a hang.
func TestGatewayServesBeforeItsFirstView(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: all, path: /*, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listen, dead := freePort(t), freePort(t) // nothing listens on dead
	var logs logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	go func() {
		exited <- runGateway(ctx, []string{"--listen", listen, "--cluster", dead, "--upstream", "http://" + dead, "--config", cfg},
			func(string) string { return "" }, io.Discard, &logs)
	}()
	hc := &http.Client{Timeout: 5 * time.Second}
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		if resp, err = hc.Get("http://" + listen + "/x"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway never answered: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"unavailable"`) {
		t.Fatalf("with no view: %d %s, want 503 unavailable", resp.StatusCode, body)
	}
	if strings.Contains(logs.String(), "no cluster view yet") {
		t.Fatalf("answered only after the 10 s wait for a view:\n%s", logs.String())
	}
	cancel()
	select {
	case rc := <-exited:
		if rc != 0 {
			t.Fatalf("exit %d\n%s", rc, logs.String())
		}
		if !strings.Contains(logs.String(), `"msg":"stopped"`) {
			t.Fatalf("no stopped line, as serve writes one:\n%s", logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not stop\n%s", logs.String())
	}
}

// The embedded member's loopback ports refuse other local processes: its
// admin API wants a token only the gateway knows, and its Raft and data
// plane a cluster secret. Was: a sidecar could PUT rules that turned the
// limiting off, or read the hash seed.
func TestEmbeddedMemberRefusesLocalStrangers(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - {name: r, algorithm: gcra, limit: 1, period: 1h}\nroutes:\n  - {name: all, path: /*, limits: [{rule: r}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	timeout, refresh, linger, batch, token, cluster := router.DefaultConfig().Timeout, time.Second, router.DefaultConfig().Linger, 512, "", ""
	o := gatewayOpts{config: cfg, dataDir: t.TempDir(), embedded: true, startWait: 30 * time.Second,
		follower: followerFlags{cluster: &cluster, adminToken: &token, refresh: &refresh, fwdTimeout: &timeout, linger: &linger, maxBatch: &batch}}
	s, err := startEmbedded(context.Background(), o, []limiter.Rule{{Name: "r"}}, &routeSink{log: slog.New(slog.DiscardHandler)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	cl, err := s.Node.Cluster(t.Context())
	if err != nil || len(cl.Members) != 1 {
		t.Fatalf("cluster %+v, %v", cl, err)
	}
	self := cl.Members[0]
	base := "http://" + self.HTTP
	for _, q := range []struct{ method, path, body string }{
		{http.MethodPut, "/v1/rules", `{"rules": []}`},
		{http.MethodGet, "/v1/cluster/view", ""},
		{http.MethodPost, "/v1/cluster/leave", `{"id": "gateway"}`},
	} {
		req, _ := http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s from another local process: %d, want 401", q.method, q.path, resp.StatusCode)
		}
	}
	// The data plane: a plain connection's frame is never answered; the
	// connection is told it needs authentication (an error frame of
	// request id 0, CodeAuth), and closed.
	nc, err := net.Dial("tcp", self.Peer)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	req := &transport.BatchRequest{Checks: []transport.Check{{Rule: "r", KeyHash: 1, Cost: 1}}}
	if _, err := nc.Write(transport.AppendBatchRequest(nil, 1, 0, req)); err == nil {
		frame, err := transport.ReadFrame(nc, nil)
		if err == nil {
			id, rerr, derr := transport.DecodeError(frame)
			if derr != nil || id != 0 || rerr.Code != transport.CodeAuth {
				t.Errorf("the embedded member's data plane answered a stranger's frame: % x", frame)
			}
			if _, err := transport.ReadFrame(nc, nil); err == nil {
				t.Error("the connection of a stranger's frame stayed open after the refusal")
			}
		}
	}
}

// `ringlimit status --addr` pointed at a gateway's admin listener says
// what that listener is, as a router does (was: "http_404 (404): 404
// page not found"), and its health endpoints still answer.
func TestGatewayAdminNamesItself(t *testing.T) {
	p := &gatewayProc{reg: prometheus.NewRegistry(), ready: func() error { return nil }}
	srv := httptest.NewServer(p.adminHandler())
	t.Cleanup(srv.Close)
	code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", srv.URL)
	if code != 2 || out != "" || !strings.Contains(errs, "not_found (404): no endpoint GET /v1/cluster on a gateway's admin listener") {
		t.Errorf("status of a gateway's admin listener: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/v1/check": 404} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// embeddedGateway starts an embedded gateway on config in front of up,
// serving on an httptest server; log receives its lines.
func embeddedGateway(t *testing.T, config string, up *url.URL, log io.Writer) (*gatewayProc, string) {
	t.Helper()
	timeout, refresh, linger, batch, token, cluster := router.DefaultConfig().Timeout, time.Second, router.DefaultConfig().Linger, 512, "", ""
	o := gatewayOpts{upstream: up, config: config, dataDir: t.TempDir(), embedded: true, startWait: 30 * time.Second,
		follower: followerFlags{cluster: &cluster, adminToken: &token, refresh: &refresh, fwdTimeout: &timeout, linger: &linger, maxBatch: &batch}}
	p, err := startGateway(t.Context(), o, slog.New(slog.NewJSONHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.stopFn(context.Background()) })
	s := httptest.NewServer(p.gw)
	t.Cleanup(s.Close)
	return p, s.URL
}

// gaugeValue reads an unlabelled gauge, or the sum of a counter's
// series, from reg; -1 when it has none.
func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		sum := 0.0
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	return -1
}

// An embedded gateway's config of routes alone (no rules: list) is
// valid, as at start: its watcher takes it too. Was: logged at ERROR as
// "rules file refused ... names no rules list", last_load_ok 0.
func TestEmbeddedConfigOfRoutesAloneIsNotRefused(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: all, path: /*, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs logbuf.Buffer
	p, _ := embeddedGateway(t, cfg, &url.URL{Scheme: "http", Host: "127.0.0.1:1"}, &logs)
	eventually(t, "the watcher's first load", func() bool { return gaugeValue(t, p.reg, "ringlimit_rules_file_loads_total") >= 1 })
	if ok := gaugeValue(t, p.reg, "ringlimit_rules_file_last_load_ok"); ok != 1 || strings.Contains(logs.String(), "rules file refused") {
		t.Fatalf("last_load_ok %v, logs:\n%s", ok, logs.String())
	}
}

// An embedded gateway reloads its --config whole: the routes go in force
// with the rules, and a version whose routes name a rule it does not
// define is refused (logged, last_load_ok 0) with the rules and routes in
// force kept, as a start refuses it. Was: the rules alone were reloaded,
// so a rule added with its route went unused and a route whose rule was
// removed with it answered 500 until a restart.
func TestEmbeddedReloadTakesRoutesWithRules(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - {name: a, algorithm: sliding_log, limit: 1, period: 1h}\nroutes:\n  - {name: ra, path: /a/*, limits: [{rule: a}]}\n")
	var logs logbuf.Buffer
	p, base := embeddedGateway(t, cfg, upURL, &logs)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy")
	}
	if code, _ := get("/a/x"); code != http.StatusOK {
		t.Fatalf("first /a/x: %d", code)
	}
	if code, _ := get("/a/x"); code != http.StatusTooManyRequests {
		t.Fatalf("second /a/x: %d, want 429", code)
	}

	// Rule a and its route go; rule b and its route come.
	write("rules:\n  - {name: b, algorithm: sliding_log, limit: 1000, period: 1h}\nroutes:\n  - {name: rb, path: /b/*, limits: [{rule: b}]}\n")
	eventuallyWhy(t, "route rb in force", func() string {
		if code, policy := get("/b/x"); code != http.StatusOK || !strings.HasPrefix(policy, `"b"`) {
			return fmt.Sprintf("/b/x: %d, RateLimit-Policy %q", code, policy)
		}
		return ""
	})
	if code, policy := get("/a/x"); code != http.StatusOK || policy != "" {
		t.Fatalf("/a/x with its route and rule removed: %d, RateLimit-Policy %q; want 200 unlimited (no route)", code, policy)
	}

	// A route naming a rule the file does not define: refused whole.
	okLoads := gaugeValue(t, p.reg, "ringlimit_rules_file_loads_total")
	write("rules:\n  - {name: c, algorithm: sliding_log, limit: 1, period: 1h}\nroutes:\n  - {name: rc, path: /c/*, limits: [{rule: nope}]}\n")
	eventually(t, "the refusal", func() bool { return gaugeValue(t, p.reg, "ringlimit_rules_file_loads_total") > okLoads })
	if ok := gaugeValue(t, p.reg, "ringlimit_rules_file_last_load_ok"); ok != 0 || !strings.Contains(logs.String(), `no rule named \"nope\"`) {
		t.Fatalf("last_load_ok %v; logs:\n%s", ok, logs.String())
	}
	if code, policy := get("/b/x"); code != http.StatusOK || !strings.HasPrefix(policy, `"b"`) {
		t.Fatalf("/b/x after a refused file: %d, RateLimit-Policy %q; want rb still in force", code, policy)
	}
	if v := p.member.Router.View(); v.Rules["b"] == nil || v.Rules["c"] != nil {
		t.Fatal("the refused file's rules went in force")
	}
}

// A gateway that could never work is refused at start, exit 2 with a
// message saying why: no upstream (was: `want a URL such as
// http://127.0.0.1:9000, got "http://"`, which did not say the flag is
// required), an upstream that is not http(s) (was: started, and every
// request answered 502), and routes with a tier when no client can have
// one (was: taken, and their limits never applied).
func TestGatewayRefusesWhatCanNeverWork(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: pro, path: /*, tier: pro, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "hs.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--upstream is required"},
		{[]string{"--upstream", " "}, "--upstream is required"},
		{[]string{"--upstream", "ftp://files.example"}, `scheme "ftp" not supported`},
		{[]string{"--upstream", "unix:///run/app.sock"}, `scheme "unix" not supported`},
		{[]string{"--upstream", "http://127.0.0.1:1", "--config", cfg}, `route "pro": tier "pro" can never match`},
		{[]string{"--upstream", "http://127.0.0.1:1", "--config", cfg, "--jwt-key", key}, `route "pro": tier "pro" can never match`},
	} {
		// The deadline only ends a gateway that started (the bug).
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		code, _, errs := runCmd(ctx, runGateway, nil, append(base, tc.args...)...)
		cancel()
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("gateway %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	if err := checkTiers([]rules.Route{{Name: "pro", Tier: "pro"}}, gateway.Identity{JWT: &gateway.JWTKeys{}, TierClaim: "plan"}); err != nil {
		t.Errorf("tier routes with --jwt-key and --tier-claim: %v", err)
	}
	for _, s := range []string{"127.0.0.1:9000", "HTTPS://app.internal/", "http://[::1]:80", "app", ":9000"} {
		if u, err := upstreamURL(s); err != nil || u.Host == "" {
			t.Errorf("upstreamURL(%q) = %v, %v; want a URL", s, u, err)
		}
	}
	for _, s := range []string{":99999", "127.0.0.1:0", "http://app:x"} {
		if u, err := upstreamURL(s); err == nil {
			t.Errorf("upstreamURL(%q) = %v; want an error", s, u)
		}
	}
}

// A gateway's /readyz says why it is not ready: no view yet, a view
// gone stale (every --cluster member gone), or the embedded member's
// own reason. Was: "no cluster view yet" whatever the cause.
func TestGatewayReadyzSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready func() error
		want  string
	}{
		{"no view", followReadiness(func() bool { return false }, func() bool { return false }, func() time.Duration { return 0 }), "no cluster view yet"},
		{"stale", followReadiness(func() bool { return false }, func() bool { return true }, func() time.Duration { return 42 * time.Second }), "cluster view stale: last read 42s ago"},
		{"embedded", func() error { return fmt.Errorf("%w: no raft leader", api.ErrUnavailable) }, `"message":"no raft leader"`},
	} {
		p := &gatewayProc{reg: prometheus.NewRegistry(), ready: tc.ready}
		srv := httptest.NewServer(p.adminHandler())
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), tc.want) || !strings.Contains(string(body), `"error":"unavailable"`) {
			t.Errorf("%s: %d %s, want 503 saying %q", tc.name, resp.StatusCode, body, tc.want)
		}
	}
	if err := followReadiness(func() bool { return true }, func() bool { return true }, func() time.Duration { return 0 })(); err != nil {
		t.Errorf("ready: %v", err)
	}
}

// Until a reloaded file's rules are in force, the embedded gateway runs
// its routes that name only rules in force: a route removed with its
// rule is gone at once, a route that names a rule the file adds keeps
// its old version (or is not there yet), and the others take their new
// form. Was: the old routes ran until the new rules were in force, so a
// removed rule was met through its route: 500s.
func TestInterimRoutesNameOnlyRulesInForce(t *testing.T) {
	route := func(name, path string, rs ...string) rules.Route {
		r := rules.Route{Name: name, Path: path}
		for _, x := range rs {
			r.Limits = append(r.Limits, rules.Limit{Rule: x})
		}
		return r
	}
	inForce := map[string]bool{"default": true, "hot": true, "api": true}
	cur := []rules.Route{route("hot", "/hot", "hot"), route("api", "/api", "api"), route("chat", "/chat", "api")}
	next := []rules.Route{route("api", "/api/v2", "api"), route("chat", "/chat", "api", "tpm"), route("new", "/new", "tpm")}
	got := interimRoutes(next, cur, func(n string) bool { return inForce[n] })
	var names []string
	for _, r := range got {
		names = append(names, r.Name+" "+r.Path+" "+fmt.Sprint(len(r.Limits)))
	}
	if want := []string{"api /api/v2 1", "chat /chat 1"}; !slices.Equal(names, want) {
		t.Errorf("interim routes %q, want %q (hot removed, api new, chat old until tpm is in force, new not yet)", names, want)
	}
}

// --jwt-audience and --jwt-issuer are checked on tokens verified with
// --jwt-key: given without it (on the command line or from the
// environment) they would check nothing, and the gateway refuses to
// start, exit 2 naming the flag. So does a negative --upstream-timeout,
// and an --ipv6-prefix outside 1 to 128.
func TestGatewayRefusesJWTClaimsWithoutKeyAndNegativeTimeout(t *testing.T) {
	base := []string{"--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:1", "--upstream", "http://127.0.0.1:1"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--jwt-audience", "api"}, "--jwt-audience needs --jwt-key"},
		{nil, []string{"--jwt-issuer", "https://auth.example"}, "--jwt-issuer needs --jwt-key"},
		{map[string]string{"RINGLIMIT_JWT_ISSUER": "https://auth.example"}, nil, "--jwt-issuer needs --jwt-key"},
		{nil, []string{"--upstream-timeout", "-1s"}, "--upstream-timeout: must be ≥ 0 (0: no limit), got -1s"},
		{nil, []string{"--ipv6-prefix", "0"}, "--ipv6-prefix: want 1 to 128 bits"},
		{nil, []string{"--ipv6-prefix", "129"}, "--ipv6-prefix: want 1 to 128 bits"},
		{map[string]string{"RINGLIMIT_UPSTREAM_TIMEOUT": "-5ms"}, nil, "--upstream-timeout: must be ≥ 0"},
	} {
		// The deadline only ends a gateway that started (the bug).
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		code, _, errs := runCmd(ctx, runGateway, tc.env, append(base, tc.args...)...)
		cancel()
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("gateway %v env %v: exit %d, stderr %q; want 2 and %q", tc.args, tc.env, code, errs, tc.want)
		}
	}
}

// upstreamTransport bounds the response headers alone (0: not at all),
// on a copy of http.DefaultTransport (its proxy and dial settings kept).
func TestUpstreamTransport(t *testing.T) {
	for _, d := range []time.Duration{0, 50 * time.Millisecond, 2 * time.Minute} {
		tr := upstreamTransport(d)
		if tr == http.DefaultTransport || tr.ResponseHeaderTimeout != d || tr.Proxy == nil || tr.DialContext == nil {
			t.Errorf("upstreamTransport(%v) = %#v; want a clone of http.DefaultTransport with ResponseHeaderTimeout %v", d, tr, d)
		}
	}
	if dt := http.DefaultTransport.(*http.Transport); dt.ResponseHeaderTimeout != 0 || dt.MaxIdleConnsPerHost != 0 || dt.DisableCompression {
		t.Error("http.DefaultTransport was changed")
	}
}

// The gateway's transport reuses its connections to the upstream under
// concurrent requests, and forwards Accept-Encoding as the client sent
// it. Was: http.DefaultTransport's 2 idle connections per host, so most
// of 16 concurrent requests dialed anew each time, and an
// "Accept-Encoding: gzip" no client had sent.
func TestUpstreamTransportKeepsItsConnections(t *testing.T) {
	var gzipAsked atomic.Int32
	up, conns := countingUpstream(t, func(r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "" {
			gzipAsked.Add(1)
		}
	})
	c := &http.Client{Transport: upstreamTransport(0)}
	defer c.CloseIdleConnections()
	const callers, rounds = 16, 100
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range rounds {
				if err := drainedGet(c, up.URL); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d connections for %d requests", conns.Load(), callers*rounds)
	if n := conns.Load(); n > 2*callers {
		t.Errorf("%d connections for %d requests of %d callers; want at most %d (kept and reused)", n, callers*rounds, callers, 2*callers)
	}
	if n := gzipAsked.Load(); n != 0 {
		t.Errorf("%d requests came with an Accept-Encoding their client did not send", n)
	}
}

// countingUpstream starts an upstream answering "ok" (after seen, if
// set, has looked at the request) that counts the connections it
// accepts; it is closed when tb ends.
func countingUpstream(tb testing.TB, seen func(*http.Request)) (*httptest.Server, *atomic.Int64) {
	conns := new(atomic.Int64)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r)
		}
		_, _ = io.WriteString(w, "ok")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	tb.Cleanup(up.Close)
	return up, conns
}

// drainedGet GETs u with c and reads the answer to its end.
func drainedGet(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// serveWatch is a log sink that closes ready at the gateway's
// "serving" line: its listener is open then.
type serveWatch struct {
	logbuf.Buffer
	once  sync.Once
	ready chan struct{}
}

func (w *serveWatch) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(string(p), `"msg":"ringlimit gateway serving"`) {
		w.once.Do(func() { close(w.ready) })
	}
	return n, err
}

// The flags reach the running gateway: a token for another audience or
// from another issuer is refused 401, the right one is taken (then
// answered 503: the --cluster here never answers, so no limiter is
// ready), and an upstream slower than --upstream-timeout to send its
// headers is answered 504. Real loopback; the deadlines only bound a
// hang, and the 50 ms are the gateway's timer.
func TestGatewayJWTClaimAndUpstreamTimeoutFlags(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) }) // runs first: Close waits for the handlers
	dir := t.TempDir()
	cfg, key := filepath.Join(dir, "gateway.yaml"), filepath.Join(dir, "hs.key")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: slow, path: /slow, unlimited: true}\n  - {name: all, path: /*, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := []byte(strings.Repeat("k", 32))
	if err := os.WriteFile(key, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	listen, dead := freePort(t), freePort(t) // nothing listens on dead
	logs := &serveWatch{ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	exited := make(chan int, 1)
	go func() {
		exited <- runGateway(ctx, []string{"--listen", listen, "--cluster", dead, "--upstream", slow.URL, "--config", cfg,
			"--jwt-key", key, "--jwt-audience", "api", "--jwt-issuer", "https://auth.example", "--upstream-timeout", "50ms"},
			func(string) string { return "" }, io.Discard, logs)
	}()
	select {
	case <-logs.ready:
	case rc := <-exited:
		t.Fatalf("exit %d\n%s", rc, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not serve\n%s", logs.String())
	}
	token := func(aud, iss string) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "aud": aud, "iss": iss}).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + s
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		name, path, auth string
		want             int
	}{
		{"other audience", "/x", token("billing", "https://auth.example"), http.StatusUnauthorized},
		{"other issuer", "/x", token("api", "https://evil.example"), http.StatusUnauthorized},
		{"right token, no limiter", "/x", token("api", "https://auth.example"), http.StatusServiceUnavailable},
		{"slow upstream", "/slow", "", http.StatusGatewayTimeout},
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+listen+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.want)
		}
	}
	cancel()
	select {
	case rc := <-exited:
		if rc != 0 {
			t.Fatalf("exit %d\n%s", rc, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not stop\n%s", logs.String())
	}
}
