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

// ErrCapReached is wrapped by the errors a Listener hands its ErrorLog
// for connections closed at a cap (at most one a second): a flood, or
// caps too low for the cluster.
var ErrCapReached = errors.New("transport: connection cap reached")

// errEvicted is a handshake's error when it was closed to make room.
var errEvicted = errors.New("transport: handshake closed to make room for a newer connection")

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
	// returned by Accept and not closed yet). A connection beyond it takes
	// the place of one still authenticating, as at MaxHandshakes; when all
	// of them have authenticated it is closed as soon as it is accepted.
	MaxConns int
	// MaxHandshakes is the most connections authenticating at once. A
	// connection accepted while that many are authenticating is not
	// refused: one of those is closed to make room (see Listener), so
	// that peers holding connections open without authenticating cannot
	// lock out the ones that can.
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
	Open       int64 // connections open now (authenticating or accepted; a handshake closed to make room counts until it has ended)
	Accepted   int64 // connections returned by Accept
	OverCap    int64 // closed at once at MaxConns, or a handshake closed to make room at a cap
	AuthFailed int64 // closed: failed or timed out authenticating (authentication configured)
	Idle       int64 // closed: no authentication configured, and no first byte within the handshake timeout
}

// Listener wraps a net.Listener: it accepts on its own goroutine, closes
// connections over its connection cap at once, authenticates the others
// concurrently (a slow or silent peer holds up nobody) and hands out only
// those that passed. It is safe for concurrent use.
//
// At the handshake cap, and at the connection cap while some connections
// are still authenticating, a new connection takes the place of one still
// authenticating, chosen as the likeliest not to be a peer's (see
// worseHandshake): from the host with the most handshakes in progress,
// then silent, then not yet heard from, then the oldest. Refusing the
// newcomer instead (as before) let 128 silent connections, renewed as
// they timed out, keep every new peer out. A flood from another host
// (one address) never closes a peer's handshake; a flood spread over
// many addresses, one connection each, or from the peer's own host
// closes it only when MaxHandshakes newer connections arrive before the
// listener has read the peer's first message (SECURITY.md has figures).
type Listener struct {
	inner net.Listener
	cfg   ListenerConfig
	slots chan struct{} // a token per open connection
	ready chan net.Conn // authenticated connections for Accept

	mu      sync.Mutex
	shaking map[*handshake]struct{} // guarded by mu: connections authenticating
	perHost map[string]int          // guarded by mu: handshakes in shaking by the peer's host
	seq     uint64                  // guarded by mu: accept order of the last handshake

	ctx    context.Context // ends at Close: stops handshakes in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when the accept loop ends
	err    error         // why it ended; written before done is closed

	open, accepted, overCap, authFailed, idle atomic.Int64
	lastRefusalLog                            atomic.Int64 // unix ns
}

// handshake is one connection authenticating.
type handshake struct {
	host   string       // the peer's address without its port
	seq    uint64       // accept order
	start  int64        // when it was accepted, unix ns
	got    atomic.Int64 // bytes read from the peer (counted up to heardBytes)
	cancel context.CancelFunc
	// guarded by the listener's mu:
	evicted    bool // closed to make room for a newer connection
	slotPassed bool // and its connection slot passed to that one
}

// heardConn counts what its handshake read, up to heardBytes.
type heardConn struct {
	net.Conn
	h *handshake
}

func (c *heardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.h.got.Load() < heardBytes {
		c.h.got.Add(int64(n))
	}
	return n, err
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
		inner:   ln,
		cfg:     cfg,
		slots:   make(chan struct{}, cfg.MaxConns),
		ready:   make(chan net.Conn),
		done:    make(chan struct{}),
		shaking: make(map[*handshake]struct{}, cfg.MaxHandshakes),
		perHost: make(map[string]int),
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
		h, ctx, ok := l.admit(nc, !l.take(l.slots))
		if !ok {
			l.refuse(nc, "connection cap")
			continue
		}
		l.open.Add(1)
		l.wg.Add(1)
		go l.authenticate(ctx, nc, h)
	}
}

// admit records nc as authenticating and returns its record and the
// context that ends it. At the handshake cap, or when nc found no free
// connection slot (noSlot), it closes another handshake to make room;
// for noSlot that handshake's slot passes to nc. It fails only for
// noSlot with no handshake in progress: every slot is held by an
// authenticated connection.
func (l *Listener) admit(nc net.Conn, noSlot bool) (*handshake, context.Context, bool) {
	now := time.Now().UnixNano()
	l.mu.Lock()
	var victim *handshake
	if noSlot || len(l.shaking) >= l.cfg.MaxHandshakes {
		if len(l.shaking) == 0 {
			l.mu.Unlock()
			return nil, nil, false
		}
		victim = l.victimLocked(now)
		l.dropLocked(victim)
		victim.evicted, victim.slotPassed = true, noSlot
	}
	ctx, cancel := context.WithCancel(l.ctx)
	h := &handshake{host: hostOf(nc.RemoteAddr()), start: now, cancel: cancel}
	l.seq++
	h.seq = l.seq
	l.shaking[h] = struct{}{}
	l.perHost[h.host]++
	l.mu.Unlock()
	if victim != nil {
		victim.cancel()
		why := "handshake cap"
		if noSlot {
			why = "connection cap"
		}
		l.logRefusal(victim.host, why)
	}
	return h, ctx, true
}

// victimLocked picks the handshake to close at the cap, at now (unix
// ns): see worseHandshake. The caller holds mu and shaking is not empty.
func (l *Listener) victimLocked(now int64) *handshake {
	var v *handshake
	for h := range l.shaking {
		if v == nil || worseHandshake(h, v, l.perHost, now) {
			v = h
		}
	}
	return v
}

// silentAfter is how long a handshake may go unheard before it counts
// as silent: a peer's first message is there at once, but the listener
// reads it only when its goroutine runs, which takes milliseconds on a
// loaded machine.
const silentAfter = 50 * time.Millisecond

// heardBytes is what a handshake must have read to count as heard from:
// less than a peer's first message (the secret handshake's is 43 bytes
// and more, a TLS ClientHello over 100), more than a flood's single byte.
const heardBytes = 32

// worseHandshake reports whether a is likelier than b not to be a peer's
// at now (unix ns): the host first, then what it sent (standing), then
// age. The host comes first because bytes are no proof (a flood can send
// them), while a peer's host has one or two handshakes in progress and a
// flood's the most: with silence first, a flood of one-byte connections
// from another host closed a peer's handshakes just accepted (a re-test:
// 16 of 17 dials failed).
func worseHandshake(a, b *handshake, perHost map[string]int, now int64) bool {
	if an, bn := perHost[a.host], perHost[b.host]; an != bn {
		return an > bn
	}
	if as, bs := a.standing(now), b.standing(now); as != bs {
		return as < bs
	}
	return a.seq < b.seq
}

// standing ranks h at now: 2 heard from (heardBytes read), 1 not yet
// (younger than silentAfter: its first message may be there unread), 0
// silent. A peer is heard from within milliseconds and then outlasts any
// flood that sends less than heardBytes per connection, however fast it
// reconnects; young, it ranks with the flood's young connections and,
// being the newest, outlasts MaxHandshakes of them.
func (h *handshake) standing(now int64) int {
	switch {
	case h.got.Load() >= heardBytes:
		return 2
	case now-h.start < int64(silentAfter):
		return 1
	}
	return 0
}

// dropLocked forgets h; the caller holds mu.
func (l *Listener) dropLocked(h *handshake) {
	delete(l.shaking, h)
	if l.perHost[h.host]--; l.perHost[h.host] <= 0 {
		delete(l.perHost, h.host)
	}
}

// hostOf is addr without its port (the whole address when it has none).
func hostOf(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	s := addr.String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		return host
	}
	return s
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
	l.logRefusal(nc.RemoteAddr(), why)
}

// logRefusal logs a connection closed at a cap, at most once a second.
func (l *Listener) logRefusal(from any, why string) {
	now := time.Now().UnixNano()
	if last := l.lastRefusalLog.Load(); now-last > int64(time.Second) && l.lastRefusalLog.CompareAndSwap(last, now) {
		l.logf(fmt.Errorf("%w: %v: closing connections from %v and others: %s reached", ErrCapReached, l.inner.Addr(), from, why))
	}
}

func (l *Listener) release() {
	l.open.Add(-1)
	<-l.slots
}

func (l *Listener) authenticate(ctx context.Context, nc net.Conn, h *handshake) {
	defer l.wg.Done()
	var c net.Conn
	var err error
	if l.cfg.Auth.Enabled() {
		c, err = l.cfg.Auth.Server(ctx, &heardConn{Conn: nc, h: h}, l.cfg.Names)
	} else {
		c, err = firstByte(ctx, nc, l.cfg.Auth.timeout())
	}
	if hc, ok := c.(*heardConn); ok {
		c = hc.Conn // read on without the handshake's watch
	}
	l.mu.Lock()
	evicted, slotPassed := h.evicted, h.slotPassed
	if !evicted {
		l.dropLocked(h)
	}
	l.mu.Unlock()
	h.cancel()
	if evicted && err == nil {
		err = errEvicted // it finished just as it was closed: its place is taken
	}
	if err != nil {
		_ = nc.Close()
		if slotPassed {
			l.open.Add(-1)
		} else {
			l.release()
		}
		switch {
		case l.ctx.Err() != nil: // closing
		case evicted: // closed to make room for a newer one
			l.overCap.Add(1)
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
	// Counted before the hand-over: counted after, a caller served on
	// the connection could read Stats before the count (a CI flake of
	// TestSilentConnectionsCannotLockPeersOut: the peer's Do answered,
	// Accepted still 0).
	l.accepted.Add(1)
	select {
	case l.ready <- gc:
	case <-l.ctx.Done():
		l.accepted.Add(-1)
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
