package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/loadgen"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

// runBench is `ringlimit bench`: a bounded load generator against the HTTP
// API, or (--protocol peer) the owners' data plane through a router of
// its own. It runs until --duration, --requests or ctx ends, whichever
// comes first, then prints throughput, latency per request (HTTP request
// or router call) and the split of decisions. It exits 0, or 2 on a flag error or when no request succeeded.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench", stderr)
	addrs := fs.String("addr", defaultAddr, "comma-separated HTTP addresses of members; each worker goes round-robin over them")
	var cfg loadgen.Config
	fs.StringVar(&cfg.Rule, "rule", "default", "rule to check")
	fs.IntVar(&cfg.Keys, "keys", 1000, "number of distinct keys (key-0 … key-<N-1>)")
	dist := fs.String("dist", "uniform", "key distribution: uniform | zipf (s=1.1)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the key choice")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, fmt.Sprintf("concurrent workers, each one request at a time (max %d)", loadgen.MaxConcurrency))
	fs.IntVar(&cfg.Batch, "batch", 1, fmt.Sprintf("checks per request: 1 = single form, more = batch form (max %d)", api.MaxBatch))
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, fmt.Sprintf("how long to run (max %v)", loadgen.MaxDuration))
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many requests, each of --batch checks: HTTP requests, or router calls with --protocol peer (0 = no cap)")
	fs.Int64Var(&cfg.Cost, "cost", 1, "cost of each check")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	protocol := fs.String("protocol", "http", "http: POST /v1/check to the members; peer: act as a stateless router, hashing keys itself and sending batches to their owners over the binary data plane (reads GET /v1/cluster/view from --addr every second, and when an owner answers NOT_OWNER)")
	adminToken := fs.String("admin-token", "", "bearer token for GET /v1/cluster/view (--protocol peer)")
	sec := addDialerSecurityFlags(fs)
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	auth, err := sec.auth(log) // a dialer: nothing to expose
	if err != nil {
		fmt.Fprintf(stderr, "ringlimit bench: %v\n", err)
		return 2
	}
	switch *dist {
	case "uniform":
	case "zipf":
		cfg.Zipf = true
	default:
		return fail(stderr, "bench", fmt.Errorf("--dist %q: want uniform or zipf", *dist))
	}
	var targets []string
	for a := range strings.SplitSeq(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			targets = append(targets, a)
		}
	}
	if len(targets) == 0 {
		return fail(stderr, "bench", errors.New("--addr: no address"))
	}
	if err := cfg.Validate(); err != nil {
		return fail(stderr, "bench", err)
	}

	// One transport for all targets, with an idle connection per worker
	// and target, so that every worker keeps its connections alive.
	tr := client.NewTransport(max(256, cfg.Concurrency))
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	funcs := make([]loadgen.CheckFunc, len(targets))
	urls := make([]string, len(targets))
	for i, a := range targets {
		c := client.New(baseURL(a), client.WithHTTPClient(hc))
		funcs[i], urls[i] = httpChecks(c), c.Addr()
	}
	switch *protocol {
	case "http":
	case "peer":
		bases := make([]string, len(targets))
		for i, a := range targets {
			bases[i] = baseURL(a)
		}
		src := client.NewViewSource(bases, client.WithHTTPClient(hc), client.WithAdminToken(*adminToken))
		rt, pool, err := peerRouter(ctx, src, auth, log)
		if err != nil {
			return fail(stderr, "bench", err)
		}
		defer pool.Close()
		defer rt.Close()
		// Followed as `ringlimit router` follows it: every second, and at
		// once when an owner answers NOT_OWNER. Was: read once, so a
		// member marked dead (or gone by a leave) kept its share of the
		// checks answered by the failure mode to the end of the run.
		fctx, stopFollow := context.WithCancel(ctx)
		followed := make(chan struct{})
		go func() {
			defer close(followed)
			_ = rt.Follow(fctx, src, time.Second)
		}()
		defer func() { stopFollow(); <-followed }()
		funcs, urls = []loadgen.CheckFunc{peerChecks(rt)}, []string{"peer:" + urls[0]}
	default:
		return fail(stderr, "bench", fmt.Errorf("--protocol %q: want http or peer", *protocol))
	}

	fmt.Fprintf(stderr, "ringlimit bench: %d workers, %d target(s), up to %v…\n", cfg.Concurrency, len(targets), cfg.Duration)
	res := loadgen.Run(ctx, cfg, funcs)
	rep := newBenchReport(cfg, *dist, urls, res)
	if *asJSON {
		err = writeJSON(stdout, rep)
	} else {
		err = rep.writeText(stdout)
	}
	if err != nil {
		return fail(stderr, "bench", err)
	}
	if rep.Degraded > 0 {
		// Not an error of the run (a failover drill expects some), but
		// never what a load test measures: say it where it is seen.
		fmt.Fprintf(stderr, "ringlimit bench: %d of %d checks (%.1f%%) were answered degraded, by their rules' failure_mode: an owner was unreachable or refused the connection (see the lines above, and ringlimit_forward_errors_total)\n",
			rep.Degraded, rep.Checks, 100*rep.DegradedRatio)
	}
	if res.Requests == 0 {
		if res.Errors > 0 {
			return fail(stderr, "bench", fmt.Errorf("all %d requests failed", res.Errors))
		}
		return fail(stderr, "bench", errors.New("no request completed"))
	}
	return exitOK
}

// httpChecks is the checkFunc of one node's HTTP API: the single form of
// POST /v1/check for one check, the batch form for more.
func httpChecks(c *client.Client) loadgen.CheckFunc {
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		if len(checks) != 1 {
			got, err := c.CheckBatch(ctx, checks)
			if err != nil {
				return 0, err
			}
			copy(ds, got)
			return len(got), nil
		}
		d, err := c.Check(ctx, checks[0].Rule, checks[0].Key, checks[0].CostValue())
		if err != nil {
			return 0, err
		}
		ds[0] = d
		return 1, nil
	}
}

// peerRouter builds a stateless router from the members' view of the
// cluster, read from src (the first member that answers); it logs to log
// what a router says at WARN (owners refusing its connections).
func peerRouter(ctx context.Context, src *client.ViewSource, auth *transport.Auth, log *slog.Logger) (*router.Router, *transport.Pool, error) {
	// Bounded: a member that hangs (stopped, not refusing) held the run
	// for as long as it hung, whatever --duration said.
	vctx, cancel := context.WithTimeout(ctx, viewReadTimeout)
	defer cancel()
	v, err := src.FetchView(vctx)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the cluster view (within %v): %w", viewReadTimeout, err)
	}
	pcfg := transport.DefaultClientConfig()
	pcfg.Dial = auth.Dial // the owners' data plane authenticates every connection
	pool := transport.NewPool(pcfg)
	rt, err := router.New(router.Config{Logger: log}, nil, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	rt.SetView(v)
	return rt, pool, nil
}

// viewReadTimeout bounds bench's read of the cluster view.
var viewReadTimeout = 10 * time.Second // a var: tests shorten it

// peerChecks is the checkFunc of a stateless router: each call's checks go
// to their owners over the data plane, batched with other workers' checks.
// A call's requests and results are reused from a pool.
func peerChecks(rt *router.Router) loadgen.CheckFunc {
	type buffers struct {
		reqs []router.Request
		out  []router.Result
	}
	pool := sync.Pool{New: func() any { return new(buffers) }}
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		buf := pool.Get().(*buffers)
		defer pool.Put(buf)
		reqs := slices.Grow(buf.reqs[:0], len(checks))[:len(checks)]
		for i, c := range checks {
			reqs[i] = router.Request{Rule: c.Rule, Key: c.Key, Cost: c.CostValue()}
		}
		out := slices.Grow(buf.out[:0], len(reqs))[:len(reqs)]
		buf.reqs, buf.out = reqs, out
		if err := rt.Check(ctx, reqs, out); err != nil {
			return 0, err
		}
		for i, r := range out {
			ds[i] = api.Decision{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining, Degraded: r.Degraded}
		}
		return len(out), nil
	}
}

// benchReport is the outcome of a bench, as --json prints it.
type benchReport struct {
	Config struct {
		Targets     []string `json:"targets"`
		Rule        string   `json:"rule"`
		Keys        int      `json:"keys"`
		Dist        string   `json:"dist"`
		Seed        uint64   `json:"seed"`
		Concurrency int      `json:"concurrency"`
		Batch       int      `json:"batch"`
		Cost        int64    `json:"cost"`
		Duration    string   `json:"duration"`
		Requests    int64    `json:"requests"`
	} `json:"config"`
	ElapsedSeconds    float64 `json:"elapsed_seconds"`
	Requests          int64   `json:"requests"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	Errors            int64   `json:"errors"`
	Checks            int64   `json:"checks"`
	ChecksPerSecond   float64 `json:"checks_per_second"`
	// LatencyMs is per answered HTTP request, in milliseconds.
	LatencyMs struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
		Max  float64 `json:"max"`
		Mean float64 `json:"mean"`
	} `json:"latency_ms"`
	Allowed       int64            `json:"allowed"`
	Denied        int64            `json:"denied"`
	Degraded      int64            `json:"degraded"`
	AllowedRatio  float64          `json:"allowed_ratio"`
	DeniedRatio   float64          `json:"denied_ratio"`
	DegradedRatio float64          `json:"degraded_ratio"`
	ErrorKinds    map[string]int64 `json:"error_kinds,omitempty"`

	lat [5]time.Duration // p50 p90 p99 p999 max, for the text form
}

func newBenchReport(cfg loadgen.Config, dist string, targets []string, res loadgen.Result) *benchReport {
	r := &benchReport{}
	r.Config.Targets = targets
	r.Config.Rule, r.Config.Keys, r.Config.Dist, r.Config.Seed = cfg.Rule, cfg.Keys, dist, cfg.Seed
	r.Config.Concurrency, r.Config.Batch, r.Config.Cost = cfg.Concurrency, cfg.Batch, cfg.Cost
	r.Config.Duration, r.Config.Requests = cfg.Duration.String(), cfg.Requests

	secs := res.Elapsed.Seconds()
	r.ElapsedSeconds = round3(secs)
	r.Requests, r.Errors, r.Checks = res.Requests, res.Errors, res.Checks
	if secs > 0 {
		r.RequestsPerSecond = round3(float64(res.Requests) / secs)
		r.ChecksPerSecond = round3(float64(res.Checks) / secs)
	}
	h := &res.Latency
	r.lat = [5]time.Duration{h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99), h.Quantile(0.999), h.Max()}
	toMs := func(d time.Duration) float64 { return round3(float64(d) / 1e6) }
	r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99 = toMs(r.lat[0]), toMs(r.lat[1]), toMs(r.lat[2])
	r.LatencyMs.P999, r.LatencyMs.Max, r.LatencyMs.Mean = toMs(r.lat[3]), toMs(r.lat[4]), toMs(h.Mean())

	r.Allowed, r.Denied, r.Degraded = res.Allowed, res.Denied, res.Degraded
	if res.Checks > 0 {
		n := float64(res.Checks)
		r.AllowedRatio = round3(float64(res.Allowed) / n)
		r.DeniedRatio = round3(float64(res.Denied) / n)
		r.DegradedRatio = round3(float64(res.Degraded) / n)
	}
	if len(res.ErrorKinds) > 0 {
		r.ErrorKinds = res.ErrorKinds
	}
	return r
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// writeText prints the report for people.
func (r *benchReport) writeText(w io.Writer) error {
	c := r.Config
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "targets\t%s\n", strings.Join(c.Targets, ", "))
	fmt.Fprintf(tw, "load\trule=%s keys=%d dist=%s concurrency=%d batch=%d cost=%d\n",
		c.Rule, c.Keys, c.Dist, c.Concurrency, c.Batch, c.Cost)
	fmt.Fprintf(tw, "elapsed\t%.3fs\n", r.ElapsedSeconds)
	fmt.Fprintf(tw, "checks\t%d\t%.1f/s\n", r.Checks, r.ChecksPerSecond)
	// Over --protocol peer there are no HTTP requests: a request is one
	// call of the router (its checks go to their owners in frames).
	reqs, per := "requests", "per HTTP request"
	if len(c.Targets) > 0 && strings.HasPrefix(c.Targets[0], "peer:") {
		reqs, per = "calls", "per router call"
	}
	fmt.Fprintf(tw, "%s\t%d\t%.1f/s\n", reqs, r.Requests, r.RequestsPerSecond)
	fmt.Fprintf(tw, "errors\t%d\n", r.Errors)
	fmt.Fprintf(tw, "latency\tp50=%v p90=%v p99=%v p99.9=%v max=%v\t(%s)\n",
		roundLatency(r.lat[0]), roundLatency(r.lat[1]), roundLatency(r.lat[2]), roundLatency(r.lat[3]), roundLatency(r.lat[4]), per)
	fmt.Fprintf(tw, "decisions\tallowed=%d (%.1f%%) denied=%d (%.1f%%) degraded=%d (%.1f%%)\n",
		r.Allowed, 100*r.AllowedRatio, r.Denied, 100*r.DeniedRatio, r.Degraded, 100*r.DegradedRatio)
	if err := tw.Flush(); err != nil {
		return err
	}
	kinds := make([]string, 0, len(r.ErrorKinds))
	for k := range r.ErrorKinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if a, b := r.ErrorKinds[kinds[i]], r.ErrorKinds[kinds[j]]; a != b {
			return a > b
		}
		return kinds[i] < kinds[j]
	})
	for _, k := range kinds {
		if _, err := fmt.Fprintf(w, "  %6d× %s\n", r.ErrorKinds[k], k); err != nil {
			return err
		}
	}
	return nil
}

// roundLatency keeps three or so significant digits.
func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}
