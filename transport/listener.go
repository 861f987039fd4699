package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ListenerConfig configures a guarded Listener.
type ListenerConfig struct {
	// Auth authenticates every connection before Accept returns it; nil
	// (or not Enabled) authenticates nothing, but a connection is still
	// only returned once its first byte arrived within HandshakeTimeout,
	// so idle connections never reach the server behind.
	Auth *Auth
	// Names are the addresses dialers reach this listener by (host:port,
	// as they dial it: the advertised address). With a cluster secret a
	// dialer must name one of them in its handshake, so that a
	// handshake relayed from elsewhere fails. Empty: the inner
	// listener's own address.
	Names []string
	// MaxConns is the most connections open at once (authenticating or
	// returned by Accept and not closed yet). Connections beyond it are
	// closed as soon as they are accepted.
	MaxConns int
	// MaxHandshakes is the most connections authenticating at once.
	MaxHandshakes int
	// IdleTimeout, if positive, closes a returned connection on which no
	// byte arrived for that long: every Read sets a read deadline. Only for
	// consumers that set no read deadlines of their own (Raft); the data
	// plane's Server has its own idle timeout.
	IdleTimeout time.Duration
	// ErrorLog, if set, receives failed handshakes and refused connections
	// (at most one refusal per second). It is called concurrently.
	ErrorLog func(error)
}

// DefaultListenerConfig returns 1024 connections, 128 handshakes at once,
// no idle timeout and no authentication.
func DefaultListenerConfig() ListenerConfig {
	return ListenerConfig{MaxConns: 1024, MaxHandshakes: 128}
}

// Validate reports whether c is usable. It changes nothing.
func (c ListenerConfig) Validate() error {
	if c.MaxConns < 1 {
		return fmt.Errorf("%w: MaxConns %d must be positive", ErrInvalidConfig, c.MaxConns)
	}
	if c.MaxHandshakes < 1 {
		return fmt.Errorf("%w: MaxHandshakes %d must be positive", ErrInvalidConfig, c.MaxHandshakes)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, c.IdleTimeout)
	}
	return c.Auth.Validate()
}

// ListenerStats counts what a Listener turned away.
//
// Without authentication a connection that its peer closes before
// sending a byte is in none of them: nothing was refused (a joining
// member's address is probed that way, and so may a load balancer's TCP
// check). With authentication that counts in AuthFailed: the listener
// cannot tell it from a peer that gave up on the handshake.
type ListenerStats struct {
	Open       int64 // connections open now (authenticating or accepted)
	Accepted   int64 // connections returned by Accept
	OverCap    int64 // closed at once: MaxConns or MaxHandshakes reached
	AuthFailed int64 // closed: failed or timed out authenticating (authentication configured)
	Idle       int64 // closed: no authentication configured, and no first byte within the handshake timeout
}

// Listener wraps a net.Listener: it accepts on its own goroutine, closes
// connections over its caps at once, authenticates the others
// concurrently (a slow or silent peer holds up nobody) and hands out only
// those that passed. It is safe for concurrent use.
type Listener struct {
	inner net.Listener
	cfg   ListenerConfig
	slots chan struct{} // a token per open connection
	hs    chan struct{} // a token per connection authenticating
	ready chan net.Conn // authenticated connections for Accept

	ctx    context.Context // ends at Close: stops handshakes in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when the accept loop ends
	err    error         // why it ended; written before done is closed

	open, accepted, overCap, authFailed, idle atomic.Int64
	lastRefusalLog                            atomic.Int64 // unix ns
}

// NewListener starts guarding ln. It fails only on an invalid cfg.
func NewListener(ln net.Listener, cfg ListenerConfig) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Names) == 0 {
		cfg.Names = []string{ln.Addr().String()}
	}
	l := &Listener{
		inner: ln,
		cfg:   cfg,
		slots: make(chan struct{}, cfg.MaxConns),
		hs:    make(chan struct{}, cfg.MaxHandshakes),
		ready: make(chan net.Conn),
		done:  make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Accept returns the next authenticated connection. After Close it
// returns an error wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		// A connection may have been handed over just as the loop ended.
		select {
		case c := <-l.ready:
			return c, nil
		default:
		}
		return nil, l.err
	}
}

// Close stops accepting, closes the inner listener, aborts handshakes in
// progress and waits for them. Connections already returned by Accept
// stay open.
func (l *Listener) Close() error {
	l.cancel()
	err := l.inner.Close()
	l.wg.Wait()
	return err
}

// Addr returns the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Stats returns the listener's counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{Open: l.open.Load(), Accepted: l.accepted.Load(), OverCap: l.overCap.Load(),
		AuthFailed: l.authFailed.Load(), Idle: l.idle.Load()}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		nc, err := l.inner.Accept()
		if err != nil {
			if l.ctx.Err() == nil && temporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-l.ctx.Done():
					t.Stop()
				}
				continue
			}
			if l.ctx.Err() != nil {
				err = fmt.Errorf("transport: listener closed: %w", net.ErrClosed)
			}
			l.err = err
			close(l.done)
			return
		}
		backoff = 0
		if !l.take(l.slots) {
			l.refuse(nc, "connection cap")
			continue
		}
		if !l.take(l.hs) {
			<-l.slots
			l.refuse(nc, "handshake cap")
			continue
		}
		l.open.Add(1)
		l.wg.Add(1)
		go l.authenticate(nc)
	}
}

func (l *Listener) take(sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *Listener) refuse(nc net.Conn, why string) {
	_ = nc.Close()
	l.overCap.Add(1)
	now := time.Now().UnixNano()
	if last := l.lastRefusalLog.Load(); now-last > int64(time.Second) && l.lastRefusalLog.CompareAndSwap(last, now) {
		l.logf(fmt.Errorf("transport: %v: refusing connections from %v and others: %s reached", l.inner.Addr(), nc.RemoteAddr(), why))
	}
}

func (l *Listener) release() {
	l.open.Add(-1)
	<-l.slots
}

func (l *Listener) authenticate(nc net.Conn) {
	defer l.wg.Done()
	var c net.Conn
	var err error
	if l.cfg.Auth.Enabled() {
		c, err = l.cfg.Auth.Server(l.ctx, nc, l.cfg.Names)
	} else {
		c, err = firstByte(l.ctx, nc, l.cfg.Auth.timeout())
	}
	<-l.hs
	if err != nil {
		_ = nc.Close()
		l.release()
		switch {
		case l.ctx.Err() != nil: // closing
		case l.cfg.Auth.Enabled():
			l.authFailed.Add(1)
			l.logf(err)
		case errors.Is(err, os.ErrDeadlineExceeded):
			l.idle.Add(1)
			l.logf(err)
		default:
			// The peer closed (or reset) it before a byte: a probe of
			// this address, not a refusal.
		}
		return
	}
	gc := &guardedConn{Conn: c, l: l}
	if l.cfg.IdleTimeout > 0 {
		gc.idle = l.cfg.IdleTimeout
	}
	select {
	case l.ready <- gc:
		l.accepted.Add(1)
	case <-l.ctx.Done():
		_ = gc.Close()
	}
}

func (l *Listener) logf(err error) {
	if l.cfg.ErrorLog != nil {
		l.cfg.ErrorLog(err)
	}
}

// guardedConn gives its listener slot back when closed, and applies the
// idle timeout.
type guardedConn struct {
	net.Conn
	l    *Listener
	idle time.Duration
	once sync.Once
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

func (c *guardedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// firstByte waits (bounded by timeout and ctx) for the first byte of an
// unauthenticated connection and returns a connection that reads it again.
func firstByte(ctx context.Context, nc net.Conn, timeout time.Duration) (net.Conn, error) {
	if err := nc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	pc := &peekedConn{Conn: nc}
	n, err := nc.Read(pc.first[:])
	if n == 0 {
		switch {
		case err == nil:
			err = errors.New("empty read")
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil:
			return nil, fmt.Errorf("transport: %v sent nothing within %v: %w", nc.RemoteAddr(), timeout, err)
		}
		return nil, fmt.Errorf("transport: %v closed before sending anything: %w", nc.RemoteAddr(), err)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err := nc.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	pc.has = true
	return pc, nil
}

// peekedConn returns its first byte again before reading on.
type peekedConn struct {
	net.Conn
	first [1]byte
	has   bool // only touched by the single reader
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if c.has && len(p) > 0 {
		p[0] = c.first[0]
		c.has = false
		return 1, nil
	}
	return c.Conn.Read(p)
}
