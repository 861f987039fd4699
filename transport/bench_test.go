package transport

import (
	"context"
	"fmt"
	"github.com/ringlimit/ringlimit/internal/cputime"
	"net"
	"testing"
	"time"
)

// BenchmarkCodec encodes and decodes a 1000-check batch on 2 rules and its
// answer, into re-used buffers: the steady state of a router and a node.
func BenchmarkCodec(b *testing.B) {
	const n = 1000
	req := batchOf(n, "login", "api")
	resp := &BatchResponse{Epoch: 7, Results: make([]Result, n)}
	for i := range resp.Results {
		resp.Results[i] = Result{Status: StatusOK, Allowed: true, Limit: 100, Remaining: int64(i), ResetAfter: time.Second}
	}
	var reqBuf, respBuf []byte
	var gotReq BatchRequest
	var gotResp BatchResponse
	run := func(b *testing.B, step func()) {
		b.ReportAllocs()
		step()
		cpu := cputime.Process()
		for b.Loop() {
			step()
		}
		checks := float64(b.N * n)
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/checks, "ns/check")
		b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
	}
	b.Run("request", func(b *testing.B) {
		run(b, func() {
			reqBuf = AppendBatchRequest(reqBuf[:0], 1, time.Second, req)
			if _, _, err := DecodeBatchRequest(reqBuf, &gotReq); err != nil {
				b.Fatal(err)
			}
		})
		b.SetBytes(int64(len(reqBuf)))
	})
	// The same batch as groups of two joined checks (version 5).
	joined := batchOf(n, "login", "api")
	for i := 1; i < n; i += 2 {
		joined.Checks[i].Joined = true
	}
	b.Run("request_joined", func(b *testing.B) {
		run(b, func() {
			reqBuf = AppendBatchRequest(reqBuf[:0], 1, time.Second, joined)
			if _, _, err := DecodeBatchRequest(reqBuf, &gotReq); err != nil {
				b.Fatal(err)
			}
		})
		b.SetBytes(int64(len(reqBuf)))
	})
	b.Run("response", func(b *testing.B) {
		run(b, func() {
			respBuf = AppendBatchResponse(respBuf[:0], 1, resp)
			if _, err := DecodeBatchResponse(respBuf, &gotResp); err != nil {
				b.Fatal(err)
			}
		})
		b.SetBytes(int64(len(respBuf)))
	})
	b.Run("both", func(b *testing.B) {
		run(b, func() {
			reqBuf = AppendBatchRequest(reqBuf[:0], 1, time.Second, req)
			if _, _, err := DecodeBatchRequest(reqBuf, &gotReq); err != nil {
				b.Fatal(err)
			}
			respBuf = AppendBatchResponse(respBuf[:0], 1, resp)
			if _, err := DecodeBatchResponse(respBuf, &gotResp); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkRoundTrip sends batches from many goroutines over one loopback
// TCP connection to a server whose handler echoes.
func BenchmarkRoundTrip(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("checks=%d", n), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := NewServer(DefaultServerConfig(), HandlerFunc(echo))
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			defer func() {
				_ = srv.Close()
				<-served
			}()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := Dial(ctx, ln.Addr().String(), DefaultClientConfig())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()

			b.ReportAllocs()
			b.SetParallelism(16) // callers per CPU: enough to keep the pipe full
			cpu := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := batchOf(n, "login", "api")
				var resp BatchResponse
				for pb.Next() {
					if err := c.Do(ctx, req, &resp); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			checks := float64(b.N * n)
			b.ReportMetric(checks/b.Elapsed().Seconds(), "checks/s")
			// Client and server together: the CPU cost of a check's round trip.
			b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
		})
	}
}
