// Package server wires one ringlimit member together: the node (Raft,
// bucket table, data-plane handler), the router, the data-plane server,
// and the HTTP API. cmd/ringlimit's serve is a thin shell over it, and
// tests start whole clusters in one process with it.
//
// A Server owns the listeners it is given and the goroutines it starts;
// Shutdown stops them all.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/router/rls"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
)

// Config is one member's configuration (the serve flags).
type Config struct {
	ID            string
	HTTPAdvertise string // host:port others reach the HTTP API at
	RaftAdvertise string
	PeerAdvertise string
	DataDir       string
	// Join lists HTTP addresses of members to join through when DataDir
	// is empty; none bootstraps. With Seed, this member heads the list
	// and Join holds the others: it asks them before it bootstraps
	// (node.Config.Seed).
	Join          []string
	Seed          bool
	SeedGrace     time.Duration // node.DefaultSeedGrace when 0
	RulesFile     string        // "" = none
	RulesInterval time.Duration
	// RulesFileHooks read RulesFile when it holds more than rules (an
	// embedded gateway's routes); the zero value reads rules alone.
	RulesFileHooks node.RulesFileHooks
	AdminToken     string
	ViewToken      string // reads GET /v1/cluster/view alone (httpapi.Config.ViewToken)
	DrainTimeout   time.Duration
	DeadAfter      time.Duration // failure detection (node default 5s)
	MaxKeys        int           // cap on bucket states this member tracks; 0 = none
	Ring           ring.Config
	Router         router.Config
	RaftTimeout    time.Duration
	Logger         *slog.Logger // the member's lines, Raft's included
	// RLS configures the Envoy rate-limit service served on
	// Listeners.GRPC (its Registerer and Logger are the member's).
	RLS rls.Options
	// Auth authenticates every Raft and data-plane connection, both ways
	// (cluster secret, mutual TLS); nil authenticates none (loopback or
	// --insecure).
	Auth *transport.Auth
}

// Connection caps of a member's listeners (see transport.ListenerConfig):
// Raft needs a few connections per member; the data plane one per router,
// gateway and client process.
const (
	raftMaxConns       = 128
	peerMaxConns       = 512
	maxHandshakes      = 128
	raftIdleTimeout    = 10 * time.Minute
	peerReadBufferSize = 16 << 10
)

// Listeners are the three sockets of a member, opened by the caller so
// that port conflicts fail before anything starts.
type Listeners struct {
	HTTP, Raft, Peer net.Listener
	GRPC             net.Listener // the Envoy RLS; nil = not served
}

// Server is a running member.
type Server struct {
	cfg      Config
	log      *slog.Logger
	Registry *prometheus.Registry
	Node     *node.Node
	Router   *router.Router
	pool     *transport.Pool
	fwd      forwarder
	peer     *transport.Server
	http     *httpapi.Server
	rls      *rls.Server // nil without Listeners.GRPC

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	removed  chan struct{}
	conflict chan error // one send at most (node.OnConflict fires once)
	left     chan error // one send at most (node.OnLeft fires once)
}

// names are the addresses a listener advertised at adv answers to in the
// cluster-secret handshake.
func names(adv string, ln net.Listener) []string {
	if bound := ln.Addr().String(); bound != adv {
		return []string{adv, bound}
	}
	return []string{adv}
}

// Start starts a member on the given listeners.
func Start(cfg Config, ls Listeners) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.RulesInterval == 0 {
		cfg.RulesInterval = time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, Registry: prometheus.NewRegistry(), removed: make(chan struct{}), conflict: make(chan error, 1), left: make(chan error, 1)}
	s.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.ctx, s.cancel = context.WithCancel(context.Background())

	if err := cfg.Auth.Validate(); err != nil {
		return nil, err
	}
	lerr := listenerErrorLog(cfg.Logger)
	// Each listener answers to its advertised address (what the others
	// dial) and the address it is bound to.
	raftLn, err := transport.NewListener(ls.Raft, transport.ListenerConfig{
		Auth: cfg.Auth, Names: names(cfg.RaftAdvertise, ls.Raft), MaxConns: raftMaxConns, MaxHandshakes: maxHandshakes, IdleTimeout: raftIdleTimeout, ErrorLog: lerr})
	if err != nil {
		return nil, err
	}
	peerLn, err := transport.NewListener(ls.Peer, transport.ListenerConfig{
		Auth: cfg.Auth, Names: names(cfg.PeerAdvertise, ls.Peer), MaxConns: peerMaxConns, MaxHandshakes: maxHandshakes, ErrorLog: lerr})
	if err != nil {
		_ = raftLn.Close()
		return nil, err
	}
	ls.Raft, ls.Peer = raftLn, peerLn
	registerListenerMetrics(s.Registry, map[string]*transport.Listener{"raft": raftLn, "peer": peerLn})
	ccfg := transport.DefaultClientConfig()
	ccfg.Dial = cfg.Auth.Dial
	s.pool = transport.NewPool(ccfg)
	fwd := newForwarder(cfg.AdminToken)
	s.fwd = fwd
	rcfg := cfg.Router
	rcfg.Registerer, rcfg.Logger, rcfg.Self = s.Registry, cfg.Logger, cfg.ID
	var removeOnce sync.Once
	// The router's local handler is the node, created just below; the
	// indirection lets the two be built in order.
	var local localHandler
	rt, err := router.New(rcfg, &local, s.pool)
	if err != nil {
		return nil, err
	}
	s.Router = rt
	if ls.GRPC != nil {
		o := cfg.RLS
		o.Registerer, o.Logger = s.Registry, cfg.Logger
		// The health service follows the member's /readyz; read from
		// Serve on, after s.Node is set below.
		o.Ready = func() error { return s.Node.Ready() }
		if s.rls, err = rls.New(o, rt); err != nil {
			rt.Close()
			_ = s.pool.Close()
			return nil, err
		}
	}
	n, err := node.Open(node.Config{
		ID: cfg.ID, HTTPAddr: cfg.HTTPAdvertise, RaftAdvertise: cfg.RaftAdvertise, PeerAddr: cfg.PeerAdvertise,
		DataDir: cfg.DataDir, Join: cfg.Join, Seed: cfg.Seed, SeedGrace: cfg.SeedGrace, Ring: cfg.Ring, RaftTimeout: cfg.RaftTimeout,
		Forward: fwd, Logger: cfg.Logger,
		Registerer: s.Registry,
		OnView:     rt.SetView,
		DataPlane:  s.pool,
		DeadAfter:  cfg.DeadAfter,
		MaxKeys:    cfg.MaxKeys,
		OnRemoved:  func() { removeOnce.Do(func() { close(s.removed) }) },
		OnConflict: func(err error) { s.conflict <- err },
		OnLeft:     func(err error) { s.left <- err },
		RaftDial:   cfg.Auth.Dial, Prober: prober{auth: cfg.Auth, fwd: fwd},
	}, ls.Raft)
	if err != nil {
		rt.Close()
		_ = s.pool.Close()
		_ = peerLn.Close()
		return nil, err
	}
	s.Node = n
	local.h = n

	pcfg := transport.DefaultServerConfig()
	pcfg.ReadBufferSize = peerReadBufferSize
	s.peer = transport.NewServer(pcfg, n)
	s.goServe("data plane", func() error { return s.peer.Serve(ls.Peer) }, transport.ErrServerClosed)

	h := httpapi.New(httpapi.Config{AdminToken: cfg.AdminToken, ViewToken: cfg.ViewToken, Logger: cfg.Logger, Registry: s.Registry}, rt, n)
	s.http = httpapi.NewServer(h)
	s.http.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn) // the HTTP server's (fasthttp's) own lines
	s.goServe("http", func() error { return s.http.Serve(ls.HTTP) }, http.ErrServerClosed)
	if s.rls != nil {
		s.goServe("envoy rls", func() error { return s.rls.Serve(ls.GRPC) }, nil)
	}

	if cfg.RulesFile != "" {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			n.WatchRulesFileWith(s.ctx, cfg.RulesFile, cfg.RulesInterval, cfg.RulesFileHooks)
		}()
	}
	return s, nil
}

// localHandler forwards to the node once it exists.
type localHandler struct{ h transport.Handler }

func (l *localHandler) HandleBatch(ctx context.Context, req *transport.BatchRequest, resp *transport.BatchResponse) {
	l.h.HandleBatch(ctx, req, resp)
}

// Prompt is the node's (transport.PromptHandler): the router waits for a
// local owner that is not prompt no longer than for a remote one.
func (l *localHandler) Prompt(req *transport.BatchRequest) bool {
	p, ok := l.h.(transport.PromptHandler)
	return ok && p.Prompt(req)
}

func (s *Server) goServe(name string, serve func() error, closed error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, closed) {
			s.log.Error("server stopped", "server", name, "err", err)
		}
	}()
}

// Removed is closed when this member has been removed from the cluster
// (ringlimit leave): its process should then exit.
func (s *Server) Removed() <-chan struct{} { return s.removed }

// Conflict receives the error once when a live member already holds this
// member's id: the process must stop with Abort (not Shutdown, which
// would mark that other member down) and exit.
func (s *Server) Conflict() <-chan error { return s.conflict }

// Left receives the error once when this member, restarted over its data
// dir, learns that it was removed from the cluster while it was away
// (node.Config.OnLeft): the process must stop with Abort (it is no
// member) and exit with the error, as when Start refuses a data dir whose
// log holds the removal.
func (s *Server) Left() <-chan error { return s.left }

// Abort stops this process's servers and Raft without telling the
// cluster anything (see Conflict).
func (s *Server) Abort(ctx context.Context) error { return s.stop(ctx, false) }

// Handler returns the HTTP API handler (for tests).
func (s *Server) Handler() http.Handler { return s.http.Handler }

// Shutdown stops taking new requests, drains those in flight (bounded by
// ctx), then stops the data plane and Raft. The member stays a member.
//
// First the member asks to be marked down (bounded by markDownTimeout),
// so the other members take its partitions while it is away.
func (s *Server) Shutdown(ctx context.Context) error { return s.stop(ctx, true) }

// overrunClose bounds closing the listeners and connections of a stop
// whose hand-offs and bucket save took its whole deadline.
const overrunClose = time.Second

// connDrainMax bounds how long a graceful stop waits for its HTTP
// clients' connections to close once its partitions are handed off.
const connDrainMax = 2 * time.Second

// stop stops the member; without markDown it vanishes as a crash would
// (tests use that to make an owner unreachable).
func (s *Server) stop(ctx context.Context, markDown bool) error {
	s.cancel()
	var lost error // bucket state that could not be saved: the stop fails
	var peerErr error
	if markDown {
		dctx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
		if err := s.Node.StopGracefully(dctx); errors.Is(err, node.ErrBucketsNotSaved) {
			lost = err // logged at ERROR by the node; was a WARN saying the state was kept
		} else if err != nil {
			// The partitions this member could not hand off are in its
			// bucket file (StopGracefully), if it has a data dir; the
			// cluster, which may still list it active, serves them from
			// their backups once it is marked dead.
			where := "kept in its data dir (buckets.rlsnap) for its next start, and served from backup copies"
			if s.cfg.DataDir == "" {
				where = "served from backup copies"
			}
			s.log.Warn("graceful stop incomplete: the partitions not handed off are "+where+" if the cluster marks this member dead before it returns", "err", err)
		}
		cancel()
		if ctx.Err() != nil {
			// The hand-offs and the bucket save took the whole deadline
			// (a large table on a slow disk): what they kept is kept.
			// Close the rest at once rather than fail the stop for it,
			// under a deadline of its own. Was: every shutdown below
			// got the spent one, failed with it after "bucket state
			// saved", and serve exited 1.
			s.log.Warn("the graceful stop took all of its deadline before its connections drained (hand-offs, or saving the bucket state): closing them now; raise --drain-timeout, and the orchestrator's grace period past it",
				"drain_timeout", s.cfg.DrainTimeout.String())
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), overrunClose)
			defer cancel()
		}
		// Its data plane closes first: it owns nothing now, and a router
		// whose view still names it gets a refused dial, which it retries
		// under a newer view, not an owner's refusal that its rules'
		// failure modes answer. Then its HTTP connections drain: the port
		// closes, and each answer closes its connection, so clients
		// reconnect to another member after an answer rather than have
		// the port close under a request (httpapi.Server.Drain); until
		// none is open or none has sent for httpapi.DrainQuiet, at most
		// half of what is left, and 2 s.
		peerErr = s.peer.Shutdown(ctx)
		s.http.Drain()
		httpapi.WaitDrained(ctx, s.http, connDrainMax)
	}
	err := s.http.Shutdown(ctx)
	if s.rls != nil {
		if e := s.rls.Shutdown(ctx); err == nil {
			err = e
		}
	}
	if !markDown { // closed already, before the drain
		peerErr = s.peer.Shutdown(ctx)
	}
	if err == nil && peerErr != nil && !errors.Is(peerErr, transport.ErrServerClosed) {
		err = peerErr
	}
	s.Router.Close()
	if e := s.Node.Close(); err == nil {
		err = e
	}
	if e := s.pool.Close(); err == nil {
		err = e
	}
	s.fwd.hc.CloseIdleConnections()
	s.wg.Wait()
	if lost != nil {
		return errors.Join(lost, err)
	}
	return err
}

// forwarder carries writes to the leader's HTTP API, over one HTTP
// client (one connection pool) for the member's lifetime.
type forwarder struct {
	token string
	hc    *http.Client
}

func newForwarder(token string) forwarder {
	// Member to member, never through HTTP_PROXY: the admin token would
	// travel to the proxy with every forwarded write and join.
	tr := client.NewTransport(4)
	tr.Proxy = nil
	return forwarder{token: token, hc: &http.Client{Transport: tr}}
}

// options are what every client of the forwarder has: the admin token
// and the shared connection pool.
func (f forwarder) options() []client.Option {
	return []client.Option{client.WithAdminToken(f.token), client.WithHTTPClient(f.hc)}
}

// client is a client of the leader at addr whose writes are marked
// forwarded.
func (f forwarder) client(addr string) *client.Client {
	return client.New(addr, append(f.options(), client.AsForwarder())...)
}

func (f forwarder) Join(ctx context.Context, leader string, req api.JoinRequest) (uint64, error) {
	epoch, err := f.client(leader).JoinEpoch(ctx, req)
	return epoch, wrapRemote("leader", err)
}

// JoinVia is not marked forwarded: the member forwards it to its leader.
func (f forwarder) JoinVia(ctx context.Context, member string, req api.JoinRequest) (uint64, error) {
	epoch, err := client.New(member, f.options()...).JoinEpoch(ctx, req)
	return epoch, wrapRemote("member "+member, err)
}

// InCluster is not marked forwarded: it is a read, answered by the
// member asked.
func (f forwarder) InCluster(ctx context.Context, member string) (bool, error) {
	st, err := client.New(member, f.options()...).Seed(ctx)
	return st.InCluster, wrapRemote("member "+member, err)
}

func (f forwarder) Leave(ctx context.Context, leader, id string) error {
	return wrapRemote("leader", f.client(leader).Leave(ctx, id))
}

func (f forwarder) SetState(ctx context.Context, leader, id, state string) error {
	return wrapRemote("leader", f.client(leader).SetState(ctx, id, state))
}

func (f forwarder) PutRules(ctx context.Context, leader string, written []limiter.Rule) ([]limiter.Rule, uint64, error) {
	doc, err := rules.MarshalCompact(written) // as short as JSON can say it: see MarshalCompact
	if err != nil {
		return nil, 0, err
	}
	got, err := f.client(leader).PutRulesAnswer(ctx, doc, "application/json")
	if err != nil {
		return nil, 0, wrapRemote("leader", err)
	}
	set, err := router.RulesFromAPI(got.Rules) // not as a document: see RulesFromAPI
	if err != nil {
		return nil, 0, fmt.Errorf("the leader's answer: %w", err)
	}
	return set, got.RulesVersion, nil
}

// ClusterOf reads the view of the member at addr (node.ClusterReader):
// GET /v1/cluster, and GET /v1/cluster/view for the cluster's seed (an
// admin call, with this member's admin token, as its joins are).
func (f forwarder) ClusterOf(ctx context.Context, addr string) (node.RemoteCluster, error) {
	c := client.New(addr, f.options()...)
	cl, err := c.Cluster(ctx)
	if err != nil {
		return node.RemoteCluster{}, wrapRemote("member "+addr, err)
	}
	v, err := c.RouterView(ctx)
	if err != nil {
		return node.RemoteCluster{}, wrapRemote("member "+addr, err)
	}
	seed, err := strconv.ParseUint(v.Seed, 16, 64)
	if err != nil {
		return node.RemoteCluster{}, fmt.Errorf("%w: member %s: seed %q: %w", api.ErrUnavailable, addr, v.Seed, err)
	}
	r := node.RemoteCluster{Leader: cl.Leader, Epoch: cl.Epoch, Seed: seed, RaftOnly: cl.RaftOnly}
	for _, m := range cl.Members {
		r.Members = append(r.Members, m.ID)
		if m.HTTP == addr {
			r.ID = m.ID
		}
	}
	return r, nil
}

// wrapRemote maps the HTTP answer of who (the leader, or the member a
// join went through) back onto this side's sentinels.
func wrapRemote(who string, err error) error {
	var e *api.Error
	if !errors.As(err, &e) {
		if err != nil {
			return fmt.Errorf("%w: %s unreachable: %w", api.ErrUnavailable, who, err)
		}
		return nil
	}
	switch e.Status {
	case http.StatusBadRequest:
		if e.Code == api.CodeInvalidRules {
			return fmt.Errorf("%w: %s", rules.ErrInvalid, e.Message)
		}
		return fmt.Errorf("%w: %s", api.ErrBadRequest, e.Message)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %s", api.ErrNotFound, e.Message)
	case http.StatusConflict:
		if e.Code == api.CodeLeft {
			return fmt.Errorf("%w: %s", api.ErrLeft, e.Message)
		}
		return fmt.Errorf("%w: %s", api.ErrConflict, e.Message)
	}
	if e.Code == api.CodeUnavailable {
		return fmt.Errorf("%w: %s: %s", api.ErrUnavailable, who, e.Message)
	}
	return fmt.Errorf("%w: %s answered %w", api.ErrUnavailable, who, e)
}

// prober reaches joining members for the leader: their Raft and data-plane
// addresses with this member's authentication, their /readyz over HTTP.
type prober struct {
	auth *transport.Auth
	fwd  forwarder
}

func (p prober) Reach(ctx context.Context, addr string) error {
	c, err := p.auth.Dial(ctx, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func (p prober) Ready(ctx context.Context, httpAddr string) error {
	return p.fwd.client(httpAddr).Ready(ctx)
}

const refusedHelp = "Inter-node connections closed unused: reason cap (the connection or handshake cap was reached: a new connection refused, or one still authenticating closed to make room for it), " +
	"auth (failed or timed out authenticating, with --cluster-secret or TLS) or idle (no authentication configured: no first byte within 5s). " +
	"A connection its peer closes before a byte, without authentication, is not counted (a joining member's address is probed so)."

// registerListenerMetrics exports what the guarded listeners let in and
// turned away.
func registerListenerMetrics(reg *prometheus.Registry, ls map[string]*transport.Listener) {
	for name, l := range ls {
		labels := prometheus.Labels{"listener": name}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_listener_connections", ConstLabels: labels,
				Help: "Inter-node connections open (authenticating or authenticated)."},
				func() float64 { return float64(l.Stats().Open) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_listener_accepted_total", ConstLabels: labels,
				Help: "Inter-node connections that authenticated (or, without authentication, sent a first byte)."},
				func() float64 { return float64(l.Stats().Accepted) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_listener_refused_total", ConstLabels: prometheus.Labels{"listener": name, "reason": "cap"},
				Help: refusedHelp},
				func() float64 { return float64(l.Stats().OverCap) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_listener_refused_total", ConstLabels: prometheus.Labels{"listener": name, "reason": "auth"},
				Help: refusedHelp},
				func() float64 { return float64(l.Stats().AuthFailed) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_listener_refused_total", ConstLabels: prometheus.Labels{"listener": name, "reason": "idle"},
				Help: refusedHelp},
				func() float64 { return float64(l.Stats().Idle) }),
		)
	}
}

// refusedWarnEvery spaces the WARN lines of inter-node connections
// refused for want of authentication.
const refusedWarnEvery = 10 * time.Second

// listenerErrorLog logs what the inter-node listeners refuse: closings at
// a cap (at most one a second, the listener's own pace) and connections
// that did not authenticate, at WARN, at most one per refusedWarnEvery;
// other refusals (a peer silent past the handshake timeout) at DEBUG.
// Every refusal is counted in ringlimit_listener_refused_total.
func listenerErrorLog(log *slog.Logger) func(error) {
	authWarn := &rate.Sometimes{Interval: refusedWarnEvery}
	return func(err error) {
		switch {
		case errors.Is(err, transport.ErrCapReached):
			// A flood, or caps too low, is seen at the default level,
			// not only in the metric.
			log.Warn("inter-node connections closed at a cap", "err", err)
		case errors.Is(err, transport.ErrAuth):
			// A router, gateway or member given no cluster secret or
			// certificate (or another one) answers its checks by their
			// failure mode: say so where its operator looks.
			authWarn.Do(func() {
				log.Warn("refused an inter-node connection that did not authenticate (a router, gateway or member without this cluster's secret or certificate, or a stranger); each refusal counts in ringlimit_listener_refused_total{reason=\"auth\"}", "err", err)
			})
		default:
			log.Debug("inter-node connection refused", "err", err)
		}
	}
}
