package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/router/httpapi"
)

// fakeDrainer is a drainer whose open connections and requests the
// test sets.
type fakeDrainer struct {
	drained atomic.Bool
	open    atomic.Int64
	lastReq atomic.Int64 // Unix ns
}

func (d *fakeDrainer) Drain()         { d.drained.Store(true) }
func (d *fakeDrainer) OpenConns() int { return int(d.open.Load()) }
func (d *fakeDrainer) LastRequest() time.Time {
	if ns := d.lastReq.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// A stop drains first (Drain, then not ready), waits while connections
// are open and still sending, for at most half of its time, then shuts
// down with the rest: at once when the last connection closes, once the
// ones left have sent nothing for httpapi.DrainQuiet, at half time when
// they keep sending. Fake time.
func TestStopDrainingWaitsForConnectionsAtMostHalfItsTime(t *testing.T) {
	const poll = 20 * time.Millisecond
	q := httpapi.DrainQuiet
	for _, tc := range []struct {
		name      string
		closeAt   time.Duration // when the connections close; 0 = never
		sendUntil time.Duration // requests every 100 ms until then; -1 = for ever
		shutAt    time.Duration // when shutdown must be called (+ one poll)
	}{
		{"connections close", 1 * time.Second, -1, 1 * time.Second},
		{"a connection keeps sending", 0, -1, 5 * time.Second},
		{"a connection sends nothing", 0, 0, q},
		{"a connection stops sending", 0, 2 * time.Second, 2*time.Second + q},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &fakeDrainer{}
				d.open.Store(2)
				start := time.Now()
				if tc.closeAt > 0 {
					time.AfterFunc(tc.closeAt, func() { d.open.Store(0) })
				}
				done := make(chan struct{})
				defer close(done)
				if tc.sendUntil != 0 {
					go func() {
						tick := time.NewTicker(100 * time.Millisecond)
						defer tick.Stop()
						for {
							select {
							case <-done:
								return
							case now := <-tick.C:
								if tc.sendUntil > 0 && now.Sub(start) > tc.sendUntil {
									return
								}
								d.lastReq.Store(now.UnixNano())
							}
						}
					}()
				}
				var stopping atomic.Bool
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var shutAt time.Duration
				err := stopDraining(ctx, d, &stopping, func(sctx context.Context) error {
					shutAt = time.Since(start)
					if !d.drained.Load() || !stopping.Load() {
						t.Errorf("shutdown before Drain (%v) and not-ready (%v)", d.drained.Load(), stopping.Load())
					}
					return sctx.Err()
				})
				if err != nil {
					t.Errorf("shutdown saw its context ended: %v (the second half is its own)", err)
				}
				if shutAt < tc.shutAt || shutAt > tc.shutAt+poll {
					t.Errorf("shutdown at %v, want %v (+%v)", shutAt, tc.shutAt, poll)
				}
			})
		})
	}
}

// keptConn is a client connection that sends requests by hand and reads
// their answers, on one keep-alive connection.
type keptConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

// dialKept connects to addr, waiting for it to listen.
func dialKept(t *testing.T, addr string) *keptConn {
	t.Helper()
	var c net.Conn
	eventually(t, addr+" listening", func() bool {
		var err error
		c, err = net.Dial("tcp", addr)
		return err == nil
	})
	t.Cleanup(func() { c.Close() })
	return &keptConn{t: t, c: c, br: bufio.NewReader(c)}
}

// get sends GET path and returns the answer's status, body and whether
// it closes the connection.
func (k *keptConn) get(path string) (int, string, bool) {
	k.t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second)) // bounds a hang only
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		k.t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		k.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), resp.Close
}

// closedByServer reports whether the server closed the connection: the
// next read finds its end.
func (k *keptConn) closedByServer() bool {
	_ = k.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := k.br.ReadByte()
	return errors.Is(err, io.EOF)
}

// drainingAnswer polls path (a readiness check) on k until an answer
// closes the connection, and reports whether it says "stopping": once
// one does, every later one must (readiness turns before the answers
// start closing their connections: stopDraining).
func drainingAnswer(t *testing.T, k *keptConn, path string) (stopping bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		_, body, closes := k.get(path)
		switch says := strings.Contains(body, "stopping"); {
		case stopping && !says:
			t.Fatalf("an answer after one that said stopping: %s", body)
		case closes && !says:
			t.Fatalf("an answer that closed its connection without saying stopping: %s", body)
		case closes:
			return true
		default:
			stopping = says
		}
	}
	t.Fatal("no answer closed the connection within 30s")
	return false
}

// A router's SIGTERM drains: /readyz turns 503 "stopping", its port
// closes, and that answer, like every one from then on, closes its
// connection; with no connection left the router stops at once, not at the end of its
// drain time (2 min here), and exits 0. Was: its port and its keep-alive
// connections closed at once, under clients sending on them. Real
// sockets (runRouter as the command runs it); its one member is down.
func TestRouterStopDrainsItsConnections(t *testing.T) {
	member, httpAddr := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- runRouter(ctx, []string{"--http", httpAddr, "--cluster", member, "--drain-timeout", "2m", "--log-level", "error"},
			func(string) string { return "" }, io.Discard, io.Discard)
	}()
	k := dialKept(t, httpAddr)
	if code, body, closes := k.get("/readyz"); code != 503 || closes {
		t.Fatalf("before the stop: /readyz %d %s, closes %v; want 503 (no view) on a kept connection", code, body, closes)
	}
	cancel()
	if !drainingAnswer(t, k, "/readyz") || !k.closedByServer() {
		t.Errorf("no answer saying stopping closed its connection, or the server left it open")
	}
	if c, err := net.Dial("tcp", httpAddr); err == nil {
		c.Close()
		t.Error("draining: a new connection was accepted; want the port closed")
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("router exited %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the router did not stop within 30s of its last connection closing (its drain is 2m)")
	}
}

// A gateway's SIGTERM drains as a router's does: its client port
// closes, and the next answer on a connection still open closes it; with
// none left it exits 0 at once. Its client sends every 5 ms.
func TestGatewayStopDrainsItsConnections(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: all, path: /*, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listen, dead := freePort(t), freePort(t) // nothing listens on dead
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- runGateway(ctx, []string{"--listen", listen, "--cluster", dead, "--upstream", "http://" + dead,
			"--config", cfg, "--drain-timeout", "2m", "--log-level", "error"}, func(string) string { return "" }, io.Discard, io.Discard)
	}()
	client := dialKept(t, listen)
	if code, body, closes := client.get("/x"); code != 503 || closes {
		t.Fatalf("before the stop: /x %d %s, closes %v; want 503 (no view) on a kept connection", code, body, closes)
	}
	cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if _, _, closes := client.get("/x"); closes {
			break
		}
	}
	if !client.closedByServer() {
		t.Error("the closing answer did not close the connection")
	}
	if c, err := net.Dial("tcp", listen); err == nil {
		c.Close()
		t.Error("draining: a new connection was accepted; want the port closed")
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("gateway exited %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway did not stop within 30s of its last connection closing (its drain is 2m)")
	}
}
