package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gubernator-io/gubernator/v2"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/bench/internal/httptarget"
	"github.com/ringlimit/ringlimit/bench/internal/proc"
	"github.com/ringlimit/ringlimit/bench/internal/resp"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/cputime"
	"github.com/ringlimit/ringlimit/internal/loadgen"
	"github.com/ringlimit/ringlimit/router"
)

// The bench rule in each system's terms: a token bucket of 1000 per
// second with a burst of 1000; the memory rule (1 per hour, burst 1)
// keeps a key checked once active for an hour, so that no system may
// drop it as full while the memory is measured.
const (
	benchRule  = "bench"
	memRule    = "mem"
	rulesYAML  = "rules:\n  - {name: bench, algorithm: token_bucket, limit: 1000, period: 1s, burst: 1000}\n  - {name: mem, algorithm: token_bucket, limit: 1, period: 1h, burst: 1}\n"
	redisPerMs = "1"          // 1000 per second
	redisBurst = "1000"       // tokens
	memPerMs   = "0.00000028" // ~1 per hour
	memBurst   = "1"
)

var (
	gubBench = gubRule{limit: 1000, durationMs: 1000}
	gubMem   = gubRule{limit: 1, durationMs: 3_600_000}
)

// measure runs one row against targets and records it with the CPU the
// procs spent meanwhile.
func measure(ctx context.Context, o *options, rep *report, r row, procs []*proc.Proc, targets []loadgen.CheckFunc) (row, error) {
	// One seed for every row: each system and path sees the same key
	// sequence. Was: the row's index, so rows compared in a ratio drew
	// different keys.
	cfg := loadgen.Config{Rule: r.rule, Keys: o.keys, Seed: 1, Concurrency: r.Concurrency,
		Batch: r.Batch, Duration: o.duration, Cost: 1, Rate: r.Rate}
	if cfg.Rule == "" {
		cfg.Rule = benchRule
	}
	// The load generator's own counters are read nearest the run (last
	// before it, first after it): reading the servers' /proc files is
	// not its work. Arguments are evaluated left to right.
	var before, after counters
	if err := errors.Join(before.readServers(procs), before.readSelf()); err != nil {
		return r, err
	}
	res := loadgen.Run(ctx, cfg, targets)
	if err := errors.Join(after.readSelf(), after.readServers(procs)); err != nil {
		return r, err
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	secs := res.Elapsed.Seconds()
	r.Checks, r.Errors, r.Degraded = res.Checks, res.Errors, res.Degraded
	r.ChecksPerSec = float64(res.Checks) / secs
	r.P50ms = float64(res.Latency.Quantile(0.5)) / 1e6
	r.P99ms = float64(res.Latency.Quantile(0.99)) / 1e6
	if r.Rate > 0 {
		r.P99SchedMs = float64(res.ResponseTime.Quantile(0.99)) / 1e6
		r.P99WakeLateMs = float64(res.WakeLate.Quantile(0.99)) / 1e6
	}
	r.ServerCPUSeconds = (after.server - before.server).Seconds()
	if res.Checks > 0 {
		r.CPUusPerCheck = r.ServerCPUSeconds * 1e6 / float64(res.Checks)
		r.LoadCPUusPerCheck = (after.load - before.load).Seconds() * 1e6 / float64(res.Checks)
		r.AllowedRatio = float64(res.Allowed) / float64(res.Checks)
		n := float64(res.Checks)
		sd, ld := after.serverSched.Sub(before.serverSched), after.loadSched.Sub(before.loadSched)
		r.ServerSwitchesPerCheck, r.ServerSyscallsPerCheck = float64(sd.Switches)/n, float64(sd.ReadWrites)/n
		r.LoadSwitchesPerCheck, r.LoadSyscallsPerCheck = float64(ld.Switches)/n, float64(ld.ReadWrites)/n
	}
	if len(res.ErrorKinds) > 0 {
		r.ErrorKinds = res.ErrorKinds
	}
	r.Load = loadAvg()
	if o.rounds > 1 {
		r.Round = o.round
	}
	rep.Rows = append(rep.Rows, r)
	log.Printf("%-10s %d %-28s c=%-3d batch=%-4d %10.0f checks/s  p50 %7.3fms  p99 %7.3fms  cpu %7.3fµs/check  load generator %7.3fµs/check  switches/syscalls per check %.3f/%.3f, load generator %.3f/%.3f  errors %d degraded %d",
		r.System, r.Instances, r.Path, r.Concurrency, r.Batch, r.ChecksPerSec, r.P50ms, r.P99ms, r.CPUusPerCheck, r.LoadCPUusPerCheck,
		r.ServerSwitchesPerCheck, r.ServerSyscallsPerCheck, r.LoadSwitchesPerCheck, r.LoadSyscallsPerCheck, r.Errors, r.Degraded)
	return r, nil
}

// counters is what measure reads of the servers (procs) and of the load
// generator (this process) before and after a row.
type counters struct {
	server, load           time.Duration // CPU time
	serverSched, loadSched proc.Sched
}

func (c *counters) readServers(procs []*proc.Proc) (err error) {
	if c.server, err = proc.CPUOf(procs); err != nil {
		return err
	}
	c.serverSched, err = proc.SchedOf(procs)
	return err
}

func (c *counters) readSelf() (err error) {
	c.load = cputime.Process()
	c.loadSched, err = proc.SchedOfPID(os.Getpid())
	return err
}

// warm drives targets briefly, unmeasured: connections, pools, buckets.
func warm(ctx context.Context, o *options, batch int, targets []loadgen.CheckFunc) {
	if o.warmup <= 0 {
		return
	}
	loadgen.Run(ctx, loadgen.Config{Rule: benchRule, Keys: o.keys, Seed: 99, Concurrency: 16, Batch: batch,
		Duration: o.warmup, Cost: 1}, targets)
}

func httpClient(conc int) *http.Client {
	return &http.Client{Transport: client.NewTransport(max(64, conc)), Timeout: 30 * time.Second}
}

// startRinglimit starts n members on free ports (HTTP, Raft and data
// plane each), the first with the rules file, and waits until every member
// is active and has the rules in force.
func startRinglimit(ctx context.Context, o *options, n int, env []string) ([]*proc.Proc, []string, error) {
	rules := filepath.Join(o.work, "rules.yaml")
	if err := os.WriteFile(rules, []byte(rulesYAML), 0o644); err != nil {
		return nil, nil, err
	}
	ports, err := proc.FreePorts(3 * n)
	if err != nil {
		return nil, nil, err
	}
	var procs []*proc.Proc
	var addrs []string
	o.starts++
	hc := httpClient(4)
	defer hc.CloseIdleConnections()
	get := func(url string, out any) bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		return out == nil || json.NewDecoder(resp.Body).Decode(out) == nil
	}
	prefix := fmt.Sprintf("rl%d-", ports[0]) // member ids of this run
	for i := range n {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[3*i])
		id := fmt.Sprintf("%s%d", prefix, i+1)
		args := []string{"serve", "--id", id, "--http", addr,
			"--raft", fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]), "--peer", fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]),
			"--data-dir", filepath.Join(o.work, fmt.Sprintf("%s.%d", id, o.starts)), "--log-level", "warn"}
		if i == 0 {
			args = append(args, "--rules", rules)
		} else {
			args = append(args, "--join", addrs[0])
		}
		p, err := proc.Start(o.work, fmt.Sprintf("%s.%d", id, o.starts), o.ringlimit, args, append(slices.Clip(env), o.serverEnv...))
		if err != nil {
			proc.StopAll(procs)
			return nil, nil, err
		}
		procs = append(procs, p)
		addrs = append(addrs, addr)
		if err := proc.WaitUp(ctx, p, id+" ready", 60*time.Second, func() bool { return get("http://"+addr+"/readyz", nil) }); err != nil {
			proc.StopAll(procs)
			return nil, nil, err
		}
	}
	err = proc.WaitFor(ctx, "members active with the rules", 60*time.Second, func() bool {
		var c api.Cluster
		if !get("http://"+addrs[0]+"/v1/cluster", &c) || len(c.Members) != n {
			return false
		}
		for _, m := range c.Members {
			if m.State != "active" || !strings.HasPrefix(m.ID, prefix) {
				return false
			}
		}
		for _, a := range addrs {
			var rs api.Rules
			if !get("http://"+a+"/v1/rules", &rs) || !strings.Contains(fmt.Sprint(rs.Rules), benchRule) {
				return false
			}
		}
		return true
	})
	if err != nil {
		proc.StopAll(procs)
		return nil, nil, err
	}
	return procs, addrs, nil
}

// newRing returns a Go client following the cluster, once it routes over
// the data plane with the bench rules.
func newRing(ctx context.Context, addrs []string, timeout time.Duration) (*client.Ring, error) {
	rc, err := client.NewRing(client.RingConfig{Members: addrs, Router: router.Config{Timeout: timeout}})
	if err != nil {
		return nil, err
	}
	err = proc.WaitFor(ctx, "Go client view", 30*time.Second, func() bool {
		v := rc.Router().View()
		return v != nil && v.Rules[benchRule] != nil && v.Rules[memRule] != nil
	})
	if err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

func runRinglimit(ctx context.Context, o *options, rep *report, n int) error {
	procs, addrs, err := startRinglimit(ctx, o, n, nil)
	if err != nil {
		return err
	}
	defer proc.StopAll(procs)
	hc := httpClient(slices.Max(o.conc))
	defer hc.CloseIdleConnections()
	httpTargets := make([]loadgen.CheckFunc, len(addrs))
	for i, a := range addrs {
		httpTargets[i] = httptarget.Ringlimit(hc, a)
	}
	rc, err := newRing(ctx, addrs, 0)
	if err != nil {
		return err
	}
	defer rc.Close()
	ringTargets := []loadgen.CheckFunc{ringlimitRing(rc)}
	if fb := rc.HTTPFallbacks(); fb != 0 {
		log.Printf("Go client: %d calls over HTTP before the view", fb)
	}
	measureHTTP := func(r row) (row, error) { return measure(ctx, o, rep, r, procs, httpTargets) }
	// measureRing is measure for a Go client row, which also records the
	// calls the client sent over HTTP (no view) during the row: a row of
	// the data plane that was not is marked so. Was: counted before the
	// warm-up only.
	measureRing := func(r row) (row, error) {
		fb := rc.HTTPFallbacks()
		r, err := measure(ctx, o, rep, r, procs, ringTargets)
		if err == nil {
			r.HTTPFallbacks = rc.HTTPFallbacks() - fb
			rep.Rows[len(rep.Rows)-1].HTTPFallbacks = r.HTTPFallbacks
		}
		return r, err
	}
	warm(ctx, o, o.batch, httpTargets)
	warm(ctx, o, o.batch, ringTargets)
	mk := func(path, group string, c, batch int) row {
		return row{System: "ringlimit", Instances: n, Path: path, Group: group, Concurrency: c, Batch: batch}
	}
	single, batched := "HTTP single", fmt.Sprintf("HTTP batch %d", o.batch)
	goSingle, goBatched := "Go client, 1 per call", fmt.Sprintf("Go client, %d per call", o.batch)
	peaks := map[string]float64{}
	for _, c := range o.conc {
		for _, x := range []struct {
			r       row
			measure func(row) (row, error)
		}{
			{mk(single, "single", c, 1), measureHTTP},
			{mk(batched, "batched", c, o.batch), measureHTTP},
			{mk(goSingle, "single", c, 1), measureRing},
			{mk(goBatched, "batched", c, o.batch), measureRing},
		} {
			r, err := x.measure(x.r)
			if err != nil {
				return err
			}
			peaks[r.Path] = max(peaks[r.Path], r.ChecksPerSec)
		}
	}
	if n < 3 {
		return nil
	}
	// A forwarded single check at half of the peak: HTTP to one member
	// (2 keys in 3 are forwarded to their owner over the data plane: two
	// hops), and the Go client, its own router (every check crosses the
	// data plane to its owner: the one hop a router's forward makes).
	top := slices.Max(o.conc)
	one := []loadgen.CheckFunc{httpTargets[0]}
	r, err := measure(ctx, o, rep, row{System: "ringlimit", Instances: n, Path: "HTTP single, one member (2/3 forwarded)",
		Group: "forwarded", Concurrency: top, Batch: 1}, procs, one)
	if err != nil {
		return err
	}
	r.Rate = r.ChecksPerSec / 2
	r.Path += ", half of peak"
	if _, err := measure(ctx, o, rep, r, procs, one); err != nil {
		return err
	}
	half := row{System: "ringlimit", Instances: n, Path: goSingle + ", half of peak", Group: "forwarded",
		Concurrency: top, Batch: 1, Rate: peaks[goSingle] / 2}
	_, err = measureRing(half)
	return err
}

// startGubernator starts n gubernatord instances on free ports (gRPC and
// HTTP each) with static peers and waits until each is healthy with all
// peers.
func startGubernator(ctx context.Context, o *options, n int, cache int) ([]*proc.Proc, []string, []string, error) {
	ports, err := proc.FreePorts(2 * n)
	if err != nil {
		return nil, nil, nil, err
	}
	var grpcAddrs, httpAddrs []string
	for i := range n {
		grpcAddrs = append(grpcAddrs, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
		httpAddrs = append(httpAddrs, fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]))
	}
	var procs []*proc.Proc
	hc := httpClient(4)
	defer hc.CloseIdleConnections()
	for i := range n {
		name := fmt.Sprintf("gub%d-%d", ports[0], i+1)
		env := []string{"GUBER_GRPC_ADDRESS=" + grpcAddrs[i], "GUBER_HTTP_ADDRESS=" + httpAddrs[i],
			"GUBER_ADVERTISE_ADDRESS=" + grpcAddrs[i], "GUBER_CACHE_SIZE=" + strconv.Itoa(cache),
			"GUBER_LOG_LEVEL=warn", "GUBER_INSTANCE_ID=" + name}
		env = append(env, o.serverEnv...)
		p, err := proc.Start(o.work, name, o.gubernatord, []string{"--peers", strings.Join(grpcAddrs, ",")}, env)
		if err != nil {
			proc.StopAll(procs)
			return nil, nil, nil, err
		}
		procs = append(procs, p)
	}
	for i, a := range httpAddrs {
		err := proc.WaitUp(ctx, procs[i], procs[i].Name+" healthy", 60*time.Second, func() bool {
			resp, err := hc.Get("http://" + a + "/v1/HealthCheck")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var h struct {
				Status    string `json:"status"`
				PeerCount int    `json:"peer_count"`
			}
			return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil &&
				h.Status == "healthy" && h.PeerCount == n
		})
		if err != nil {
			proc.StopAll(procs)
			return nil, nil, nil, err
		}
	}
	return procs, grpcAddrs, httpAddrs, nil
}

func runGubernator(ctx context.Context, o *options, rep *report, n int) error {
	procs, grpcAddrs, httpAddrs, err := startGubernator(ctx, o, n, 2*o.keys)
	if err != nil {
		return err
	}
	defer proc.StopAll(procs)
	hc := httpClient(slices.Max(o.conc))
	defer hc.CloseIdleConnections()
	var httpTargets, grpcTargets []loadgen.CheckFunc
	for i := range n {
		httpTargets = append(httpTargets, gubernatorHTTP(hc, httpAddrs[i], gubBench))
		c, err := gubernator.DialV1Server(grpcAddrs[i], nil)
		if err != nil {
			return err
		}
		grpcTargets = append(grpcTargets, gubernatorGRPC(c, gubBench))
	}
	warm(ctx, o, o.batch, httpTargets)
	warm(ctx, o, o.batch, grpcTargets)
	mk := func(path, group string, c, batch int) row {
		return row{System: "gubernator", Instances: n, Path: path, Group: group, Concurrency: c, Batch: batch}
	}
	for _, c := range o.conc {
		for _, x := range []struct {
			r  row
			ts []loadgen.CheckFunc
		}{
			{mk("HTTP single", "single", c, 1), httpTargets},
			{mk(fmt.Sprintf("HTTP batch %d", o.batch), "batched", c, o.batch), httpTargets},
			{mk("gRPC, 1 per call", "single", c, 1), grpcTargets},
			{mk(fmt.Sprintf("gRPC, %d per call", o.batch), "batched", c, o.batch), grpcTargets},
		} {
			if _, err := measure(ctx, o, rep, x.r, procs, x.ts); err != nil {
				return err
			}
		}
	}
	return nil
}

// startRedis starts redis-server without persistence on a free port and
// loads the token bucket script.
func startRedis(ctx context.Context, o *options) (*proc.Proc, string, string, error) {
	p, addr, rc, err := resp.Start(ctx, o.work, o.redisServer)
	if err != nil {
		return nil, "", "", err
	}
	defer rc.Close()
	_, sha, err := rc.Do(ctx, "SCRIPT", "LOAD", tokenBucketLua)
	if err != nil {
		p.Stop(5 * time.Second)
		return nil, "", "", err
	}
	_, info, err := rc.Do(ctx, "INFO", "server")
	if err == nil {
		for l := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "redis_version:"); ok {
				o.redisVersion = v
			}
		}
	}
	return p, addr, sha, nil
}

func runRedis(ctx context.Context, o *options, rep *report) error {
	p, addr, sha, err := startRedis(ctx, o)
	if err != nil {
		return err
	}
	defer p.Stop(5 * time.Second)
	rep.RedisVersion = o.redisVersion
	pool := resp.NewPool(addr, 2*slices.Max(o.conc))
	defer pool.Close()
	targets := []loadgen.CheckFunc{redisEvalsha(pool, sha, redisPerMs, redisBurst)}
	warm(ctx, o, o.pipeline, targets)
	for _, c := range o.conc {
		for _, x := range []row{
			{System: "redis", Instances: 1, Path: "EVALSHA, pipeline 1", Group: "single", Concurrency: c, Batch: 1},
			{System: "redis", Instances: 1, Path: fmt.Sprintf("EVALSHA, pipeline %d", o.pipeline), Group: "batched", Concurrency: c, Batch: o.pipeline},
		} {
			if _, err := measure(ctx, o, rep, x, []*proc.Proc{p}, targets); err != nil {
				return err
			}
		}
	}
	return nil
}

// fill checks keys m-from … m-(to-1) once each, in calls of batch, from
// 4 workers.
func fill(ctx context.Context, from, to, batch int, send func(ctx context.Context, keys []string) error) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range 4 {
		wg.Go(func() {
			keys := make([]string, 0, batch)
			for ctx.Err() == nil {
				lo := int(next.Add(int64(batch))) - batch
				if lo >= to {
					return
				}
				keys = keys[:0]
				for i := lo; i < min(lo+batch, to); i++ {
					keys = append(keys, "m-"+strconv.Itoa(i))
				}
				if err := send(ctx, keys); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// settledRSS waits for the process to settle after a fill and reads its
// RSS.
func settledRSS(ctx context.Context, p *proc.Proc) (int64, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	return p.RSS()
}

// heapAlloc reads go_memstats_heap_alloc_bytes from a member's /metrics.
func heapAlloc(addr string) int64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_alloc_bytes "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int64(f)
		}
	}
	return 0
}

func runMemory(ctx context.Context, o *options, rep *report) error {
	if len(o.memKeys) == 0 {
		return nil
	}
	if err := memRinglimit(ctx, o, rep, "default GC settings", nil); err != nil {
		return err
	}
	for _, g := range o.memGOGC {
		if err := memRinglimit(ctx, o, rep, "GOGC="+g, []string{"GOGC=" + g}); err != nil {
			return err
		}
	}
	if err := memGubernator(ctx, o, rep); err != nil {
		return err
	}
	return memRedis(ctx, o, rep)
}

func memRinglimit(ctx context.Context, o *options, rep *report, note string, env []string) error {
	procs, addrs, err := startRinglimit(ctx, o, 1, env)
	if err != nil {
		return err
	}
	defer proc.StopAll(procs)
	// A fill must store every key: an owner slower than the default
	// 250ms (a table growing on a loaded machine) is waited for, not
	// answered by the failure mode.
	rc, err := newRing(ctx, addrs, 30*time.Second)
	if err != nil {
		return err
	}
	defer rc.Close()
	send := func(ctx context.Context, keys []string) error {
		reqs := make([]router.Request, len(keys))
		for i, k := range keys {
			reqs[i] = router.Request{Rule: memRule, Key: k, Cost: 1}
		}
		out := make([]router.Result, len(reqs))
		if err := rc.Router().Check(ctx, reqs, out); err != nil {
			return err
		}
		for _, r := range out {
			if r.Degraded || !r.Allowed {
				return fmt.Errorf("fill: degraded=%v allowed=%v", r.Degraded, r.Allowed)
			}
		}
		return nil
	}
	// Start from a warm process: connections and pools in place.
	if err := send(ctx, []string{"warm"}); err != nil {
		return err
	}
	rss0, err := settledRSS(ctx, procs[0])
	if err != nil {
		return err
	}
	heap0 := heapAlloc(addrs[0])
	from := 0
	for _, n := range o.memKeys {
		t0 := time.Now()
		if err := fill(ctx, from, n, 1000, send); err != nil {
			return err
		}
		took := time.Since(t0)
		from = n
		rss, err := settledRSS(ctx, procs[0])
		if err != nil {
			return err
		}
		m := memRow{System: "ringlimit", Keys: n, Measure: "RSS delta", Note: note, RSSBefore: rss0, RSSAfter: rss,
			BytesPerKey: float64(rss-rss0) / float64(n), HeapBytesPerKey: float64(heapAlloc(addrs[0])-heap0) / float64(n),
			FillSeconds: took.Seconds()}
		rep.Memory = append(rep.Memory, m)
		log.Printf("memory ringlimit %d keys: %.1f B/key RSS, %.1f B/key heap (%s)", n, m.BytesPerKey, m.HeapBytesPerKey, note)
	}
	return nil
}

func memGubernator(ctx context.Context, o *options, rep *report) error {
	n := o.memKeys[0]
	procs, grpcAddrs, _, err := startGubernator(ctx, o, 1, n+n/10)
	if err != nil {
		return err
	}
	defer proc.StopAll(procs)
	c, err := gubernator.DialV1Server(grpcAddrs[0], nil)
	if err != nil {
		return err
	}
	check := gubernatorGRPC(c, gubMem)
	send := func(ctx context.Context, keys []string) error {
		checks := make([]api.CheckRequest, len(keys))
		for i, k := range keys {
			checks[i] = api.CheckRequest{Rule: memRule, Key: k}
		}
		_, err := check(ctx, checks, make([]api.Decision, len(checks)))
		return err
	}
	if err := send(ctx, []string{"warm"}); err != nil {
		return err
	}
	rss0, err := settledRSS(ctx, procs[0])
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fill(ctx, 0, n, 1000, send); err != nil {
		return err
	}
	took := time.Since(t0)
	rss, err := settledRSS(ctx, procs[0])
	if err != nil {
		return err
	}
	m := memRow{System: "gubernator", Keys: n, Measure: "RSS delta", RSSBefore: rss0, RSSAfter: rss,
		BytesPerKey: float64(rss-rss0) / float64(n), FillSeconds: took.Seconds()}
	rep.Memory = append(rep.Memory, m)
	log.Printf("memory gubernator %d keys: %.1f B/key RSS", n, m.BytesPerKey)
	return nil
}

func memRedis(ctx context.Context, o *options, rep *report) error {
	n := o.memKeys[0]
	p, addr, sha, err := startRedis(ctx, o)
	if err != nil {
		return err
	}
	defer p.Stop(5 * time.Second)
	pool := resp.NewPool(addr, 8)
	defer pool.Close()
	used := func() (int64, error) {
		c, err := pool.Get(ctx)
		if err != nil {
			return 0, err
		}
		defer pool.Put(c)
		_, info, err := c.Do(ctx, "INFO", "memory")
		if err != nil {
			return 0, err
		}
		for l := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("no used_memory in INFO")
	}
	check := redisEvalsha(pool, sha, memPerMs, memBurst)
	send := func(ctx context.Context, keys []string) error {
		checks := make([]api.CheckRequest, len(keys))
		for i, k := range keys {
			checks[i] = api.CheckRequest{Rule: memRule, Key: k}
		}
		_, err := check(ctx, checks, make([]api.Decision, len(checks)))
		return err
	}
	u0, err := used()
	if err != nil {
		return err
	}
	rss0, err := p.RSS()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fill(ctx, 0, n, 1000, send); err != nil {
		return err
	}
	took := time.Since(t0)
	u1, err := used()
	if err != nil {
		return err
	}
	rss, err := p.RSS()
	if err != nil {
		return err
	}
	m := memRow{System: "redis", Keys: n, Measure: "used_memory delta", RSSBefore: rss0, RSSAfter: rss,
		BytesPerKey: float64(u1-u0) / float64(n), RSSBytesPerKey: float64(rss-rss0) / float64(n), FillSeconds: took.Seconds()}
	rep.Memory = append(rep.Memory, m)
	log.Printf("memory redis %d keys: %.1f B/key used_memory, %.1f B/key RSS", n, m.BytesPerKey, m.RSSBytesPerKey)
	return nil
}
