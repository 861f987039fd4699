package transport

import (
	"context"
	"fmt"
	"github.com/ringlimit/ringlimit/internal/cputime"
	"net"
	"testing"
	"time"
)

// benchAuths are the connection modes compared side by side.
func benchAuths(b *testing.B) []struct {
	name string
	auth *Auth
} {
	s, c := testTLS(b)
	secret := testSecret('a')
	return []struct {
		name string
		auth *Auth
	}{
		{"plain", nil},
		{"secret", &Auth{Secret: secret}},
		{"tls", &Auth{ServerTLS: s, ClientTLS: c}},
		{"tls+secret", &Auth{Secret: secret, ServerTLS: s, ClientTLS: c}},
	}
}

func benchServe(b *testing.B, auth *Auth) (addr string, stop func()) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	lcfg := DefaultListenerConfig()
	lcfg.Auth = auth
	gl, err := NewListener(ln, lcfg)
	if err != nil {
		b.Fatal(err)
	}
	srv := NewServer(DefaultServerConfig(), HandlerFunc(echo))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(gl) }()
	return ln.Addr().String(), func() { _ = srv.Close(); <-served }
}

// BenchmarkHandshake is the cost of opening one authenticated data-plane
// connection (dial, TLS and/or secret handshake, first batch of one check)
// over loopback.
func BenchmarkHandshake(b *testing.B) {
	for _, m := range benchAuths(b) {
		b.Run(m.name, func(b *testing.B) {
			addr, stop := benchServe(b, m.auth)
			defer stop()
			cfg := DefaultClientConfig()
			cfg.Dial = m.auth.Dial
			ctx := context.Background()
			req, resp := batchOf(1, "r"), &BatchResponse{}
			b.ReportAllocs()
			for b.Loop() {
				c, err := Dial(ctx, addr, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Do(ctx, req, resp); err != nil {
					b.Fatal(err)
				}
				_ = c.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/conn")
		})
	}
}

// BenchmarkRoundTripAuth is BenchmarkRoundTrip through a guarded listener
// in each connection mode: the steady-state cost of authentication (TLS
// record encryption; the secret costs nothing after the handshake).
func BenchmarkRoundTripAuth(b *testing.B) {
	for _, n := range []int{1, 100} {
		for _, m := range benchAuths(b) {
			b.Run(fmt.Sprintf("checks=%d/%s", n, m.name), func(b *testing.B) {
				addr, stop := benchServe(b, m.auth)
				defer stop()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cfg := DefaultClientConfig()
				cfg.Dial = m.auth.Dial
				c, err := Dial(ctx, addr, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				b.ReportAllocs()
				b.SetParallelism(16)
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
				b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/checks, "cpu-ns/check")
			})
		}
	}
}
