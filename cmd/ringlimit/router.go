package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/gctune"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/router/httpapi"
	"github.com/ringlimit/ringlimit/router/rls"
	"github.com/ringlimit/ringlimit/transport"
)

// followerFlags are the flags of a process that follows the cluster
// without being a member (router, gateway --cluster).
type followerFlags struct {
	cluster, adminToken *string
	refresh, fwdTimeout *time.Duration
	linger              *time.Duration
	maxBatch            *int
	sec                 securityFlags // dialing the owners' data plane
}

func addFollowerFlags(fs interface {
	String(string, string, string) *string
	Duration(string, time.Duration, string) *time.Duration
	Int(string, int, string) *int
}) followerFlags {
	d := router.DefaultConfig()
	return followerFlags{
		cluster:    fs.String("cluster", "", "comma-separated HTTP addresses of cluster members (any of them; fails over between them)"),
		adminToken: fs.String("admin-token", "", "bearer token for reading the cluster view from the members: their --view-token (or their --admin-token)"),
		refresh:    fs.Duration("refresh", time.Second, "how often the cluster view is re-read (and at once on a NOT_OWNER answer)"),
		fwdTimeout: fs.Duration("forward-timeout", d.Timeout, "how long an owner may take before the rule's failure mode answers"),
		linger:     fs.Duration("linger", d.Linger, "how long a batch to an owner waits to fill"),
		maxBatch:   fs.Int("max-batch", d.MaxBatch, "most checks in one batch to an owner"),
		sec: securityFlags{
			secret:   fs.String("cluster-secret", "", "file holding the cluster's shared secret: data-plane connections to the owners prove it"),
			cert:     fs.String("tls-cert", "", "certificate (PEM) for mutual TLS to the owners' data plane"),
			key:      fs.String("tls-key", "", "the key of --tls-cert (PEM)"),
			ca:       fs.String("tls-ca", "", "the cluster CA (PEM): owners must present a certificate it signed"),
			insecure: new(bool), // a dialer exposes nothing
		},
	}
}

func (f followerFlags) members() []string {
	var out []string
	for a := range strings.SplitSeq(*f.cluster, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, hostPort(a))
		}
	}
	return out
}

// follow starts a Ring following the cluster, with its router's metrics
// in reg.
func (f followerFlags) follow(reg prometheus.Registerer, log *slog.Logger) (*client.Ring, error) {
	ms := f.members()
	if len(ms) == 0 {
		return nil, errors.New("--cluster: at least one member address is required")
	}
	if *f.refresh <= 0 {
		return nil, fmt.Errorf("--refresh: must be > 0, got %v", *f.refresh)
	}
	if err := checkToken(*f.adminToken); err != nil {
		return nil, fmt.Errorf("--admin-token: %w", err)
	}
	auth, err := f.sec.auth(log)
	if err != nil {
		return nil, err
	}
	dp := transport.DefaultClientConfig()
	dp.Dial = auth.Dial // the owners authenticate every data-plane connection
	return client.NewRing(client.RingConfig{
		Members: ms, AdminToken: *f.adminToken, Refresh: *f.refresh, DataPlane: &dp,
		Router: router.Config{Timeout: *f.fwdTimeout, Linger: *f.linger, MaxBatch: *f.maxBatch, Registerer: reg, Logger: log},
	})
}

// waitView waits up to d for rc's first view; false when none came.
func waitView(ctx context.Context, rc *client.Ring, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !rc.Ready() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// newLogger returns the JSON logger of a long-running command.
func newLogger(level string, stderr io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// routerProc is a running `ringlimit router`.
type routerProc struct {
	reg      *prometheus.Registry
	ring     *client.Ring
	ready    func() error // ringReadiness(ring) until stopping: /readyz
	stopping atomic.Bool  // SIGTERM came: not ready, draining (stop)
	srv      *httpapi.Server
	done     chan error
	rls      *rls.Server // the Envoy RLS on --grpc; nil without it
}

// routerHandler is a router's HTTP API: the front door of rc's router,
// whose rules are its view's and whose readiness is ready.
func routerHandler(rc *client.Ring, ready func() error, reg *prometheus.Registry, log *slog.Logger) http.Handler {
	rt := rc.Router()
	// Its Ring's readiness (ringReadiness). Was RouterFront's own, ready
	// for as long as it had any view, so a router whose members had all
	// stopped answering it stayed ready and routed by its old ring.
	return httpapi.NewFront(httpapi.Config{Logger: log, Registry: reg}, rt, httpapi.RouterFront(rt, ready))
}

// ringReadiness is the readiness of a process that follows the cluster
// through rc (router, gateway --cluster): rc.Ready (a view, read within
// the last 10 refreshes), saying why not.
func ringReadiness(rc *client.Ring) func() error {
	rt := rc.Router()
	return followReadiness(rc.Ready, func() bool { return rt.View() != nil }, rt.ViewAge)
}

// startRouter serves the check front door on ln for a Ring following the
// cluster.
func startRouter(ff followerFlags, ln net.Listener, log *slog.Logger) (*routerProc, error) {
	reg := newRegistry()
	rc, err := ff.follow(reg, log)
	if err != nil {
		return nil, err
	}
	p := &routerProc{reg: reg, ring: rc, done: make(chan error, 1)}
	p.ready = stoppable(&p.stopping, ringReadiness(rc))
	p.srv = httpapi.NewServer(routerHandler(rc, p.ready, reg, log))
	p.srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn) // the HTTP server's (fasthttp's) own lines
	go func() { p.done <- p.srv.Serve(ln) }()
	return p, nil
}

// stop drains the router's connections, then shuts it down, within ctx
// (stopDraining).
func (p *routerProc) stop(ctx context.Context) error {
	return stopDraining(ctx, p.srv, &p.stopping, p.shutdown)
}

func (p *routerProc) shutdown(ctx context.Context) error {
	err := p.srv.Shutdown(ctx)
	<-p.done
	if p.rls != nil {
		if e := p.rls.Shutdown(ctx); err == nil {
			err = e
		}
	}
	if e := p.ring.Close(); err == nil {
		err = e
	}
	return err
}

// runRouter runs a stateless router until ctx is done.
func runRouter(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("router", stderr)
	httpAddr := fs.String("http", "127.0.0.1:8070", "HTTP listen address (POST /v1/check, GET /v1/rules, health, metrics)")
	ff := addFollowerFlags(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	drainTimeout := drainFlag(fs)
	envoy := addEnvoyFlags(fs)
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	if err := envoy.check(); err != nil {
		return fail(stderr, "router", err)
	}
	if err := checkDrain(*drainTimeout); err != nil {
		return fail(stderr, "router", err)
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		return fail(stderr, "router", err)
	}
	logs.Use(log.Handler()) // gRPC's lines too
	if len(ff.members()) == 0 {
		return fail(stderr, "router", errors.New("--cluster: at least one member address is required"))
	}
	if soft := gctune.SoftLimit(getenv, ""); soft > 0 {
		log.Debug("soft memory limit from the cgroup", "soft_memory_limit", soft)
	}
	ln, err := net.Listen("tcp", hostPort(*httpAddr))
	if err != nil {
		return fail(stderr, "router", fmt.Errorf("--http: %w", err))
	}
	grpcLn, err := envoy.listen()
	if err != nil {
		ln.Close()
		return fail(stderr, "router", err)
	}
	p, err := startRouter(ff, ln, log)
	if err == nil {
		p.rls, err = startEnvoy(envoy, grpcLn, p.ring.Router(), p.ready, p.reg, log)
		if err != nil {
			_ = p.shutdown(context.Background())
		}
	}
	if err != nil {
		ln.Close()
		if grpcLn != nil {
			grpcLn.Close()
		}
		return fail(stderr, "router", err)
	}
	log.Info("ringlimit router serving", "http", ln.Addr().String(), "grpc", *envoy.grpc, "cluster", ff.members())
	if !waitView(ctx, p.ring, 10*time.Second) && ctx.Err() == nil {
		log.Warn("no cluster view yet; /readyz answers 503 and checks 503 until one of --cluster answers GET /v1/cluster/view")
	}
	<-ctx.Done()
	log.Info("shutting down: draining connections, then in-flight requests (a second signal exits at once)", "drain_timeout", drainTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	defer cancel()
	if err := p.stop(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err)
		return 1
	}
	log.Info("stopped") // as serve says it: the operator sees the stop end
	return 0
}

// checkToken refuses an admin token that no request could present: a
// bearer token is read without the white space around it, so a token
// with a space, a tab or a newline in it (an env value or a file with a
// trailing newline) locked every admin request out, forwarded writes
// included.
func checkToken(t string) error {
	if strings.ContainsFunc(t, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return errors.New("contains white space or a control character (a trailing newline?): no bearer token could match it")
	}
	return nil
}
