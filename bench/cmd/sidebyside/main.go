// Command sidebyside measures ringlimit, gubernator and Redis + Lua side
// by side in one run on one machine: the same keys (100,000, uniform),
// the same rule (a token bucket of 1000 per second) and the same
// concurrency levels, driven by the same load loop (internal/loadgen)
// that `ringlimit bench` uses.
//
// It starts every server itself, on loopback ports the kernel reports
// free at the start of each system's step (so two runs at once do not
// meet), and stops each by its PID: ringlimit (1 and 3 members),
// gubernator v2 (the gubernatord daemon of this module, static peers, 1
// and 3 instances) and redis-server. For every row it reports checks/s, p50/p99 per call and
// the servers' CPU per check (utime+stime of the server processes from
// /proc/PID/stat, the delta over the row divided by the checks). Then it
// measures bytes per active key (RSS delta / keys; Redis's used_memory)
// on fresh servers, writes results.json and results.md, and plots
// sidebyside.png. The whole run is bounded by --budget.
//
// bench/run.sh builds the binaries and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	ringlimit, gubernatord, redisServer string
	out, work                           string
	duration, warmup                    time.Duration
	conc                                []int
	keys                                int
	memKeys                             []int
	only                                *regexp.Regexp
	budget                              time.Duration
	batch, pipeline                     int
	redisVersion                        string
	memGOGC                             []string
	serverEnv                           []string // KEY=VALUE set for every ringlimit and gubernator server process
	starts                              int      // ringlimit clusters started, for unique data dirs
	rounds                              int      // times every selected system is measured, in turn
	round                               int      // the round being measured, from 1
}

func main() {
	var o options
	flag.StringVar(&o.ringlimit, "ringlimit", "", "the ringlimit binary")
	flag.StringVar(&o.gubernatord, "gubernatord", "", "the gubernatord binary (bench/cmd/gubernatord)")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary")
	flag.StringVar(&o.out, "out", "results", "directory for results.json, results.md and sidebyside.png")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "length of each measured row")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each system's rows")
	conc := flag.String("concurrency", "1,8,32", "concurrency levels (callers)")
	flag.IntVar(&o.keys, "keys", 100_000, "distinct keys, uniform")
	memKeys := flag.String("mem-keys", "1000000,10000000", "active keys for the memory rows (cumulative; ringlimit fills all, gubernator and Redis the first)")
	only := flag.String("only", "", "regexp: run only the systems whose name matches (ringlimit-1, ringlimit-3, gubernator-1, gubernator-3, redis, memory)")
	flag.DurationVar(&o.budget, "budget", 10*time.Minute, "the whole run stops after this")
	flag.IntVar(&o.batch, "batch", 100, "checks per call in the batched rows")
	flag.IntVar(&o.pipeline, "pipeline", 16, "Redis pipeline depth of the pipelined rows")
	flag.IntVar(&o.rounds, "rounds", 1, "measure the selected systems this many times, in turn (A, B, A, B, …); each row and ratio is then the median of its rounds")
	memGOGC := flag.String("mem-gogc", "", "also measure ringlimit's memory with each of these GOGC values (comma-separated)")
	serverEnv := flag.String("server-env", "", "comma-separated KEY=VALUE pairs set for every ringlimit and gubernator server, e.g. GOMAXPROCS=1 (the machine's rows then differ from a default run: say so)")
	replot := flag.String("replot", "", "only rewrite results.md and sidebyside.png in --out from this results.json")
	flag.Parse()
	var err error
	if *replot != "" {
		b, err := os.ReadFile(*replot)
		if err != nil {
			log.Fatal(err)
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			log.Fatal(err)
		}
		if err := rep.write(o.out); err != nil {
			log.Fatal(err)
		}
		return
	}
	if o.conc, err = ints(*conc); err != nil {
		log.Fatalf("--concurrency: %v", err)
	}
	if o.memKeys, err = ints(*memKeys); err != nil {
		log.Fatalf("--mem-keys: %v", err)
	}
	for g := range strings.SplitSeq(*memGOGC, ",") {
		if g = strings.TrimSpace(g); g != "" {
			o.memGOGC = append(o.memGOGC, g)
		}
	}
	for kv := range strings.SplitSeq(*serverEnv, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			log.Fatalf("--server-env: %q is not KEY=VALUE", kv)
		}
		o.serverEnv = append(o.serverEnv, kv)
	}
	if o.rounds < 1 || o.rounds > 20 {
		log.Fatalf("--rounds %d: must be in 1…20", o.rounds)
	}
	if o.only, err = regexp.Compile(*only); err != nil {
		log.Fatalf("--only: %v", err)
	}
	if o.ringlimit == "" || o.gubernatord == "" {
		log.Fatal("--ringlimit and --gubernatord are required (bench/run.sh builds them)")
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		log.Fatal(err)
	}
	o.work, err = os.MkdirTemp("", "sidebyside-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(o.work)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, o.budget)
	rep, err := run(ctx, &o)
	cancel()
	stop()
	if rep != nil {
		if werr := rep.write(o.out); werr != nil {
			log.Print(werr)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// run measures every system in turn; servers are started and stopped
// per system, so that only one system's processes run at a time.
func run(ctx context.Context, o *options) (*report, error) {
	rep := &report{Started: time.Now().UTC(), LoadBefore: loadAvg(), GoVersion: runtime.Version(),
		CPUs: runtime.NumCPU(), Keys: o.keys, Rule: "token bucket, 1000 per second, burst 1000",
		RowSeconds: o.duration.Seconds(), Batch: o.batch, Pipeline: o.pipeline, ServerEnv: o.serverEnv}
	steps := []struct {
		name string
		f    func(context.Context, *options, *report) error
	}{
		{"ringlimit-1", func(ctx context.Context, o *options, r *report) error { return runRinglimit(ctx, o, r, 1) }},
		{"ringlimit-3", func(ctx context.Context, o *options, r *report) error { return runRinglimit(ctx, o, r, 3) }},
		{"gubernator-1", func(ctx context.Context, o *options, r *report) error { return runGubernator(ctx, o, r, 1) }},
		{"gubernator-3", func(ctx context.Context, o *options, r *report) error { return runGubernator(ctx, o, r, 3) }},
		{"redis", runRedis},
		{"memory", runMemory},
	}
	// finish folds the rounds: rows become the medians of their rounds.
	finish := func() {
		rep.Finished = time.Now().UTC()
		rep.LoadAfter = loadAvg()
		if o.rounds > 1 {
			rep.Rounds, rep.RoundRows = o.rounds, rep.Rows
			rep.Rows = medianRows(rep.RoundRows)
		}
	}
	for o.round = 1; o.round <= o.rounds; o.round++ {
		for _, s := range steps {
			if !o.only.MatchString(s.name) || (s.name == "memory" && o.round > 1) {
				continue // memory does not drift with the machine's speed: once
			}
			log.Printf("== %s, round %d of %d (load %s)", s.name, o.round, o.rounds, loadAvg())
			t0 := time.Now()
			if err := s.f(ctx, o, rep); err != nil {
				finish()
				return rep, fmt.Errorf("%s: %w", s.name, err)
			}
			log.Printf("== %s done in %v", s.name, time.Since(t0).Round(time.Millisecond))
		}
	}
	finish()
	return rep, nil
}

// loadAvg is the first field of /proc/loadavg (the 1-minute load).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func (r *report) write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	if len(r.Rows) == 0 {
		return nil
	}
	return r.plot(filepath.Join(dir, "sidebyside.png"))
}
