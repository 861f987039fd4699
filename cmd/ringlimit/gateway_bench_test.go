package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

// benchCluster starts n members with a big rule and waits for them.
func benchCluster(b *testing.B, n int) []*testMember {
	var ms []*testMember
	for i := range n {
		join := ""
		if i > 0 {
			join = ms[0].http
		}
		ms = append(ms, startTestMember(b, fmt.Sprintf("n%d", i+1), join))
	}
	eventuallyB(b, func() bool { return settled(ms) })
	if _, err := ms[0].s.Node.PutRules(context.Background(), []limiter.Rule{
		{Name: "big", Algorithm: limiter.TokenBucket, Limit: 1_000_000, Period: time.Second},
	}); err != nil {
		b.Fatal(err)
	}
	eventuallyB(b, func() bool {
		for _, m := range ms {
			if v := m.s.Router.View(); v == nil || v.Rules["big"] == nil {
				return false
			}
		}
		return true
	})
	return ms
}

func eventuallyB(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// latencies runs b.N sequential GETs of url and reports p50/p99 in µs.
func latencies(b *testing.B, hc *http.Client, u string) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		resp, err := hc.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkGatewayAddedLatency: a direct upstream call, then the same
// call through the gateway with the limiter embedded, then through a
// gateway following a 3-member cluster (routing like ringlimit router).
func BenchmarkGatewayAddedLatency(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	hc := &http.Client{Transport: client.NewTransport(4)}
	dir := b.TempDir()
	cfg := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - {name: big, algorithm: token_bucket, limit: 1000000, period: 1s}\nroutes:\n  - {name: all, path: /*, limits: [{rule: big}]}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	serve := func(b *testing.B, o gatewayOpts) string {
		p, err := startGateway(context.Background(), o, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.stopFn(context.Background()) })
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		srv := proxyServer(p.gw)
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(func() { _ = srv.Close() })
		return "http://" + ln.Addr().String() + "/x"
	}
	timeout, refresh, linger, batch, token := router.DefaultConfig().Timeout, time.Second, router.DefaultConfig().Linger, 512, ""
	ff := func(cluster string) followerFlags {
		return followerFlags{cluster: &cluster, adminToken: &token, refresh: &refresh, fwdTimeout: &timeout, linger: &linger, maxBatch: &batch}
	}
	b.Run("direct", func(b *testing.B) { latencies(b, hc, up.URL+"/x") })
	b.Run("embedded", func(b *testing.B) {
		u := serve(b, gatewayOpts{upstream: upURL, config: cfg, dataDir: b.TempDir(), embedded: true, startWait: 30 * time.Second, follower: ff("")})
		latencies(b, hc, u)
	})
	b.Run("cluster3", func(b *testing.B) {
		ms := benchCluster(b, 3)
		u := serve(b, gatewayOpts{upstream: upURL, config: cfg, follower: ff(ms[0].http + "," + ms[1].http)})
		latencies(b, hc, u)
	})
}

// BenchmarkGatewayConcurrent: requests through an embedded gateway from
// 16 concurrent clients (8 per P on 2 cores), the rule never denying:
// ns per request, and the upstream connections the gateway opened per
// thousand requests (kept and reused, or dialed anew).
func BenchmarkGatewayConcurrent(b *testing.B) {
	up, conns := countingUpstream(b, nil)
	upURL, _ := url.Parse(up.URL)
	dir := b.TempDir()
	cfg := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - {name: big, algorithm: token_bucket, limit: 1000000, period: 1s}\nroutes:\n  - {name: all, path: /*, limits: [{rule: big}]}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	timeout, refresh, linger, batch, token, cluster := router.DefaultConfig().Timeout, time.Second, router.DefaultConfig().Linger, 512, "", ""
	ff := followerFlags{cluster: &cluster, adminToken: &token, refresh: &refresh, fwdTimeout: &timeout, linger: &linger, maxBatch: &batch}
	p, err := startGateway(context.Background(), gatewayOpts{upstream: upURL, config: cfg, dataDir: b.TempDir(), embedded: true, startWait: 30 * time.Second, follower: ff}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.stopFn(context.Background()) }()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := proxyServer(p.gw)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	u := "http://" + ln.Addr().String() + "/x"
	hc := &http.Client{Transport: client.NewTransport(64)}
	b.SetParallelism(8)
	conns.Store(0)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := drainedGet(hc, u); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(conns.Load())*1000/float64(b.N), "upstream-conns/1k-req")
}

// BenchmarkClientChecks: checks/s of the Go client at one check per
// call, 1, 8 and 64 concurrent callers, over the data plane (Ring) and
// over HTTP (Client), against one 3-member cluster.
func BenchmarkClientChecks(b *testing.B) {
	ms := benchCluster(b, 3)
	rc, err := client.NewRing(client.RingConfig{Members: []string{ms[0].http, ms[1].http, ms[2].http}})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	eventuallyB(b, rc.Ready)
	hc := client.New(ms[0].http)
	for _, tc := range []struct {
		name string
		c    client.Checker
	}{{"dataplane", rc}, {"http", hc}} {
		for _, callers := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", tc.name, callers), func(b *testing.B) {
				var wg sync.WaitGroup
				per := (b.N + callers - 1) / callers
				b.ResetTimer()
				start := time.Now()
				for w := range callers {
					wg.Go(func() {
						for i := range per {
							if _, err := tc.c.Check(context.Background(), "big", fmt.Sprintf("k%d-%d", w, i%1000), 1); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(per*callers)/time.Since(start).Seconds(), "checks/s")
			})
		}
	}
}
