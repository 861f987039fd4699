// Command httpfloor measures what an HTTP server costs on this machine
// before any rate limiting: the server CPU per POST /v1/check request of
// a handler that reads the body and answers a fixed decision, served by
// net/http, by github.com/valyala/fasthttp, by the event loop (epoll) of
// github.com/lesismal/nbio's nbhttp (the same net/http handler, run by
// its goroutine pool, or inline on the poller), by the event loops of
// github.com/panjf2000/gnet/v2 (epoll driven by the loop itself, not by
// the Go runtime's netpoller, answering inline), and by a raw loop of
// this command's own that does no more per request than one read and one
// write on the connection (the least any server over TCP does, here in
// Go); and what Redis spends answering PING (the least a C event loop
// does per request, with --redis-server); next to ringlimit's own
// single-check path (one or more `ringlimit serve` binaries, e.g. main's
// and a branch's). Every system runs in its own process, all started up
// front on loopback ports the kernel reports free (so two runs at once
// do not meet); the rows are interleaved (round 1: every system, round
// 2: every system, ...) so that the machine's other load falls on all
// alike.
//
// The load is internal/loadgen with the side-by-side's HTTP client (one
// keep-alive connection per caller, the body built by hand, the answer
// decoded with encoding/json); server CPU is utime+stime of the server's
// process from /proc/PID/stat over the row, divided by the requests.
//
//	go run ./cmd/httpfloor --ringlimit main=/tmp/rl-main --ringlimit branch=/tmp/rl-branch
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lesismal/nbio/nbhttp"
	"github.com/valyala/fasthttp"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/bench/internal/httptarget"
	"github.com/ringlimit/ringlimit/bench/internal/proc"
	"github.com/ringlimit/ringlimit/bench/internal/resp"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/loadgen"
)

// answer is the fixed decision the floor servers give.
var answer = []byte(`{"allowed":true,"limit":1000,"remaining":999,"reset_after_ms":1,"retry_after_ms":0,"delay_ms":0,"degraded":false}` + "\n")

const rulesYAML = "rules:\n  - {name: bench, algorithm: token_bucket, limit: 1000, period: 1s, burst: 1000}\n"

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	serve := flag.String("serve", "", "internal: serve the floor with nethttp, fasthttp, nbhttp, nbhttp-inline, gnet or rawtcp on --addr")
	addr := flag.String("addr", "127.0.0.1:0", "internal: listen address of -serve")
	var rls multi
	flag.Var(&rls, "ringlimit", "NAME=BINARY of a ringlimit to measure alongside (repeatable)")
	dur := flag.Duration("duration", 3*time.Second, "length of each row")
	rounds := flag.Int("rounds", 2, "rounds of interleaved rows")
	concs := flag.String("concurrency", "32", "callers (comma-separated)")
	batch := flag.Int("batch", 1, "checks per request")
	floors := flag.Bool("floors", true, "measure the net/http, fasthttp, nbhttp and raw TCP floors")
	redisServer := flag.String("redis-server", "", "the redis-server binary: also measure Redis answering PING")
	flag.Parse()
	if *serve != "" {
		log.Fatal(serveFloor(*serve, *addr))
	}
	if err := run(rls, *floors, *redisServer, *dur, *rounds, *concs, *batch); err != nil {
		log.Fatal(err)
	}
}

// bodies holds the nethttp floor's request body buffers.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// batchAnswers holds the floor's answer to a batch of n checks, by n.
var batchAnswers sync.Map

// floorAnswer is the fixed decision, or, for a batch body, {"results":[…]}
// with the fixed decision once per check (per "key" member of the body):
// an answer as long as ringlimit's, which the load generator reads as it
// reads ringlimit's.
func floorAnswer(body []byte) []byte {
	if !bytes.HasPrefix(body, []byte(`{"checks":`)) {
		return answer
	}
	n := bytes.Count(body, []byte(`"key":`))
	if a, ok := batchAnswers.Load(n); ok {
		return a.([]byte)
	}
	one := bytes.TrimSuffix(answer, []byte("\n"))
	b := append([]byte(nil), `{"results":[`...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, one...)
	}
	b = append(b, "]}\n"...)
	batchAnswers.Store(n, b)
	return b
}

// serveFloor serves the fixed answer with the named server.
func serveFloor(kind, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("%s floor listening on %s", kind, ln.Addr())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/check" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		buf := bodies.Get().(*bytes.Buffer)
		defer bodies.Put(buf)
		buf.Reset()
		_, _ = buf.ReadFrom(http.MaxBytesReader(w, r.Body, api.MaxBodySize))
		hd := w.Header()
		hd["Content-Type"] = []string{"application/json"}
		hd["X-Content-Type-Options"] = []string{"nosniff"}
		_, _ = w.Write(floorAnswer(buf.Bytes()))
	})
	switch kind {
	case "nbhttp", "nbhttp-inline":
		// An event loop (epoll) instead of a goroutine per connection;
		// the same net/http handler, run by nbhttp's goroutine pool or,
		// inline, on the poller that read the request.
		cfg := nbhttp.Config{Network: "tcp", Addrs: []string{addr}, Handler: h, KeepaliveTime: 120 * time.Second,
			Listen: func(string, string) (net.Listener, error) { return ln, nil }}
		if kind == "nbhttp-inline" {
			cfg.ServerExecutor = func(f func()) { f() }
		}
		e := nbhttp.NewEngine(cfg)
		if err := e.Start(); err != nil {
			return err
		}
		select {}
	case "nethttp":
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10}
		return srv.Serve(ln)
	case "fasthttp":
		srv := &fasthttp.Server{
			Handler: func(ctx *fasthttp.RequestCtx) {
				if string(ctx.Path()) != "/v1/check" || !ctx.IsPost() {
					ctx.NotFound()
					return
				}
				body := ctx.PostBody()
				ctx.SetContentType("application/json")
				ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
				ctx.SetBody(floorAnswer(body))
			},
			ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
			MaxRequestBodySize: api.MaxBodySize, ReadBufferSize: 64 << 10,
			NoDefaultServerHeader: true, NoDefaultDate: false,
		}
		return srv.Serve(ln)
	case "gnet":
		return serveGnet(ln)
	case "rawtcp":
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go serveRaw(c)
		}
	}
	return fmt.Errorf("-serve %q: want nethttp, fasthttp, nbhttp, nbhttp-inline, gnet or rawtcp", kind)
}

// serveRaw answers the HTTP/1.1 requests of one keep-alive connection
// with the fixed answer, doing only what any server must: it reads what
// the connection holds (one read, for a request in one segment) and
// writes the answer in one write. It reads the request line and headers
// for Content-Length alone and the body at once from its 64 KiB buffer;
// a request it cannot frame ends the connection. A measuring instrument,
// not a server: no timeouts, no validation.
func serveRaw(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	var out []byte
	for {
		n := 0
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break // the empty line ending the headers
			}
			const cl = "content-length:"
			if len(line) > len(cl) && bytes.EqualFold(line[:len(cl)], []byte(cl)) {
				if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(cl):]))); err != nil {
					return
				}
			}
		}
		if n < 0 || n > r.Size() {
			return
		}
		body, err := r.Peek(n)
		if err != nil {
			return
		}
		a := floorAnswer(body)
		_, _ = r.Discard(n)
		out = append(out[:0], "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
		out = strconv.AppendInt(out, int64(len(a)), 10)
		out = append(out, "\r\n\r\n"...)
		out = append(out, a...)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

type system struct {
	name   string
	p      *proc.Proc
	addr   string
	target loadgen.CheckFunc
}

func run(rls []string, floors bool, redisServer string, dur time.Duration, rounds int, concs string, batch int) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "httpfloor")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var systems []*system
	defer func() {
		for i := len(systems) - 1; i >= 0; i-- {
			systems[i].p.Stop(5 * time.Second)
		}
	}()
	// Every server listens on loopback ports the kernel reports free, so
	// two runs at once do not meet; one whose port was taken meanwhile
	// exits, and WaitUp says so with the end of its log.
	var kinds []string
	if floors {
		kinds = []string{"nethttp", "fasthttp", "nbhttp", "nbhttp-inline", "gnet", "rawtcp"}
	}
	ports, err := proc.FreePorts(len(kinds) + 3*len(rls))
	if err != nil {
		return err
	}
	probe := &http.Client{Timeout: time.Second}
	answers := func(url string, want int) func() bool {
		return func() bool {
			resp, err := probe.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return want == 0 || resp.StatusCode == want
		}
	}
	for i, kind := range kinds {
		a := fmt.Sprintf("127.0.0.1:%d", ports[i])
		p, err := proc.Start(work, kind, self, []string{"-serve", kind, "-addr", a}, nil)
		if err != nil {
			return err
		}
		systems = append(systems, &system{name: kind + " floor", p: p, addr: a})
		if err := proc.WaitUp(ctx, p, kind+" up", 30*time.Second, answers("http://"+a+"/", 0)); err != nil {
			return err
		}
	}
	ports = ports[len(kinds):]
	rules := filepath.Join(work, "rules.yaml")
	if err := os.WriteFile(rules, []byte(rulesYAML), 0o644); err != nil {
		return err
	}
	for i, nb := range rls {
		name, bin, ok := strings.Cut(nb, "=")
		if !ok {
			return fmt.Errorf("--ringlimit %q: want NAME=BINARY", nb)
		}
		a := fmt.Sprintf("127.0.0.1:%d", ports[3*i])
		p, err := proc.Start(work, "ringlimit-"+name, bin, []string{"serve", "--id", name, "--http", a,
			"--raft", fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]), "--peer", fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]),
			"--data-dir", filepath.Join(work, name), "--rules", rules, "--log-level", "warn"}, nil)
		if err != nil {
			return err
		}
		systems = append(systems, &system{name: "ringlimit " + name, p: p, addr: a})
		if err := proc.WaitUp(ctx, p, name+" ready", 60*time.Second, answers("http://"+a+"/readyz", http.StatusOK)); err != nil {
			return err
		}
	}
	hc := &http.Client{Transport: client.NewTransport(64), Timeout: 30 * time.Second}
	for _, s := range systems {
		s.target = httptarget.Ringlimit(hc, s.addr)
	}
	if redisServer != "" {
		p, addr, rc, err := resp.Start(ctx, work, redisServer)
		if err != nil {
			return err
		}
		rc.Close()
		systems = append(systems, &system{name: "redis PING", p: p, addr: addr})
		pool := resp.NewPool(addr, 1024)
		defer pool.Close()
		systems[len(systems)-1].target = redisPing(pool)
	}
	var cs []int
	for _, f := range strings.Split(concs, ",") {
		c, err := strconv.Atoi(f)
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	for _, s := range systems { // warm-up: connections, buckets
		loadgen.Run(ctx, loadgen.Config{Rule: "bench", Keys: 100_000, Seed: 99, Concurrency: 16,
			Batch: batch, Duration: 500 * time.Millisecond, Cost: 1}, []loadgen.CheckFunc{s.target})
	}
	type agg struct{ reqs, cpu float64 }
	sums := map[string]*agg{}
	fmt.Printf("| round | system | c | requests/s | server CPU µs/request | p50 ms | errors |\n|--:|---|--:|--:|--:|--:|--:|\n")
	for r := 1; r <= rounds; r++ {
		for _, c := range cs {
			for _, s := range systems {
				c0, err := s.p.CPU()
				if err != nil {
					return err
				}
				res := loadgen.Run(ctx, loadgen.Config{Rule: "bench", Keys: 100_000, Seed: uint64(r),
					Concurrency: c, Batch: batch, Duration: dur, Cost: 1}, []loadgen.CheckFunc{s.target})
				c1, err := s.p.CPU()
				if err != nil {
					return err
				}
				cpu := (c1 - c0).Seconds()
				fmt.Printf("| %d | %s | %d | %.0f | %.2f | %.3f | %d |\n", r, s.name, c,
					float64(res.Requests)/res.Elapsed.Seconds(), cpu*1e6/float64(res.Requests),
					float64(res.Latency.Quantile(0.5))/1e6, res.Errors)
				k := fmt.Sprintf("%s c=%d", s.name, c)
				if sums[k] == nil {
					sums[k] = &agg{}
				}
				sums[k].reqs += float64(res.Requests)
				sums[k].cpu += cpu
			}
		}
	}
	fmt.Printf("\n| system | server CPU µs/request (all rounds) |\n|---|--:|\n")
	for _, c := range cs {
		for _, s := range systems {
			a := sums[fmt.Sprintf("%s c=%d", s.name, c)]
			fmt.Printf("| %s c=%d | %.2f |\n", s.name, c, a.cpu*1e6/a.reqs)
		}
	}
	return nil
}

// redisPing sends PING once per check of a call, pipelined (one check per
// call: one PING per round trip), and counts each PONG as an admission.
func redisPing(p *resp.Pool) loadgen.CheckFunc {
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		err := p.Pipeline(ctx, func(rc *resp.Conn) {
			for range checks {
				rc.AppendCmd("PING")
			}
		}, len(checks), func(i int, _ int64, s string) { ds[i].Allowed = s == "PONG" })
		if err != nil {
			return 0, err
		}
		return len(checks), nil
	}
}
