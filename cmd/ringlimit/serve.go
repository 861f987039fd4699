package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/internal/gctune"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/server"
)

// runServe runs a cluster member until ctx is done (SIGINT/SIGTERM) or
// the member is removed from the cluster.
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve", stderr)
	hostname, _ := os.Hostname()
	if hostname == "" {
		hostname = "ringlimit"
	}
	var (
		id           = fs.String("id", "", "node id, unique in the cluster (default: the id the data dir records, else the host name, "+strconv.Quote(hostname)+")")
		httpAddr     = fs.String("http", "127.0.0.1:8080", "HTTP listen address (API, metrics, health)")
		raftAddr     = fs.String("raft", "127.0.0.1:8081", "Raft listen/advertise address")
		peerAddr     = fs.String("peer", "127.0.0.1:8082", "data-plane (check forwarding) listen/advertise address")
		advHost      = fs.String("advertise-host", "", "host other nodes use to reach this one, when it differs from the listen host")
		dataDir      = fs.String("data-dir", "./ringlimit-data", "Raft log, stable store and snapshots")
		join         = fs.String("join", "", "comma-separated HTTP addresses of members; empty with an empty data dir bootstraps a new cluster; a list headed by this node's own address makes it the seed, which asks the others before it bootstraps")
		rulesFile    = fs.String("rules", "", "rules YAML file, applied through Raft whenever it changes")
		adminToken   = fs.String("admin-token", "", "bearer token required by admin endpoints (empty: admin only from loopback)")
		viewToken    = fs.String("view-token", "", "bearer token that reads the cluster view alone (GET /v1/cluster/view), for routers, gateways and Go clients; the admin token reads it too")
		drainTimeout = fs.Duration("drain-timeout", 10*time.Second, "how long SIGTERM may spend handing off partitions and draining")
		deadAfter    = fs.Duration("dead-after", 5*time.Second, "how long a member may be unreachable before the leader marks it dead")
		raftTimeout  = fs.Duration("raft-timeout", time.Second, "Raft's heartbeat and election timeout; raise it (with --dead-after) where members are starved of CPU or the network is slow, and give every member the same")
		maxKeys      = fs.Int("max-keys", 20_000_000, "most bucket states this member tracks as an owner (~24 B each); at the cap, checks of new keys are answered by their rule's failure mode; 0 = no cap")
		partitions   = fs.Int("partitions", ring.DefaultConfig().Partitions, "partition count of a new cluster (fixed once bootstrapped)")
		linger       = fs.Duration("linger", router.DefaultConfig().Linger, "how long a forwarded batch waits to fill")
		maxBatch     = fs.Int("max-batch", router.DefaultConfig().MaxBatch, "most checks in one forwarded batch")
		fwdTimeout   = fs.Duration("forward-timeout", router.DefaultConfig().Timeout, "how long an owner may take before the rule's failure mode answers")
		logLevel     = fs.String("log-level", "info", "debug, info, warn or error")
		sec          = addSecurityFlags(fs)
	)
	envoy := addEnvoyFlags(fs)
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "ringlimit serve: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	logs.Use(log.Handler()) // gRPC's and bbolt's lines too
	fail := func(format string, a ...any) int {
		log.Error(fmt.Sprintf(format, a...))
		return 2
	}
	// Every flag value is checked here, before anything starts, so that
	// a bad one exits 2 as a usage error (API.md): the checks that
	// server.Start makes again (node, router) exited 1, as if a start
	// with good flags had failed (--dead-after 100ms, --linger 2s).
	// Without --id (or RINGLIMIT_ID) the id is the one the data dir
	// records, if any, not the hostname: a container recreated over its
	// volume has a new hostname (node.RecordedID).
	idGiven := false
	fs.Visit(func(f *flag.Flag) { idGiven = idGiven || f.Name == "id" })
	if !idGiven {
		*id = hostname
		if *dataDir != "" {
			rec, err := node.RecordedID(*dataDir)
			if err != nil {
				log.Error(fmt.Sprintf("starting: %v", err))
				return 1 // a data dir refused, as server.Start's refusals
			}
			if rec != "" && rec != hostname {
				log.Info("--id not given: the member id the data dir records, not the host name", "id", rec, "hostname", hostname, "data_dir", *dataDir)
				*id = rec
			}
		}
	}
	rcfg := router.Config{Linger: *linger, MaxBatch: *maxBatch, Timeout: *fwdTimeout}
	switch {
	case *id == "":
		return fail("--id: must not be empty")
	case *dataDir == "":
		return fail("--data-dir: must not be empty")
	case *drainTimeout <= 0:
		return fail("--drain-timeout: must be > 0, got %v", *drainTimeout)
	case *deadAfter <= 0:
		return fail("--dead-after: must be > 0, got %v", *deadAfter)
	case *raftTimeout < minRaftTimeout:
		return fail("--raft-timeout: must be ≥ %v, got %v", minRaftTimeout, *raftTimeout)
	case *deadAfter < *raftTimeout:
		return fail("--dead-after: must be ≥ --raft-timeout (%v): the leader's lease, dead-after/4, counts Raft heartbeats; got %v", *raftTimeout, *deadAfter)
	case *maxKeys < 0:
		return fail("--max-keys: must be ≥ 0 (0: no cap), got %d", *maxKeys)
	}
	if err := rcfg.Validate(); err != nil {
		return fail("--linger, --max-batch or --forward-timeout: %v", err)
	}
	// Addresses others are told: checked here, as the leader would check
	// them at the join (was: serve started and kept retrying a --join of
	// "::::", or advertised "bad host!" until the leader refused it).
	if *advHost != "" {
		if err := node.ValidHostPort(net.JoinHostPort(*advHost, "1")); err != nil {
			return fail("--advertise-host %q: %v", *advHost, err)
		}
	}
	if err := checkJoin(*join); err != nil {
		return fail("%v", err)
	}
	if err := checkToken(*adminToken); err != nil {
		return fail("--admin-token: %v", err)
	}
	if err := checkToken(*viewToken); err != nil {
		return fail("--view-token: %v", err)
	}
	if *viewToken != "" && *viewToken == *adminToken {
		return fail("--view-token: the same as --admin-token, so whoever holds it may administer; give routers and gateways a token of their own")
	}
	if *rulesFile != "" {
		if _, err := node.LoadRulesFile(*rulesFile); err != nil {
			return fail("rules file %s refused: %v", *rulesFile, err)
		}
	}
	if err := envoy.check(); err != nil {
		return fail("%v", err)
	}
	auth, err := sec.auth(log, *raftAddr, *peerAddr)
	if err != nil {
		return fail("%v", err)
	}
	rc := ring.DefaultConfig()
	rc.Partitions = *partitions
	if err := rc.Validate(); err != nil {
		return fail("--partitions: %v", err)
	}
	adv := func(listen string) (string, error) { return advertise(listen, *advHost) }
	var ls server.Listeners
	var advHTTP, advRaft, advPeer string
	for _, l := range []struct {
		name, addr string
		ln         *net.Listener
		adv        *string
	}{{"http", *httpAddr, &ls.HTTP, &advHTTP}, {"raft", *raftAddr, &ls.Raft, &advRaft}, {"peer", *peerAddr, &ls.Peer, &advPeer}} {
		ln, err := net.Listen("tcp", hostPort(l.addr))
		if err != nil {
			closeAll(ls)
			return fail("--%s: %v", l.name, err)
		}
		*l.ln = ln
		a, err := adv(ln.Addr().String())
		if err != nil {
			closeAll(ls)
			return fail("--%s: %v", l.name, err)
		}
		*l.adv = a
	}
	if ln, err := envoy.listen(); err != nil {
		closeAll(ls)
		return fail("%v", err)
	} else if ln != nil {
		ls.GRPC = ln
	}
	// Every member may be given the same --join (a StatefulSet's pods
	// share one spec): the member it names first is the seed, the only
	// one that may bootstrap, after asking the others (node.Config.Seed).
	joins, seed := joinList(*join, advHTTP)
	switch {
	case seed && len(joins) == 0:
		log.Info("--join names only this node's own HTTP address: bootstrapping as the seed when the data dir is empty (no other member to ask whether a cluster exists)", "join", *join)
	case seed:
		log.Info("--join names this node's own HTTP address first: it is the seed; with an empty data dir it asks the other listed members whether a cluster exists, and bootstraps only if none does", "join", *join)
	}
	// GC defaults for a heap of bucket tables (unless GOGC/GOMEMLIMIT say
	// otherwise): RSS per active key near the tables' own size.
	if gs := gctune.Tune(ctx, getenv, "", 500*time.Millisecond); gs.TuneGOGC || gs.MemoryLimit > 0 {
		log.Debug("gc tuned", "gogc_follows_live_heap", gs.TuneGOGC, "soft_memory_limit", gs.MemoryLimit)
	}
	srv, err := server.Start(server.Config{
		ID: *id, HTTPAdvertise: advHTTP, RaftAdvertise: advRaft, PeerAdvertise: advPeer,
		DataDir: *dataDir, Join: joins, Seed: seed, RulesFile: *rulesFile, AdminToken: *adminToken, ViewToken: *viewToken,
		DrainTimeout: *drainTimeout, DeadAfter: *deadAfter, MaxKeys: *maxKeys, Ring: rc, RaftTimeout: *raftTimeout,
		Router: rcfg,
		Logger: log, Auth: auth,
		RLS: envoy.options(),
	}, ls)
	if err != nil {
		closeAll(ls)
		log.Error(fmt.Sprintf("starting: %v", err))
		return 1 // not a usage error: bad data, a refused join, ...
	}
	log.Info("ringlimit serving", "id", *id, "http", advHTTP, "raft", advRaft, "peer", advPeer, "grpc", *envoy.grpc, "data_dir", *dataDir)
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests (a second signal exits at once)", "drain_timeout", drainTimeout.String())
	case <-srv.Removed():
		log.Info("removed from the cluster: exiting")
	case err := <-srv.Left():
		// Removed while it was away (its log never got the removal): as
		// Start's refusal of a data dir whose log holds it, exit 1.
		log.Error(err.Error())
		actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := within(5*time.Second+shutdownGrace, func() error { return srv.Abort(actx) }); err != nil {
			log.Error("stopping", "err", err)
		}
		return 1
	case err := <-srv.Conflict():
		log.Error(fmt.Sprintf("member id %q is held by another live process; exiting without touching it: %v", *id, err))
		actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := within(5*time.Second+shutdownGrace, func() error { return srv.Abort(actx) }); err != nil {
			log.Error("stopping", "err", err)
		}
		return 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	defer cancel()
	if err := within(*drainTimeout+shutdownGrace, func() error { return srv.Shutdown(sctx) }); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// minRaftTimeout is the least --raft-timeout: Raft's leader lease and
// commit timeout are fractions of it (hashicorp/raft wants them ≥ 5 ms),
// and a shorter one makes a leader step down at every scheduling hiccup.
const minRaftTimeout = 100 * time.Millisecond

// shutdownGrace is how long serve waits for a member's shutdown past
// --drain-timeout (an abort past its own 5s) before it exits all the
// same: hashicorp/raft's Shutdown waits for its log store, and a disk
// that never answers would hold the process forever. Raft's stores are
// transactional, so exiting then loses nothing a crash would not.
const shutdownGrace = 10 * time.Second

// errShutdownHung is within's error when f has not returned in time.
var errShutdownHung = errors.New("did not finish in time (a Raft write or a disk that never answers?); exiting all the same")

// within runs f and waits for it at most d; after that it returns
// errShutdownHung and leaves f running (the process is about to exit).
func within(d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errShutdownHung
	}
}

// advertise returns the address others use for a listener: the listen
// address with its host replaced by --advertise-host when given.
func advertise(listen, advHost string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if advHost != "" {
		return net.JoinHostPort(advHost, port), nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "", fmt.Errorf("listening on all interfaces (%s): set --advertise-host to the address other nodes should use", listen)
	}
	return listen, nil
}

func closeAll(ls server.Listeners) {
	for _, l := range []net.Listener{ls.HTTP, ls.Raft, ls.Peer, ls.GRPC} {
		if l != nil {
			l.Close()
		}
	}
}

// joinList splits a --join list: the members to join through (or, for
// the seed, to ask), without this node's own address, and whether it
// is the seed (the list names it first).
func joinList(join, advHTTP string) (others []string, seed bool) {
	for i, a := range joinEntries(join) {
		if isSelf(a, advHTTP) {
			seed = seed || i == 0
		} else {
			others = append(others, a)
		}
	}
	return others, seed
}

// joinEntries are the addresses of a --join list, each as hostPort reads
// it; empty entries are left out.
func joinEntries(join string) []string {
	var out []string
	for _, a := range strings.Split(join, ",") {
		if a = hostPort(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// checkJoin checks every address of a --join list as the leader checks
// a member's (node.ValidHostPort); a host may end in the root's dot (a
// fully qualified name), which isSelf reads as the name without it.
func checkJoin(join string) error {
	for _, a := range joinEntries(join) {
		c := a
		if h, p, err := net.SplitHostPort(a); err == nil {
			c = net.JoinHostPort(strings.TrimSuffix(h, "."), p)
		}
		if err := node.ValidHostPort(c); err != nil {
			return fmt.Errorf("--join %q: %w", a, err)
		}
	}
	return nil
}

// isSelf reports whether the --join address is this node's own advertised
// HTTP address (host names compared without case or a trailing dot), or
// names it as localhost where it advertises 127.0.0.1 (or the other way
// round): was not, and members started with --http 127.0.0.1:P and
// `--join localhost:P,...` had no seed, each waiting for a cluster nobody
// would bootstrap. Not ::1 as well: a member on 127.0.0.1:P and another
// on [::1]:P would both take localhost:P for their own, and both
// bootstrap (a review).
func isSelf(join, advHTTP string) bool {
	if join == "" {
		return false
	}
	jh, jp, err1 := net.SplitHostPort(hostPort(join))
	ah, ap, err2 := net.SplitHostPort(advHTTP)
	if err1 != nil || err2 != nil || jp != ap {
		return false
	}
	jh, ah = strings.TrimSuffix(jh, "."), strings.TrimSuffix(ah, ".")
	return strings.EqualFold(jh, ah) || localhostOf(jh, ah) || localhostOf(ah, jh)
}

// localhostOf reports whether name is localhost and ip 127.0.0.1, the
// address Go dials for it first (not ::1, nor the rest of 127.0.0.0/8,
// where other listeners may be).
func localhostOf(name, ip string) bool {
	return strings.EqualFold(name, "localhost") && ip == "127.0.0.1"
}
