package client_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/server"
)

// exampleMember starts a single-node cluster on loopback with one rule
// ("login": 2 per hour) and returns its HTTP address and a stop function.
func exampleMember() (addr string, stop func()) {
	dir, _ := os.MkdirTemp("", "ringlimit-example")
	var ls server.Listeners
	for _, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
		*l, _ = net.Listen("tcp", "127.0.0.1:0")
	}
	s, err := server.Start(server.Config{ID: "n1", HTTPAdvertise: ls.HTTP.Addr().String(),
		RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(), DataDir: dir}, ls)
	if err != nil {
		panic(err)
	}
	for s.Node.Ready() != nil {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Node.PutRules(context.Background(), []limiter.Rule{
		{Name: "login", Algorithm: limiter.SlidingLog, Limit: 2, Period: time.Hour, FailureMode: limiter.FailClosed},
	}); err != nil {
		panic(err)
	}
	for v := s.Router.View(); v == nil || v.Rules["login"] == nil; v = s.Router.View() {
		time.Sleep(10 * time.Millisecond) // the write reaches the member's router
	}
	return ls.HTTP.Addr().String(), func() { _ = s.Shutdown(context.Background()); os.RemoveAll(dir) }
}

// A Ring follows the cluster and sends each check over the data plane
// to the member that owns the key.
func ExampleRing() {
	addr, stop := exampleMember()
	defer stop()

	rc, err := client.NewRing(client.RingConfig{Members: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer rc.Close()
	for !rc.Ready() { // until then, checks go over HTTP
		time.Sleep(10 * time.Millisecond)
	}
	for range 3 {
		d, err := rc.Check(context.Background(), "login", "alice", 1)
		if err != nil {
			panic(err)
		}
		fmt.Println("allowed:", d.Allowed, "remaining:", d.Remaining)
	}
	// Output:
	// allowed: true remaining: 1
	// allowed: true remaining: 0
	// allowed: false remaining: 0
}

// Middleware limits an http.Handler by an API key, with the same headers
// as the gateway.
func ExampleMiddleware() {
	addr, stop := exampleMember()
	defer stop()

	limited := client.Middleware(client.New(addr), client.MiddlewareConfig{
		Rule:   "login",
		Key:    client.KeyByHeader("X-Api-Key"),
		Window: time.Hour, // login's period, for RateLimit-Policy (a Ring reads it from its view)
	})(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "welcome")
	}))
	srv := httptest.NewServer(limited)
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
		req.Header.Set("X-Api-Key", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	// Output:
	// 200 "login";r=1;t=3600
	// 200 "login";r=0;t=3600
	// 429 "login";r=0;t=3600
}
