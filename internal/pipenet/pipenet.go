// Package pipenet is an in-memory network of net.Pipe connections for
// tests: a server and its client can then run inside a testing/synctest
// bubble, whose fake clock advances only when every goroutine is blocked
// on something the bubble understands (pipes and channels are; sockets
// are not), so the connections' deadlines run on the bubble's clock too.
package pipenet

import (
	"context"
	"net"
	"sync"
)

// Listener accepts the server ends of the connections its Dial makes.
// It is safe for concurrent use.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewListener returns an open Listener.
func NewListener() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for a Dial and returns the server end of its connection,
// or net.ErrClosed once the listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Dial; it may be called more than once.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is a placeholder address, "pipe".
func (l *Listener) Addr() net.Addr { return addr{} }

// Dial makes a connection whose server end the next Accept returns; addr
// is ignored. It fails with net.ErrClosed once the listener is closed, or
// with ctx's error when ctx ends before an Accept takes it.
func (l *Listener) Dial(ctx context.Context, _ string) (net.Conn, error) {
	server, client := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// DialContext is Dial in the shape of net/http's Transport.DialContext.
func (l *Listener) DialContext(ctx context.Context, _, address string) (net.Conn, error) {
	return l.Dial(ctx, address)
}

type addr struct{}

func (addr) Network() string { return "pipe" }
func (addr) String() string  { return "pipe" }
