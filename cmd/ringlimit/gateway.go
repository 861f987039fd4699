package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/gctune"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/gateway"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/server"
	"github.com/ringlimit/ringlimit/transport"
)

// gatewayOpts are the parsed gateway flags.
type gatewayOpts struct {
	upstream  *url.URL
	config    string // rules + routes file; "" = default rule on every path
	dataDir   string
	identity  gateway.Identity
	follower  followerFlags
	embedded  bool
	startWait time.Duration
	// upstreamTimeout bounds the wait for the upstream's response
	// headers (--upstream-timeout); 0 = no bound.
	upstreamTimeout time.Duration
}

// gatewayProc is a running gateway: its checker (an embedded member or a
// Ring following the cluster), the proxy and the admin server.
type gatewayProc struct {
	gw     *gateway.Gateway
	reg    *prometheus.Registry
	ready  func() error   // nil when ready, else why not (/readyz says it)
	member *server.Server // embedded mode
	ring   *client.Ring   // cluster mode
	stopFn func(context.Context) error
}

// upstreamURL reads --upstream: an http:// or https:// URL, or host:port
// (http). Was: any other scheme (ftp://, unix:///) started a gateway
// whose every forwarded request failed 502; and none at all was refused
// as `want a URL such as http://127.0.0.1:9000, got "http://"`, which
// did not say that the flag is required.
func upstreamURL(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("--upstream is required: the service behind the gateway, an http:// or https:// URL or host:port (e.g. http://127.0.0.1:9000)")
	}
	if scheme, _, ok := strings.Cut(s, "://"); ok {
		if sc := strings.ToLower(scheme); sc != "http" && sc != "https" {
			return nil, fmt.Errorf("--upstream %q: scheme %q not supported; want http:// or https://", s, scheme)
		}
	} else {
		s = "http://" + s
	}
	u, err := url.Parse(strings.TrimRight(s, "/"))
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--upstream: want a URL such as http://127.0.0.1:9000, got %q", s)
	}
	// Was: a port out of range (":99999") started, and every request
	// answered 502.
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--upstream %q: port %q must be 1 to 65535", s, p)
		}
	}
	return u, nil
}

// checkTiers refuses routes with a tier when no client can have one: a
// tier is the --tier-claim of a token verified with --jwt-key. Was: such
// routes were taken and never matched, so a "pro" or "free" tier's
// limits silently never applied.
func checkTiers(routes []rules.Route, id gateway.Identity) error {
	if id.JWT != nil && id.TierClaim != "" {
		return nil
	}
	for _, r := range routes {
		if r.Tier != "" {
			return fmt.Errorf("route %q: tier %q can never match without --jwt-key and --tier-claim (a tier is a claim of a verified token)", r.Name, r.Tier)
		}
	}
	return nil
}

// parseGatewayConfig reads an embedded gateway's --config whole: its
// written rules (gatewayFileRules) and its routes, checked against the
// file's rules with the built-in default. It is how the file is read at
// start and at every change, so that a reload is all or nothing: a
// version whose routes name a rule it does not define is refused, as a
// start refuses it, and the rules and routes in force stay.
func parseGatewayConfig(doc []byte) ([]limiter.Rule, []rules.Route, error) {
	written, err := gatewayFileRules(doc)
	if err != nil {
		return nil, nil, err
	}
	routes, err := rules.ParseRoutes(doc)
	if err != nil {
		return nil, nil, err
	}
	if err := rules.CheckRoutes(routes, rules.Effective(written)); err != nil {
		return nil, nil, err
	}
	return written, routes, nil
}

// routeSink takes the routes of each version of the file the embedded
// member puts in force (node.RulesFileHooks.InForce) to the gateway,
// which does not exist yet when the first one comes.
type routeSink struct {
	log *slog.Logger
	mu  sync.Mutex       // guards the fields below
	gw  *gateway.Gateway // nil until attached
	// current is the routes the gateway has: until attached, those of
	// the last version put in force, if any (set).
	current []rules.Route
	set     bool
	// inForceRule reports whether the embedded member has a rule of that
	// name in force; nil until attached.
	inForceRule func(name string) bool
}

// before is node.RulesFileHooks.Before: until the file's rules are in
// force, the gateway takes its routes that name only rules in force now
// (a route whose rule the file adds keeps its old version, or waits).
// Then a rule removed with its route is never met through that route:
// was, in the moment between the rules and the routes, answered 500
// (up to 366 requests per reload under load).
func (s *routeSink) before(doc []byte) {
	_, routes, err := parseGatewayConfig(doc)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gw == nil || s.inForceRule == nil || routes == nil {
		return
	}
	interim := interimRoutes(routes, s.current, s.inForceRule)
	s.gw.SetRoutes(interim)
	// Once the rules are written, a route the interim kept at its old
	// version names a rule removed with it until inForce: the file's
	// routes stand in for those (Gateway.SetNextRoutes).
	s.gw.SetNextRoutes(routes)
	s.current = interim
}

// interimRoutes is next restricted to the rules in force (have): each of
// its routes whose rules are all in force, else the route of the same
// name in cur when its are, else none.
func interimRoutes(next, cur []rules.Route, have func(string) bool) []rules.Route {
	all := func(r rules.Route) bool {
		for _, l := range r.Limits {
			if !have(l.Rule) {
				return false
			}
		}
		return true
	}
	out := []rules.Route{}
	for _, r := range next {
		if !all(r) {
			i := slices.IndexFunc(cur, func(c rules.Route) bool { return c.Name == r.Name })
			if i < 0 || !all(cur[i]) {
				continue
			}
			r = cur[i]
		}
		out = append(out, r)
	}
	return out
}

// inForce is node.RulesFileHooks.InForce: the file's rules are in force,
// so its routes go in force with them. Was: the watcher applied the
// rules alone, so changed rules ran with the old routes, and a route
// whose rule was removed with it answered 500 until a restart.
func (s *routeSink) inForce(doc []byte) {
	_, routes, err := parseGatewayConfig(doc)
	if err != nil {
		return // parsed without error just before it was applied
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current, s.set = routes, true
	if s.gw != nil {
		s.gw.SetRoutes(routes)
		s.log.Info("gateway routes in force", "routes", len(routes))
	}
}

// attach gives the sink its gateway, made with routes, and gives it the
// routes of a version put in force before it existed.
func (s *routeSink) attach(gw *gateway.Gateway, routes []rules.Route, inForceRule func(string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gw, s.inForceRule = gw, inForceRule
	if s.set {
		gw.SetRoutes(s.current)
	} else {
		s.current = routes
	}
}

// upstreamTransport is the gateway's transport to the upstream for
// --upstream-timeout d: a clone of http.DefaultTransport (its proxy and
// dial settings) whose ResponseHeaderTimeout is d (0: none), so that an
// upstream that has not sent its response headers d after the request
// was written is answered 504. Only the headers are bounded: a body may
// take as long as it takes (streamed and shaped answers).
//
// It keeps up to upstreamIdle idle connections to its one upstream
// (http.DefaultTransport keeps 2 per host: at 16 concurrent clients an
// audit saw over a third of the requests dial anew, 1,153 closed
// connections in 3,000 requests, where a busy gateway runs out of
// ephemeral ports), and it does not ask for gzip itself
// (DisableCompression): the request goes with the client's
// Accept-Encoding, or none, and the answer comes back as the upstream
// sent it.
func upstreamTransport(d time.Duration) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = d
	t.MaxIdleConns, t.MaxIdleConnsPerHost = upstreamIdle, upstreamIdle
	t.DisableCompression = true
	return t
}

// upstreamIdle is how many idle connections the gateway keeps to its
// upstream, each closed after the transport's IdleConnTimeout (90 s).
const upstreamIdle = 1024

// startGateway builds the checker and the gateway (not yet serving).
func startGateway(ctx context.Context, o gatewayOpts, log *slog.Logger) (*gatewayProc, error) {
	var routes []rules.Route
	var written []limiter.Rule
	if o.config != "" {
		doc, err := os.ReadFile(o.config)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		if o.embedded {
			written, routes, err = parseGatewayConfig(doc)
		} else if _, err = rules.Parse(doc); err == nil { // the cluster's rules apply: the file's are only checked
			routes, err = rules.ParseRoutes(doc)
		}
		if err == nil {
			err = checkTiers(routes, o.identity)
		}
		if err != nil {
			return nil, fmt.Errorf("--config %s: %w", o.config, err)
		}
	}
	p := &gatewayProc{}
	sink := &routeSink{log: log}
	var checker gateway.Checker
	if o.embedded {
		member, err := startEmbedded(ctx, o, written, sink, log)
		if err != nil {
			return nil, err
		}
		p.member, p.reg, checker = member, member.Registry, member.Router
		p.ready = member.Node.Ready
		p.stopFn = member.Shutdown
		if routes != nil {
			// The rules in force may be a later PUT's (--admin-token).
			if err := rules.CheckRoutes(routes, member.Router.View().List); err != nil {
				_ = member.Shutdown(context.Background())
				return nil, fmt.Errorf("--config %s: %w", o.config, err)
			}
		}
	} else {
		p.reg = newRegistry()
		rc, err := o.follower.follow(p.reg, log)
		if err != nil {
			return nil, err
		}
		checker, p.ready, p.ring = rc.Router(), ringReadiness(rc), rc
		p.stopFn = func(context.Context) error { return rc.Close() }
	}
	gw, err := gateway.New(gateway.Config{Upstream: o.upstream, Transport: upstreamTransport(o.upstreamTimeout),
		Routes: routes, Identity: o.identity, Registerer: p.reg, Logger: log}, checker)
	if err != nil {
		_ = p.stopFn(context.Background())
		return nil, err
	}
	var inForceRule func(string) bool
	if p.member != nil {
		rt := p.member.Router
		inForceRule = func(name string) bool { v := rt.View(); return v != nil && v.Rules[name] != nil }
	}
	cur := routes
	if cur == nil {
		cur = gateway.DefaultRoutes()
	}
	sink.attach(gw, cur, inForceRule)
	p.gw = gw
	return p, nil
}

// gatewayFileRules reads the written rules of a --config file as the
// embedded member's watcher takes them: a file that names a routes list
// is a whole gateway config, whose rules list may be left out (no
// written rules, as at start); one that names neither is refused as a
// rules file is (empty, or caught in the middle of its write). Was: the
// watcher read it as a rules file, and a valid config of routes alone
// was logged at ERROR as refused, ringlimit_rules_file_last_load_ok 0.
func gatewayFileRules(doc []byte) ([]limiter.Rule, error) {
	routes, err := rules.ParseRoutes(doc)
	if err != nil {
		return nil, err
	}
	if routes != nil {
		return rules.Parse(doc)
	}
	return rules.ParseFile(doc)
}

// startEmbedded starts a single-node cluster in this process, on loopback
// ports of its own, with the rules of --config, and waits until those
// rules are in force.
func startEmbedded(ctx context.Context, o gatewayOpts, written []limiter.Rule, sink *routeSink, log *slog.Logger) (*server.Server, error) {
	var ls server.Listeners
	for _, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeAll(ls)
			return nil, err
		}
		*l = ln
	}
	// The member's ports are loopback ports of its own, which any local
	// process (a sidecar sharing the pod's loopback) could reach: its
	// admin API takes a token and its Raft and data plane a cluster
	// secret, both made here and known to this process alone (the
	// gateway calls the member in process), or --admin-token when given.
	// Was: no token and no secret, so a local process could PUT rules
	// that turned limiting off, or read the hash seed.
	token := *o.follower.adminToken
	if token == "" {
		token = randomHex(32)
	}
	s, err := server.Start(server.Config{
		ID: "gateway", HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(),
		PeerAdvertise: ls.Peer.Addr().String(), DataDir: o.dataDir, RulesFile: o.config,
		RulesFileHooks: node.RulesFileHooks{
			Parse: func(doc []byte) ([]limiter.Rule, error) {
				w, routes, err := parseGatewayConfig(doc)
				if err == nil {
					err = checkTiers(routes, o.identity)
				}
				if err != nil {
					return nil, fmt.Errorf("%w (the routes in force stay too)", err)
				}
				return w, nil
			},
			Before:  sink.before,
			InForce: sink.inForce,
		},
		Ring: ring.DefaultConfig(), Router: router.Config{Timeout: *o.follower.fwdTimeout},
		Logger: log, AdminToken: token, Auth: &transport.Auth{Secret: []byte(randomHex(32))},
	}, ls)
	if err != nil {
		closeAll(ls)
		return nil, fmt.Errorf("embedded limiter: %w", err)
	}
	deadline := time.Now().Add(o.startWait)
	inForce := func() bool {
		v := s.Router.View()
		if s.Node.Ready() != nil || v == nil {
			return false
		}
		for _, r := range written {
			if v.Rules[r.Name] == nil {
				return false
			}
		}
		return true
	}
	for !inForce() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = s.Shutdown(context.Background())
			return nil, fmt.Errorf("embedded limiter not ready after %v: %v", o.startWait, s.Node.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s, nil
}

func (p *gatewayProc) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{\"status\":\"ok\"}\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := p.ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(api.Error{Code: api.CodeUnavailable, Message: strings.TrimPrefix(err.Error(), "unavailable: ")})
			return
		}
		_, _ = io.WriteString(w, "{\"status\":\"ready\"}\n")
	})
	// Anything else is the API's JSON error naming what this listener
	// is: `ringlimit status --addr` pointed here printed "http_404 (404):
	// 404 page not found", where a router says what it does not serve.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf(
			"no endpoint %.20s %.100s on a gateway's admin listener (it serves GET /metrics, /healthz, /readyz; membership, rules and checks are served by the members)",
			r.Method, r.URL.Path)})
	})
	return mux
}

// followReadiness is a following gateway's or router's readiness (see
// ringReadiness): nil when ready, else why not (an error wrapping
// api.ErrUnavailable, as a member's), from the Ring's Ready, whether it
// has a view and how long ago it last read one. Was: "no cluster view
// yet" whatever the cause, also for a view gone stale when every
// --cluster member stopped answering.
func followReadiness(ready, hasView func() bool, age func() time.Duration) func() error {
	return func() error {
		switch {
		case ready():
			return nil
		case !hasView():
			return fmt.Errorf("%w: no cluster view yet", api.ErrUnavailable)
		default:
			return fmt.Errorf("%w: cluster view stale: last read %v ago (no --cluster member answers GET /v1/cluster/view)", api.ErrUnavailable, age().Round(time.Second))
		}
	}
}

// proxyServer is the client-facing server: no write timeout (upstream
// answers and shaping delays may take long), bounded headers and idles.
func proxyServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10}
}

// runGateway runs the gateway until ctx is done.
func runGateway(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gateway", stderr)
	var (
		listen     = fs.String("listen", "127.0.0.1:8000", "where clients connect")
		upstream   = fs.String("upstream", "", "the service behind the gateway (required): an http:// or https:// URL, or host:port for http")
		config     = fs.String("config", "", "YAML with rules: and routes: (no file: every request is limited by default)")
		dataDir    = fs.String("data-dir", "./ringlimit-gateway-data", "embedded mode (no --cluster): the single node's data")
		apiKey     = fs.String("api-key-header", "", "header whose value identifies the client")
		jwtKey     = fs.String("jwt-key", "", "HS256 secret file, or PEM public key / JWKS file for RS256/ES256")
		jwtClaim   = fs.String("jwt-claim", "sub", "JWT claim holding the client id")
		jwtAud     = fs.String("jwt-audience", "", "with --jwt-key: a token's aud claim (a string or a list) must hold this audience (not checked when empty)")
		jwtIss     = fs.String("jwt-issuer", "", "with --jwt-key: a token's iss claim must equal this issuer (not checked when empty)")
		upTimeout  = fs.Duration("upstream-timeout", 0, "how long the upstream may take to send its response headers before the client gets 504 (0: no limit)")
		tierClaim  = fs.String("tier-claim", "", "JWT claim holding the client's tier")
		trusted    = fs.String("trusted-proxies", "", "comma-separated CIDRs whose X-Forwarded-For is believed")
		ipv6Prefix = fs.Int("ipv6-prefix", gateway.DefaultIPv6Prefix, "an IPv6 client is keyed by this many leading bits of its address (128: the whole address)")
		admin      = fs.String("admin", "", "listen address for /metrics, /healthz, /readyz (off when empty)")
		drainWait  = drainFlag(fs)
		logLevel   = fs.String("log-level", "info", "debug, info, warn or error")
		startWait  = fs.Duration("start-timeout", 30*time.Second, "embedded mode: how long the single node may take to be ready")
		ff         = addFollowerFlags(fs)
		fail2      = func(err error) int { return fail(stderr, "gateway", err) }
		identities gateway.Identity
	)
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		return fail2(err)
	}
	logs.Use(log.Handler()) // bbolt's lines too (embedded mode)
	if soft := gctune.SoftLimit(getenv, ""); soft > 0 {
		log.Debug("soft memory limit from the cgroup", "soft_memory_limit", soft)
	}
	up, err := upstreamURL(*upstream)
	if err != nil {
		return fail2(err)
	}
	if err := checkDrain(*drainWait); err != nil {
		return fail2(err)
	}
	if *upTimeout < 0 {
		return fail2(fmt.Errorf("--upstream-timeout: must be ≥ 0 (0: no limit), got %v", *upTimeout))
	}
	// Checked on verified tokens only: without --jwt-key no token is
	// read, and a gateway an operator meant to hold to one audience or
	// issuer would let every client through keyed by API key or IP.
	for _, f := range []struct{ name, v string }{{"jwt-audience", *jwtAud}, {"jwt-issuer", *jwtIss}} {
		if f.v != "" && *jwtKey == "" {
			return fail2(fmt.Errorf("--%s needs --jwt-key: it is checked on tokens verified with that key, and without one no token is read", f.name))
		}
	}
	identities = gateway.Identity{Claim: *jwtClaim, TierClaim: *tierClaim, APIKeyHeader: *apiKey, Audience: *jwtAud, Issuer: *jwtIss}
	if *jwtKey != "" {
		data, err := os.ReadFile(*jwtKey)
		if err != nil {
			return fail2(fmt.Errorf("--jwt-key: %w", err))
		}
		if identities.JWT, err = gateway.ParseJWTKeys(data); err != nil {
			return fail2(fmt.Errorf("--jwt-key %s: %w", *jwtKey, err))
		}
	}
	if identities.TrustedProxies, err = gateway.ParseCIDRs(*trusted); err != nil {
		return fail2(fmt.Errorf("--trusted-proxies: %w", err))
	}
	if *ipv6Prefix < 1 || *ipv6Prefix > 128 {
		return fail2(fmt.Errorf("--ipv6-prefix: want 1 to 128 bits (64: a subscriber's network; 128: the whole address), got %d", *ipv6Prefix))
	}
	identities.IPv6Prefix = *ipv6Prefix
	ln, err := net.Listen("tcp", hostPort(*listen))
	if err != nil {
		return fail2(fmt.Errorf("--listen: %w", err))
	}
	defer ln.Close()
	var adminLn net.Listener
	if *admin != "" {
		if adminLn, err = net.Listen("tcp", hostPort(*admin)); err != nil {
			return fail2(fmt.Errorf("--admin: %w", err))
		}
		defer adminLn.Close()
	}
	p, err := startGateway(ctx, gatewayOpts{upstream: up, config: *config, dataDir: *dataDir, identity: identities,
		follower: ff, embedded: *ff.cluster == "", startWait: *startWait, upstreamTimeout: *upTimeout}, log)
	if err != nil {
		return fail2(err)
	}
	var stopping atomic.Bool
	p.ready = stoppable(&stopping, p.ready)
	srv := proxyServer(p.gw)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn) // net/http's own lines
	conns := httpapi.ServeDraining(srv, ln)
	var adminSrv *http.Server
	if adminLn != nil {
		adminSrv = &http.Server{Handler: p.adminHandler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: srv.ErrorLog}
		go func() { _ = adminSrv.Serve(adminLn) }()
	}
	mode := "cluster"
	if p.member != nil {
		mode = "embedded"
	}
	log.Info("ringlimit gateway serving", "listen", ln.Addr().String(), "upstream", up.String(), "mode", mode)
	// Serving already, as the router command does: waited for before it
	// served, the first view held every connection for up to 10 s when
	// the cluster could not be reached.
	if p.ring != nil && !waitView(ctx, p.ring, 10*time.Second) && ctx.Err() == nil {
		log.Warn("no cluster view yet; limited routes answer 503 until one of --cluster answers GET /v1/cluster/view")
	}
	<-ctx.Done()
	log.Info("shutting down: draining connections, then in-flight requests (a second signal exits at once)", "drain_timeout", drainWait.String())
	sctx, cancel := context.WithTimeout(context.Background(), *drainWait)
	defer cancel()
	err = stopDraining(sctx, conns, &stopping, srv.Shutdown)
	if adminSrv != nil {
		_ = adminSrv.Shutdown(sctx)
	}
	if e := p.stopFn(sctx); err == nil {
		err = e
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err)
		return 1
	}
	log.Info("stopped") // as serve says it: the operator sees the stop end
	return 0
}
