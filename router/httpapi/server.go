package httpapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server is the http.Server of a node's API. Its Serve hands net/http
// connections that can send a large answer in one write (corkConn).
type Server struct {
	*http.Server
}

// writeTimeout is the Server's WriteTimeout: net/http drops the
// connection of an answer not written within it of the end of the
// request's headers, so the client sees a broken connection instead of
// an error. Handlers that wait answer well inside it (writeBudget).
const writeTimeout = 10 * time.Second

// NewServer returns a Server for h on addr with the timeouts and limits a
// node's API needs against slow or oversized clients: 5s to read the
// headers, 10s to read a request, 10s to write an answer, 120s for an
// idle keep-alive connection, 64 KiB of headers.
func NewServer(addr string, h http.Handler) *Server {
	return &Server{&http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ConnContext:       withCork,
	}}
}

// Serve serves connections from l as http.Server.Serve does; TCP
// connections are wrapped in a corkConn. (The embedded server's other
// ways to serve, ListenAndServe and the TLS ones, work without it.)
func (s *Server) Serve(l net.Listener) error { return s.Server.Serve(corkListener{l}) }

// corkListener wraps the TCP connections l accepts in corkConns.
type corkListener struct{ net.Listener }

func (l corkListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && err == nil {
		return &corkConn{TCPConn: tc, out: tc}, nil
	}
	return c, err
}

// corkConn lets a handler send an answer in one write. net/http writes
// an answer through a 4 KiB buffer: a batch answer of ~11 KiB left in
// two writes (the buffer with the header, then the rest), each a system
// call and, over loopback, a delivery to the peer; the second was ~a
// tenth of the server's CPU per batch. Between cork and uncork, writes
// are gathered and then written at once.
//
// It embeds the *net.TCPConn, so that net/http still finds CloseWrite
// (it half-closes a connection it ends after an error answer) and
// ReadFrom. Only the connection's serving goroutine corks and writes it.
type corkConn struct {
	*net.TCPConn
	out    io.Writer // the connection; a test counts its writes
	corked bool
	buf    *[]byte // the gathered writes, from corkBufs while corked
}

// corkBufs holds the buffers of corked connections, so that an idle
// connection keeps none.
var corkBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxCorkBuf is the largest buffer put back in corkBufs.
const maxCorkBuf = 64 << 10

func (c *corkConn) Write(p []byte) (int, error) {
	if c.corked {
		*c.buf = append(*c.buf, p...)
		return len(p), nil
	}
	return c.out.Write(p)
}

// cork gathers writes until uncork.
func (c *corkConn) cork() {
	c.corked = true
	c.buf = corkBufs.Get().(*[]byte)
	*c.buf = (*c.buf)[:0]
}

// uncork writes what was gathered since cork, in one write, and returns
// its error.
func (c *corkConn) uncork() error {
	c.corked = false
	b := c.buf
	c.buf = nil
	var err error
	if len(*b) > 0 {
		_, err = c.out.Write(*b)
	}
	if cap(*b) <= maxCorkBuf {
		corkBufs.Put(b)
	}
	return err
}

type corkKey struct{}

// withCork is the Server's ConnContext: it makes a corkConn reachable
// from its requests' contexts.
func withCork(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*corkConn); ok {
		return context.WithValue(ctx, corkKey{}, cc)
	}
	return ctx
}

// corkOf returns the corkConn serving a request with context ctx, nil
// when there is none (another server, a test's recorder).
func corkOf(ctx context.Context) *corkConn {
	c, _ := ctx.Value(corkKey{}).(*corkConn)
	return c
}

// writeBodyOnce is writeBody for an answer on connection c (nil: none),
// which it sends in one write when it exceeds net/http's buffers.
func writeBodyOnce(w http.ResponseWriter, c *corkConn, status int, body []byte) {
	if c == nil || len(body) <= chunkingSize {
		// A smaller answer goes out in one write anyway (a handler
		// that flushed one would lose its computed Content-Length).
		writeBody(w, status, body)
		return
	}
	c.cork()
	writeBody(w, status, body)
	// Header and body are written through to the connection (gathered):
	// the flush hands net/http's buffered rest to it too.
	_ = http.NewResponseController(w).Flush()
	_ = c.uncork() // a failed write means the client left; net/http's next read fails
}
