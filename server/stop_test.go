package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// A member stopped right after Start returns stops. serve does that when
// the cluster refuses its id as a live member's (Conflict), which can be
// answered before Start returns; the goroutine that serves HTTP may then
// not have run yet, and fasthttp's Shutdown before its Serve changes
// nothing: Serve then accepted for ever and stop waited for it (a
// duplicate process that never exited, seen under load in
// cmd/ringlimit's TestServeDuplicateIDExits). With one P the new
// goroutines run only once the stopping one blocks, as under load.
func TestStopRightAfterStart(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 10 {
		ls := listen(t)
		s, err := Start(Config{
			ID: "n1", HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: t.TempDir(), Ring: ring.Config{Partitions: 16, ReplicationFactor: 16, Load: 1.25},
			RaftTimeout: testRaftTimeout, Logger: testLogger(),
		}, ls)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		done := make(chan error, 1)
		go func() { done <- s.Abort(ctx) }()
		select {
		case <-done:
			cancel()
		case <-time.After(15 * time.Second):
			cancel()
			_ = ls.HTTP.Close() // let the stuck stop end
			t.Fatal("Abort right after Start has not returned after 15s")
		}
	}
}

// A member's graceful stop, its partitions handed off, drains its HTTP
// connections before it closes them: its port closes, and the next
// answer on a connection still open (503 "stopping") closes it, so that
// keep-alive clients reconnect to another member after an answer. Was:
// the port and every idle connection closed at once, under clients that
// were sending on one (EOF or a reset on a request that had left).
// Polled every 5 ms on one kept connection.
func TestGracefulStopClosesConnectionsAfterAnAnswer(t *testing.T) {
	ss := startCluster(t, 2)
	addr := ss[1].cfg.HTTPAdvertise
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	get := func() (int, string, bool, error) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // bounds a hang only
		if _, err := io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return 0, "", false, err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, "", false, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), resp.Close, nil
	}
	if code, body, closes, err := get(); err != nil || code != 200 || closes {
		t.Fatalf("before the stop: /readyz %d %s, closes %v, %v; want 200 on a kept connection", code, body, closes, err)
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- ss[1].Shutdown(ctx)
	}()
	// A client idle between its requests, as most are: a connection
	// idle when the port closed was closed under its next request.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		code, body, closes, err := get()
		if err != nil {
			t.Fatalf("the connection failed before an answer closed it: %v", err)
		}
		if !closes {
			continue // ready, then stopping while it hands off
		}
		if code != 503 || !strings.Contains(body, "stopping") {
			t.Fatalf("the answer that closed the connection: %d %s; want 503 stopping", code, body)
		}
		break
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the closing answer: %v, want EOF", err)
	}
	if c2, err := net.Dial("tcp", addr); err == nil {
		c2.Close()
		t.Error("a new connection was accepted after the closing answer; want the port closed")
	}
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
}
