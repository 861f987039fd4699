package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/cputime"
	"github.com/ringlimit/ringlimit/limiter"
)

// BenchmarkHTTPCheck is POST /v1/check on one member over loopback HTTP
// (keep-alive, 16 callers per CPU), single and in batches of 100, with
// 100,000 keys: the path the side-by-side run (bench/) measures from
// outside, here in one process so that -cpuprofile and -benchmem see it.
// allocs/op counts both ends (net/http's client included); allocs per
// check on the server side alone are in router/httpapi's benchmarks.
// The client=raw rows use a minimal client instead (see benchRaw): their
// allocs/op and cpu-ns/check are nearly all the server's.
//
//	go test -run=^$ -bench=HTTPCheck -benchmem ./server/
func BenchmarkHTTPCheck(b *testing.B) {
	ls := listen(b)
	s, err := Start(Config{
		ID: "n1", HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
		DataDir: b.TempDir(), RaftTimeout: 300 * time.Millisecond,
	}, ls)
	if err != nil {
		b.Fatal(err)
	}
	shutdownAtCleanup(b, s)
	waitSettled(b, []*Server{s}, 1)
	rule := limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
	if _, err := s.Node.PutRules(context.Background(), []limiter.Rule{rule}); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the bench rule", func() bool { return s.Router.View().Rules["bench"] != nil })
	b.Run("batch=100/client=none", func(b *testing.B) { inProcessChecks(b, s.Handler(), 100) })
	benchRaw(b, s.cfg.HTTPAdvertise)
	url := "http://" + s.cfg.HTTPAdvertise + "/v1/check"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			cpu := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var body []byte
				sink := make([]byte, 64<<10)
				for pb.Next() {
					body = appendCheckBody(body[:0], next.Add(int64(batch)), batch)
					resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					n, _ := io.ReadFull(resp.Body, sink)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("%d %s", resp.StatusCode, sink[:n])
						return
					}
				}
			})
			reportChecks(b, batch, cpu) // client and server together (one process)
		})
	}
}

// benchRaw is single checks from a minimal keep-alive client that writes
// prebuilt requests and reads answers by their Content-Length: nearly
// all of the process's CPU and allocations are then the server's, so
// cpu-ns/check and -cpuprofile show the HTTP front door itself.
func benchRaw(b *testing.B, addr string) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d/client=raw", batch), func(b *testing.B) { rawChecks(b, addr, batch) })
	}
}

func rawChecks(b *testing.B, addr string, batch int) {
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	cpu := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReaderSize(c, 4096)
		var req []byte
		var body []byte
		for pb.Next() {
			body = appendCheckBody(body[:0], next.Add(int64(batch)), batch)
			req = append(req[:0], "POST /v1/check HTTP/1.1\r\nHost: "...)
			req = append(req, addr...)
			req = append(req, "\r\nContent-Type: application/json\r\nContent-Length: "...)
			req = strconv.AppendInt(req, int64(len(body)), 10)
			req = append(req, "\r\n\r\n"...)
			req = append(req, body...)
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			if err := readRawAnswer(br); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportChecks(b, batch, cpu)
}

// inProcessChecks calls the member's HTTP handler directly, with no
// connection, client or net/http server: the CPU per check of the
// handler's own path (decode, router, owner, table, answer), with less of
// the noise of sockets and scheduling.
func inProcessChecks(b *testing.B, h http.Handler, batch int) {
	var next atomic.Int64
	b.ReportAllocs()
	cpu := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var body []byte
		var rd bytes.Reader
		req := httptest.NewRequest("POST", "/v1/check", nil)
		req.Header.Set("Content-Type", "application/json")
		w := &discardWriter{h: http.Header{}}
		for pb.Next() {
			body = appendCheckBody(body[:0], next.Add(int64(batch)), batch)
			rd.Reset(body)
			req.Body, req.ContentLength = io.NopCloser(&rd), int64(len(body))
			clear(w.h)
			w.code = 0
			h.ServeHTTP(w, req)
			if w.code != http.StatusOK {
				b.Errorf("status %d", w.code)
				return
			}
		}
	})
	reportChecks(b, batch, cpu)
}

// discardWriter is an http.ResponseWriter that keeps only the status.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// appendCheckBody appends the body of a POST /v1/check of batch checks of
// rule "bench" on keys key-(base+i) mod 100,000: the single form for one.
func appendCheckBody(body []byte, base int64, batch int) []byte {
	if batch > 1 {
		body = append(body, `{"checks":[`...)
	}
	for i := range batch {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"rule":"bench","key":"key-`...)
		body = strconv.AppendInt(body, (base+int64(i))%100_000, 10)
		body = append(body, `","cost":1}`...)
	}
	if batch > 1 {
		body = append(body, "]}"...)
	}
	return body
}

// reportChecks stops the timer and reports checks/s and the process's CPU
// per check since cpu.
func reportChecks(b *testing.B, batch int, cpu time.Duration) {
	b.StopTimer()
	checks := float64(b.N * batch)
	b.ReportMetric(checks/b.Elapsed().Seconds(), "checks/s")
	b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
}

// readRawAnswer reads one 200 answer, with a Content-Length or chunked.
func readRawAnswer(br *bufio.Reader) error {
	n, chunked := -1, false
	status := true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if status {
			if !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
				return fmt.Errorf("answer %q", line)
			}
			status = false
			continue
		}
		if len(line) <= 2 {
			break
		}
		k, v, _ := bytes.Cut(line, []byte(":"))
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			chunked = true
		}
	}
	if !chunked {
		if n < 0 {
			return fmt.Errorf("answer without Content-Length")
		}
		_, err := br.Discard(n)
		return err
	}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil {
			return fmt.Errorf("chunk size %q", line)
		}
		if _, err := br.Discard(int(size) + 2); err != nil { // the chunk and its CRLF
			return err
		}
		if size == 0 {
			return nil
		}
	}
}
