package httpapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// countingWriter counts the writes that reach a connection.
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.w.Write(p)
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server *net.TCPConn, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); client.Close() })
	return c.(*net.TCPConn), client
}

// Between cork and uncork, writes are gathered and then written in one;
// outside, each write goes through.
func TestCorkConn(t *testing.T) {
	tc, peer := tcpPair(t)
	out := &countingWriter{w: tc}
	c := &corkConn{TCPConn: tc, out: out}
	write := func(s string) {
		t.Helper()
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	write("a")
	c.cork()
	write("bc")
	write(strings.Repeat("d", 5000))
	if n := out.n.Load(); n != 1 {
		t.Fatalf("%d writes reached the connection while corked, want the 1 before", n)
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	write("e")
	if n := out.n.Load(); n != 3 {
		t.Fatalf("%d writes reached the connection, want 3 (a, the gathered ones, e)", n)
	}
	want := "abc" + strings.Repeat("d", 5000) + "e"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != want {
		t.Fatalf("peer read %d bytes (%v), want them in order", len(got), err)
	}

	c.cork() // nothing gathered: no write
	if err := c.uncork(); err != nil || out.n.Load() != 3 {
		t.Fatalf("empty uncork: %v, %d writes", err, out.n.Load())
	}
	fail := errors.New("gone")
	c.out = errWriter{fail}
	c.cork()
	write("x")
	if err := c.uncork(); !errors.Is(err, fail) {
		t.Fatalf("uncork after a failed write = %v, want %v", err, fail)
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

// countingListener is corkListener with the connections' writes counted.
type countingListener struct {
	net.Listener
	conns chan *countingWriter
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	out := &countingWriter{w: tc}
	l.conns <- out
	return &corkConn{TCPConn: tc, out: out}, nil
}

// Through NewServer's connections a batch answer leaves in one write
// (net/http alone writes one over its 4 KiB buffer in two), intact and
// with its length, on a connection that stays open for the next request;
// an error answer that closes the connection still reaches the client.
func TestServerAnswersInOneWrite(t *testing.T) {
	e := newEnv(t, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln.Addr().String(), e.h)
	cl := countingListener{Listener: ln, conns: make(chan *countingWriter, 2)}
	done := make(chan error, 1)
	go func() { done <- s.Server.Serve(cl) }()
	defer func() {
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := <-cl.conns
	br := bufio.NewReader(c)
	post := func(body string, n int) {
		t.Helper()
		before := out.n.Load()
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.ContentLength != int64(len(got)) {
			t.Fatalf("%d checks: %d, Content-Length %d, %d bytes, %v", n, resp.StatusCode, resp.ContentLength, len(got), err)
		}
		var b api.BatchResponse
		if err := json.Unmarshal(got, &b); err != nil || len(b.Results) != n {
			t.Fatalf("%d checks: answer %.80s…: %v", n, got, err)
		}
		if w := out.n.Load() - before; w != 1 {
			t.Errorf("%d checks: the answer (%d bytes) took %d writes, want 1", n, len(got), w)
		}
	}
	post(batchBody(100, -1, ""), 100)
	post(batchBody(3, -1, ""), 3)
	post(batchBody(300, -1, ""), 300)

	// A body declared over the limit: 413, then the server closes the
	// connection (net/http half-closes it first, through the TCPConn).
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	<-cl.conns
	fmt.Fprintf(c2, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", api.MaxBodySize+1)
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", resp.StatusCode)
	}
}
