package rls

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Options configure a Server. The zero value serves an empty config.
type Options struct {
	// ConfigPath is an envoyproxy/ratelimit YAML file, or a directory
	// whose *.yaml and *.yml files (not hidden, not in subdirectories)
	// are read in name order. "" = no config: every descriptor is OK.
	ConfigPath string
	// Interval is how often ConfigPath is polled for changes (1s);
	// negative = never.
	Interval time.Duration
	// Headers adds x-ratelimit-* response headers for Envoy.
	Headers bool
	// Registerer receives the metrics; nil = not registered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Ready is the readiness of the process that serves the RLS (what
	// its /readyz answers): nil when it can decide checks, else why not.
	// The health service says SERVING, for "" and for the RLS service,
	// only while it returns nil: it is read when Serve starts and every
	// readyPoll after (NOT_SERVING before). nil = always ready.
	Ready func() error
}

// readyPoll is how often Options.Ready is read into the health status.
// A poll rather than an update on events, because readiness changes
// with no event to hook: a router's view goes stale as time passes
// without a read, a member loses its Raft leader inside Raft. A health
// check then costs a map read whatever the rate (every Envoy checks
// every host), Ready (a member's reads Raft's state) runs once a second
// rather than per check, and a change shows within a second: well within
// Envoy's usual health-check intervals and the 10 s a router's view
// takes to go stale.
const readyPoll = time.Second

// Server is the gRPC RateLimitService with its config loader. Create it
// with New, run it with Serve, stop it with Shutdown.
type Server struct {
	opts   Options
	log    *slog.Logger
	svc    *Service
	m      *metrics
	gs     *grpc.Server
	health *health.Server // grpc.health.v1: SERVING while Options.Ready, until Shutdown

	mu      sync.Mutex // guards tried, sig and lastErr: one load at a time
	tried   bool
	sig     [sha256.Size]byte // of the files last tried
	lastErr error             // why they were refused; nil = in force

	ctx    context.Context
	cancel context.CancelFunc
	// life orders Serve's start of the config poll with Shutdown's wait
	// for it: a Serve that starts late (after Shutdown) starts none.
	life    sync.Mutex
	stopped bool // guarded by life
	wg      sync.WaitGroup
}

// New loads the config (a config that does not load is an error here:
// at start there is no previous one to keep) and returns a server that
// decides with checker.
func New(opts Options, checker Checker) (*Server, error) {
	if opts.Interval == 0 {
		opts.Interval = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, m: m, svc: NewService(checker, opts.Headers, m)}
	s.svc.log = opts.Logger
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.Reload(); err != nil {
		s.cancel()
		return nil, err
	}
	// Bounded: a call is at most 1 MiB, a connection (an Envoy) has at
	// most 1024 calls in flight. The codec takes descriptor values that
	// are not UTF-8, as Envoy sends them (see codec).
	s.gs = grpc.NewServer(grpc.MaxRecvMsgSize(1<<20), grpc.MaxConcurrentStreams(1024), grpc.ForceServerCodecV2(newCodec()))
	rlspb.RegisterRateLimitServiceServer(s.gs, s.svc)
	// gRPC's health service, as envoyproxy/ratelimit registers it, for
	// Envoy's health checks of the rate-limit cluster: the server ("")
	// and the RLS service are SERVING while the process is ready
	// (Options.Ready, followed from Serve on), until Shutdown begins.
	// Was: SERVING whatever the readiness, so Envoy kept a router with no
	// view (every call Unavailable) or a member with no leader in
	// rotation.
	s.health = health.NewServer()
	if opts.Ready != nil {
		s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	} else {
		s.setHealth(healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s.gs, endingWatches{s.health, s.ctx})
	return s, nil
}

// Service returns the service (tests, and serving it on another gRPC server).
func (s *Server) Service() *Service { return s.svc }

// Serve polls the config and serves gRPC on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.life.Lock()
	if !s.stopped && s.opts.ConfigPath != "" && s.opts.Interval > 0 {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.watch(s.ctx) }()
	}
	if !s.stopped && s.opts.Ready != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.followReady(s.ctx) }()
	}
	s.life.Unlock()
	err := s.gs.Serve(ln) // after Shutdown: ErrServerStopped at once
	if err == grpc.ErrServerStopped {
		err = nil
	}
	return err
}

// setHealth sets the health status of the server ("") and of the RLS
// service (after the health server's Shutdown, a no-op).
func (s *Server) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, st)
}

// followReady sets the health status from Options.Ready at once and
// every readyPoll until ctx ends. A change is logged at info (with the
// reason when not ready): what made the process unready logs its own
// warnings (failed view reads, Raft's), and a member's graceful stop,
// which makes it unready first, is no cause for one.
func (s *Server) followReady(ctx context.Context) {
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_NOT_SERVING // as New set it
	for {
		switch err := s.opts.Ready(); {
		case err == nil && last != healthpb.HealthCheckResponse_SERVING:
			last = healthpb.HealthCheckResponse_SERVING
			s.setHealth(last)
			s.log.Info("envoy rls: health SERVING (ready)")
		case err != nil && last != healthpb.HealthCheckResponse_NOT_SERVING:
			last = healthpb.HealthCheckResponse_NOT_SERVING
			s.setHealth(last)
			s.log.Info("envoy rls: health NOT_SERVING (not ready)", "reason", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Shutdown stops the config poll, lets the calls in flight finish
// (bounded by ctx) and stops the gRPC server.
func (s *Server) Shutdown(ctx context.Context) error {
	s.life.Lock()
	s.stopped = true
	s.life.Unlock()
	s.health.Shutdown() // NOT_SERVING: health checks move Envoy on first
	s.cancel()          // ends the health watches, which GracefulStop would wait for
	done := make(chan struct{})
	go func() { s.gs.GracefulStop(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.gs.Stop()
		<-done
		err = ctx.Err()
	}
	s.wg.Wait()
	return err
}

// watch reloads the config every Interval until ctx is done. Changed
// content is loaded once a second read, settleAfter later, finds the
// same, so that a file caught in the middle of its write (half written
// and still valid YAML: some limits missing) is not put in force, as
// the rules file's watcher does.
func (s *Server) watch(ctx context.Context) {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	settle := min(100*time.Millisecond, s.opts.Interval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, sig, err := readConfig(s.opts.ConfigPath)
		if err != nil {
			_ = s.reload(nil) // logged and counted, once, by reload
			continue
		}
		s.mu.Lock()
		changed := !s.tried || sig != s.sig
		s.mu.Unlock()
		if !changed {
			continue // the config in force, or the refused one, as last read
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
		_ = s.reload(&sig) // still being written: tried again at the next tick
	}
}

// Reload reads the config and, when its content changed, parses it and
// puts it in force. A config that does not load is refused: the one in
// force stays, the error is returned, logged once and counted.
func (s *Server) Reload() error { return s.reload(nil) }

// errUnsettled: the config changed again between two reads.
var errUnsettled = errors.New("rls config: still being written")

// reload is Reload; with want, only content of that signature is loaded
// (other content returns errUnsettled and changes nothing).
func (s *Server) reload(want *[sha256.Size]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	files, sig, err := readConfig(s.opts.ConfigPath)
	if err == nil && s.tried && sig == s.sig {
		return s.lastErr // nothing changed since the last attempt
	}
	if err == nil && want != nil && sig != *want {
		return errUnsettled
	}
	var c *Config
	if err == nil {
		c, err = ParseConfig(files...)
	}
	s.tried, s.sig = true, sig
	if err != nil {
		s.m.configOK.Set(0)
		if s.lastErr == nil || err.Error() != s.lastErr.Error() {
			s.m.reloads.WithLabelValues("error").Inc()
			s.log.Error("envoy config refused; the config in force stays", "err", err)
		}
		s.lastErr = err
		return err
	}
	s.lastErr = nil
	s.svc.SetConfig(c)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.m.configOK.Set(1)
	s.m.limits.Set(float64(c.Limits()))
	s.log.Info("envoy config loaded", "path", s.opts.ConfigPath, "domains", c.Domains(), "limits", c.Limits())
	if c.Domains() == 0 {
		// A directory of another layout (envoyproxy/ratelimit's config/
		// subdirectory, say) loads as no config at all.
		s.log.Warn("envoy config holds no domain: every call is answered OK (a directory is read for *.yaml and *.yml files, not its subdirectories)", "path", s.opts.ConfigPath)
	} else if empty := c.EmptyDomains(); len(empty) > 0 {
		// A file cut short by a writer that stalled (its domain and the
		// first descriptor's key, no rate_limit yet) parses, and two
		// reads agree on it: it was loaded with 0 limits in silence, and
		// every call answered OK (a helper attacking the RLS door).
		s.log.Warn("envoy config: domains with no rate_limit in any descriptor; their calls are all answered OK (a file cut short?)", "path", s.opts.ConfigPath, "domains", empty)
	}
	return nil
}

// readConfig reads the config files at path and returns them with a
// signature of their names and contents. "" is no file.
func readConfig(path string) ([]File, [sha256.Size]byte, error) {
	var sig [sha256.Size]byte
	if path == "" {
		return nil, sig, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, sig, fmt.Errorf("rls config: %w", err)
	}
	names := []string{path}
	if fi.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, sig, fmt.Errorf("rls config: %w", err)
		}
		names = names[:0]
		for _, e := range ents {
			n := e.Name()
			if ext := strings.ToLower(filepath.Ext(n)); strings.HasPrefix(n, ".") || ext != ".yaml" && ext != ".yml" {
				continue // editors' and Kubernetes' (..data) entries
			}
			names = append(names, filepath.Join(path, n))
		}
		slices.Sort(names)
		if len(names) > MaxFiles {
			return nil, sig, &ConfigError{File: path, Msg: fmt.Sprintf("%d config files, over the limit of %d", len(names), MaxFiles)}
		}
	}
	h := sha256.New()
	var files []File
	for _, n := range names {
		data, err := readBounded(n)
		if err != nil {
			return nil, sig, err
		}
		if data == nil { // a subdirectory named *.yaml
			continue
		}
		files = append(files, File{Name: n, Data: data})
		var l [binary.MaxVarintLen64]byte
		h.Write(l[:binary.PutUvarint(l[:], uint64(len(n)))])
		h.Write([]byte(n))
		h.Write(l[:binary.PutUvarint(l[:], uint64(len(data)))])
		h.Write(data)
	}
	h.Sum(sig[:0])
	return files, sig, nil
}

// readBounded reads a regular file of at most MaxFileSize bytes; nil
// (and no error) for a directory.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rls config: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("rls config: %w", err)
	}
	if fi.IsDir() {
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rls config: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, &ConfigError{File: name, Msg: fmt.Sprintf("over the limit of %d bytes", MaxFileSize)}
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// LoadConfig reads and parses the config at path (a file or a directory,
// as Options.ConfigPath), for a command to refuse a bad one before it
// starts anything.
func LoadConfig(path string) (*Config, error) {
	files, _, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(files...)
}

// endingWatches is the health service with its Watch streams ended when
// ctx is (Shutdown): a watch never ends by itself, and GracefulStop waits
// for every stream.
type endingWatches struct {
	*health.Server
	ctx context.Context
}

func (h endingWatches) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	return h.Server.Watch(in, watchStream{stream, ctx})
}

// watchStream is a Watch stream whose context ends with the server's.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
