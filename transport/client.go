package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Client sends batches to one peer address over one long-lived, pipelined
// connection. Any number of goroutines may call Do at once: their frames are
// coalesced by the connection's writer and their answers are matched by
// request id by its reader. When the connection breaks, the calls in flight
// fail with ErrConnClosed and the next call dials again (once at a time; a
// failed dial makes calls fail fast for RedialBackoff). Do never resends a
// batch that may have reached the peer: checks consume budget, so the
// caller decides.
type Client struct {
	addr   string
	cfg    ClientConfig
	now    func() time.Time
	calls  sync.Pool      // of *call
	frames sync.Pool      // of *[]byte: Go's encoded frames, owned by its start until written
	wg     sync.WaitGroup // goroutines of every connection

	mu        sync.Mutex
	cc        *clientConn              // guarded by mu: current connection, may be broken
	retired   map[*clientConn]struct{} // guarded by mu: presumed dead, still finishing their calls (retire)
	dialing   *dialCall                // guarded by mu: the dial in progress, nil when none
	dialErr   error                    // guarded by mu: the last dial's error
	dialErrAt time.Time                // guarded by mu
	closed    bool                     // guarded by mu
	// stop ends with Close (cancel): it bounds the dials, which no
	// caller's context does (see conn).
	stop   context.Context
	cancel context.CancelFunc

	// beforeGoWrite, set by tests only, runs in Go's start between the
	// call's registration and the write of its frame.
	beforeGoWrite func()
}

// Dial connects to addr and returns a Client for it. ctx bounds the dial
// only.
func Dial(ctx context.Context, addr string, cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := newClient(addr, cfg)
	if _, err := c.connWithin(ctx, 0); err != nil { // ctx alone bounds the first dial
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func newClient(addr string, cfg ClientConfig) *Client {
	c := &Client{addr: addr, cfg: cfg, now: time.Now}
	c.stop, c.cancel = context.WithCancel(context.Background())
	c.calls.New = func() any { return &call{done: make(chan error, 1)} }
	c.frames.New = func() any { return new([]byte) }
	return c
}

// Addr returns the address the client dials.
func (c *Client) Addr() string { return c.addr }

// Do sends req and waits for the answer, which it decodes into resp
// (reusing resp.Results). ctx's deadline travels with the batch; when ctx
// ends first, Do returns ctx.Err() and the late answer is dropped. Other
// errors: *TooManyChecksError or *FrameTooLargeError (nothing sent), a dial
// error, an error wrapping ErrConnClosed (the batch may or may not have been
// decided), *RemoteError, or an error wrapping ErrMalformedFrame for an
// answer that does not decode or does not match the request. On error the
// contents of *resp are unspecified. req is not retained after Do returns.
// While MaxPendingWrite bytes of other callers' frames wait to be written,
// Do waits for room without watching ctx; WriteTimeout bounds that wait.
func (c *Client) Do(ctx context.Context, req *BatchRequest, resp *BatchResponse) error {
	if req == nil || resp == nil {
		return errors.New("transport: Do with nil request or response")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(req.Checks) > c.cfg.Limits.maxChecks() {
		return &TooManyChecksError{Count: uint64(len(req.Checks)), Limit: c.cfg.Limits.maxChecks()}
	}
	return c.call(ctx, func(cc *clientConn) (bool, error) { return cc.do(ctx, req, resp) })
}

// Go sends req as Do does, without a goroutine waiting for the answer:
// done is called exactly once, with the error Do would return (nil when
// *resp holds the answer), on the goroutine that reads the connection, on
// a timer's when deadline passes first (context.DeadlineExceeded), or on
// the caller's own before Go returns when nothing could be sent. done must
// be quick and must not block on anything that waits for this client. req
// is not retained after Go returns; resp belongs to the call until done.
//
// Go saves Do's waiting goroutine and its context per batch; the router
// sends its batches with it. When the connection is down, the caller
// waits (up to deadline) for a dial bounded by DialTimeout. Unlike
// Do, Go does not wait for room behind MaxPendingWrite bytes of other
// frames: past them it fails at once with ErrQueueFull (nothing sent).
func (c *Client) Go(deadline time.Time, req *BatchRequest, resp *BatchResponse, done func(error)) {
	if req == nil || resp == nil {
		done(errors.New("transport: Go with nil request or response"))
		return
	}
	if len(req.Checks) > c.cfg.Limits.maxChecks() {
		done(&TooManyChecksError{Count: uint64(len(req.Checks)), Limit: c.cfg.Limits.maxChecks()})
		return
	}
	for attempt := 0; ; attempt++ {
		cc, err := c.connBy(deadline)
		if err != nil {
			done(err)
			return
		}
		sent, err := cc.start(deadline, req, resp, done)
		if err == nil {
			return // done is the call's now
		}
		if redialOnce(attempt, sent, err) {
			continue
		}
		done(err)
		return
	}
}

// connBy is conn for a caller with a deadline instead of a context: a
// healthy connection is returned without making one.
func (c *Client) connBy(deadline time.Time) (*clientConn, error) {
	c.mu.Lock()
	if cc := c.cc; cc != nil && !c.closed && cc.healthy() {
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return c.conn(ctx)
}

// call runs one round trip on a healthy connection; when the connection
// broke before the frame left, it redials once and tries again.
func (c *Client) call(ctx context.Context, rt func(*clientConn) (sent bool, err error)) error {
	for attempt := 0; ; attempt++ {
		cc, err := c.conn(ctx)
		if err != nil {
			return err
		}
		sent, err := rt(cc)
		if redialOnce(attempt, sent, err) {
			continue
		}
		return err
	}
}

// redialOnce reports whether a call should be tried again on a new
// connection: its first attempt failed because the connection broke
// before the frame left (not because the client was closed).
func redialOnce(attempt int, sent bool, err error) bool {
	return err != nil && !sent && attempt == 0 && errors.Is(err, ErrConnClosed) && !errors.Is(err, ErrClientClosed)
}

// conn returns a healthy connection, dialing one if needed.
//
// The dial runs on a goroutine of its own, bounded by DialTimeout and
// Close, not by ctx: every caller waits for it, up to its own ctx or
// until the dial has gone on for SlowDial (then ErrDialSlow: a peer that
// answers no dial fails its calls fast, as a refused dial does), and
// its error (cached for RedialBackoff) is the peer's alone. Was: dialed
// under the context of the call that found the connection down, so one
// call with a short deadline failed the dial ("i/o timeout", a moment
// before its ctx said so), the failure was cached, and every caller got
// it for RedialBackoff — a router then took the owner for gone and
// answered all its checks by their failure mode for a second (an audit:
// up to 2,344 fail-open answers in a healthy cluster).
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	return c.connWithin(ctx, c.cfg.SlowDial)
}

// connWithin is conn with slowDial for SlowDial (0: wait for the dial up
// to ctx alone, as Dial does).
func (c *Client) connWithin(ctx context.Context, slowDial time.Duration) (*clientConn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClientClosed
		}
		if c.cc != nil && c.cc.healthy() {
			cc := c.cc
			c.mu.Unlock()
			return cc, nil
		}
		d := c.dialing
		if d == nil {
			if c.dialErr != nil && c.now().Sub(c.dialErrAt) < c.cfg.RedialBackoff {
				err := c.dialErr
				c.mu.Unlock()
				return nil, err
			}
			d = &dialCall{done: make(chan struct{}), started: c.now()}
			c.dialing = d
			c.wg.Add(1)
			go c.dialFor(d)
		}
		var slowC <-chan time.Time // nil: no bound (SlowDial 0)
		if slowDial > 0 {
			left := slowDial - c.now().Sub(d.started)
			if left <= 0 {
				c.mu.Unlock()
				return nil, d.slow(c)
			}
			slow := time.NewTimer(left)
			defer slow.Stop()
			slowC = slow.C
		}
		c.mu.Unlock()
		select {
		case <-d.done:
			if d.err != nil {
				return nil, d.err
			}
			// Dialed: the loop takes the new connection.
		case <-slowC:
			return nil, d.slow(c)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// dialCall is one dial, shared by the callers that wait for it.
type dialCall struct {
	done    chan struct{} // closed once err is set and the connection (if any) is c.cc
	err     error
	started time.Time // on c.now's clock
}

// slow is the error of a call that met d going on for SlowDial or more.
func (d *dialCall) slow(c *Client) error {
	return fmt.Errorf("%w: dialing %s for %v", ErrDialSlow, c.addr, c.now().Sub(d.started).Round(time.Millisecond))
}

// dialFor dials for d, makes the connection c.cc and ends d.
func (c *Client) dialFor(d *dialCall) {
	defer c.wg.Done()
	nc, err := c.dial(c.stop)
	c.mu.Lock()
	c.dialing = nil
	switch {
	case c.closed:
		if nc != nil {
			_ = nc.Close()
		}
		err = ErrClientClosed
	case err != nil:
		c.dialErr, c.dialErrAt = err, c.now()
	default:
		c.dialErr = nil
		c.cc = newClientConn(c, nc)
	}
	d.err = err
	c.mu.Unlock()
	close(d.done)
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	var nc net.Conn
	var err error
	if c.cfg.Dial != nil {
		nc, err = c.cfg.Dial(ctx, c.addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", c.addr)
	}
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", c.addr, err)
	}
	return nc, nil
}

// Close closes the connection, fails the calls in flight with an error
// wrapping ErrClientClosed and ErrConnClosed, and waits for the client's
// goroutines to end. Later calls return ErrClientClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.cancel() // a dial in progress
	ccs := []*clientConn{c.cc}
	for cc := range c.retired {
		ccs = append(ccs, cc)
	}
	c.mu.Unlock()
	for _, cc := range ccs {
		if cc != nil {
			cc.fail(ErrClientClosed)
		}
	}
	c.wg.Wait()
	return nil
}

// call is one Do waiting for its answer. Calls are pooled: a call is reused
// only after its done channel delivered, or after Do removed it from
// pending itself (then nothing else holds it).
type call struct {
	done chan error // capacity 1: exactly one send per registration
	resp *BatchResponse
	ack  *PushAck // for a push instead of a batch
	want int      // number of results expected
	buf  []byte   // the encoded request

	// A call of Go: fn takes the answer instead of done, and timer ends
	// the call at its deadline. Both are set before the call is pending.
	fn    func(error)
	timer *time.Timer
}

// clientConn is one connection of a Client.
type clientConn struct {
	c      *Client
	nc     net.Conn
	w      *frameWriter
	nextID atomic.Uint64
	broken atomic.Bool // set once err is set
	// retired is set once the connection is presumed dead (retire): new
	// calls go to a new one, the calls in flight finish here.
	retired atomic.Bool
	// lastRead is when the last frame was read (Unix ns): a call that
	// times out with nothing read since it was sent condemns the
	// connection.
	lastRead atomic.Int64

	mu      sync.Mutex
	pending map[uint64]*call // guarded by mu; nil once broken
	err     error            // guarded by mu: why the connection broke
	lifeEnd *time.Timer      // guarded by mu: ends a retired connection after retiredLife
}

func newClientConn(c *Client, nc net.Conn) *clientConn {
	cc := &clientConn{
		c:       c,
		nc:      nc,
		w:       newFrameWriter(nc, c.cfg.WriteTimeout, c.cfg.MaxPendingWrite, false),
		pending: make(map[uint64]*call),
	}
	cc.lastRead.Store(time.Now().UnixNano()) // silence counts from the dial
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		cc.w.run()
	}()
	go func() {
		defer c.wg.Done()
		cc.readLoop()
	}()
	return cc
}

// deadConnSilence is how long a connection may return nothing while a
// call on it times out before it is presumed dead and retired.
const deadConnSilence = time.Second

// retiredLife bounds how long a retired connection stays open for the
// calls still in flight on it (those with no deadline, in particular).
const retiredLife = time.Minute

// healthy reports whether new calls may use the connection.
func (cc *clientConn) healthy() bool { return !cc.broken.Load() && !cc.retired.Load() }

// do sends one batch and waits for its answer. sent is false when the batch
// certainly did not leave this process.
func (cc *clientConn) do(ctx context.Context, req *BatchRequest, resp *BatchResponse) (sent bool, err error) {
	return cc.roundTrip(ctx, func(dst []byte, id uint64, budget int64) []byte {
		return AppendBatchRequest(dst, id, time.Duration(budget), req)
	}, resp, nil, len(req.Checks))
}

// roundTrip sends the frame encode writes and waits for its answer, a
// BatchResponse into resp or a PushAck into ack. want is the number of
// results (or statuses) expected.
func (cc *clientConn) roundTrip(ctx context.Context, encode func(dst []byte, id uint64, budget int64) []byte, resp *BatchResponse, ack *PushAck, want int) (sent bool, err error) {
	var budget time.Duration
	if d, ok := ctx.Deadline(); ok {
		if budget = time.Until(d); budget <= 0 {
			return false, context.DeadlineExceeded
		}
	}
	cl := cc.c.calls.Get().(*call)
	defer cc.c.calls.Put(cl)
	id := cc.nextID.Add(1)
	cl.buf = encode(cl.buf[:0], id, int64(budget))
	if limit := cc.c.cfg.Limits.maxFrame(); len(cl.buf) > limit {
		return false, &FrameTooLargeError{Size: uint64(len(cl.buf)), Limit: limit}
	}
	cl.resp, cl.ack, cl.want = resp, ack, want
	defer func() { cl.resp, cl.ack = nil, nil }()

	cc.mu.Lock()
	if cc.err != nil {
		err := cc.err
		cc.mu.Unlock()
		return false, err
	}
	cc.pending[id] = cl
	cc.mu.Unlock()

	sentAt := time.Now().UnixNano()
	if err := cc.w.write(cl.buf); err != nil {
		cc.fail(err)
		if !cc.forget(id) {
			<-cl.done // the teardown owns the call: wait for it to let go
		}
		return false, cc.failure()
	}
	select {
	case err := <-cl.done:
		return true, err
	case <-ctx.Done():
		if cc.forget(id) {
			// A caller that gave up (its own client went away) says nothing
			// of the peer; only a deadline that passed unanswered does.
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				cc.failIfSilent(sentAt)
			}
			return true, ctx.Err()
		}
		// The reader is delivering the answer right now (it has the whole
		// frame in memory, so this wait is short): take it.
		return true, <-cl.done
	}
}

// start sends one batch for Go. It returns a nil error once the call is
// pending (its fn then gets the answer), or the error for Go to report
// (fn not called); sent is false when the batch certainly did not leave
// this process.
func (cc *clientConn) start(deadline time.Time, req *BatchRequest, resp *BatchResponse, fn func(error)) (sent bool, err error) {
	budget := time.Until(deadline)
	if budget <= 0 {
		return false, context.DeadlineExceeded
	}
	// The frame is encoded into a buffer of start's own, not the call's:
	// once the call is pending, its timer or the connection's failure may
	// deliver and recycle it before writeNow below has copied the frame,
	// and a Go reusing the call would encode its batch into the bytes
	// being written (was: that batch sent twice, or a torn frame).
	fp := cc.c.frames.Get().(*[]byte)
	defer cc.c.putFrame(fp)
	id := cc.nextID.Add(1)
	*fp = AppendBatchRequest((*fp)[:0], id, budget, req)
	frame := *fp
	if limit := cc.c.cfg.Limits.maxFrame(); len(frame) > limit {
		return false, &FrameTooLargeError{Size: uint64(len(frame)), Limit: limit}
	}
	cl := cc.c.calls.Get().(*call)
	cl.resp, cl.want, cl.fn = resp, len(req.Checks), fn
	sentAt := time.Now().UnixNano()

	cc.mu.Lock()
	if cc.err != nil {
		err := cc.err
		cc.mu.Unlock()
		cc.recycle(cl)
		return false, err
	}
	cc.pending[id] = cl
	// Armed under mu: whoever takes the call out of pending finds it set.
	// Close waits for it (counted in wg until it ran or was stopped), as
	// for every goroutine of the client: its fn runs on the timer's.
	cc.c.wg.Add(1)
	cl.timer = time.AfterFunc(budget, func() {
		defer cc.c.wg.Done()
		cc.expire(id, sentAt)
	})
	cc.mu.Unlock()

	if cc.c.beforeGoWrite != nil {
		cc.c.beforeGoWrite()
	}
	if err := cc.w.writeNow(frame); err != nil { // written or copied when it returns
		full := errors.Is(err, ErrQueueFull) // the connection goes on
		if !cc.forget(id) {
			if !full {
				cc.fail(err) // its timer or a failure answered it already
			}
			return true, nil
		}
		cc.recycle(cl)
		if full {
			return false, err
		}
		cc.fail(err)
		return false, cc.failure()
	}
	return true, nil
}

// putFrame returns a frame buffer of start's to the pool, unless it grew
// past 1 MiB (a rare huge batch should not pin its buffer).
func (c *Client) putFrame(fp *[]byte) {
	if cap(*fp) <= 1<<20 {
		c.frames.Put(fp)
	}
}

// expire ends a call of Go whose deadline passed before its answer.
func (cc *clientConn) expire(id uint64, sentAt int64) {
	cl := cc.take(id)
	if cl == nil {
		return // answered, or failed with the connection
	}
	cc.failIfSilent(sentAt)
	cc.deliver(cl, context.DeadlineExceeded)
}

// failIfSilent is for a call sent at sentAt (Unix ns) whose deadline
// passed: when not one frame has come back since it left, and none for
// deadConnSilence, the peer or the path may be gone (a network cut leaves
// TCP silent, not closed), so the connection is retired: the next call
// dials afresh instead of waiting on a dead one.
//
// The calls still in flight on it are not failed: a peer that is only
// slow (starved of CPU, say) answers them within their own deadlines,
// which may be far longer than the call that expired - a 250 ms lease
// probe sharing the connection with 5 s forwards. Failing them all at
// once had a fail-open rule admit every one of them.
//
// On a connection idle for deadConnSilence (nothing to answer), one call
// that times out retires it, though the peer may only have been slow
// once: that costs a dial. Measuring the silence from the call's send
// instead would never retire a cut connection whose calls come sparser
// than deadConnSilence, each of them then timing out.
func (cc *clientConn) failIfSilent(sentAt int64) {
	if last := cc.lastRead.Load(); last <= sentAt && time.Now().UnixNano()-last >= int64(deadConnSilence) {
		cc.retire()
	}
}

// retire takes the connection out of use for new calls and closes it once
// its calls in flight are answered or expire, or after retiredLife.
func (cc *clientConn) retire() {
	if cc.retired.Swap(true) {
		return
	}
	c := cc.c
	c.mu.Lock()
	if c.cc == cc {
		c.cc = nil
	}
	// A connection that failed already is not kept: fail, which sets
	// broken before it takes c.mu to forget a retired connection, then
	// finds it either here or not at all.
	if !c.closed && !cc.broken.Load() {
		if c.retired == nil {
			c.retired = make(map[*clientConn]struct{})
		}
		c.retired[cc] = struct{}{}
	}
	c.mu.Unlock()
	cc.mu.Lock()
	if cc.err == nil {
		cc.lifeEnd = time.AfterFunc(retiredLife, func() { cc.fail(errRetired(cc)) })
	}
	cc.mu.Unlock()
	cc.closeIfDrained()
}

func errRetired(cc *clientConn) error {
	return fmt.Errorf("no answer from %s within a call's deadline: connection presumed dead", cc.c.addr)
}

// closeIfDrained closes a retired connection that has no call in flight
// (when it is retired; take closes it when its last call leaves).
func (cc *clientConn) closeIfDrained() {
	if !cc.retired.Load() {
		return
	}
	cc.mu.Lock()
	drained := cc.pending != nil && len(cc.pending) == 0
	cc.mu.Unlock()
	if drained {
		cc.fail(errRetired(cc))
	}
}

// take removes call id from pending and returns it, or nil. A retired
// connection whose last call this was is closed (see retire): every way
// a call leaves pending goes through here.
func (cc *clientConn) take(id uint64) *call {
	cc.mu.Lock()
	cl := cc.pending[id]
	delete(cc.pending, id)
	drained := cl != nil && len(cc.pending) == 0 && cc.retired.Load()
	cc.mu.Unlock()
	if drained {
		cc.fail(errRetired(cc))
	}
	return cl
}

// deliver gives a call its answer. The caller has taken cl out of
// pending, so it is the only one to deliver it.
func (cc *clientConn) deliver(cl *call, err error) {
	if cl.fn == nil {
		cl.done <- err
		return
	}
	fn := cl.fn
	cc.recycle(cl)
	fn(err)
}

// recycle stops a call of Go's timer, if armed, and puts the call back
// for reuse. The caller is the only holder of cl.
func (cc *clientConn) recycle(cl *call) {
	if cl.timer != nil && cl.timer.Stop() {
		cc.c.wg.Done() // it will not run
	}
	cl.resp, cl.ack, cl.fn, cl.timer = nil, nil, nil, nil
	cc.c.calls.Put(cl)
}

// forget removes a call from pending and reports whether it was there.
func (cc *clientConn) forget(id uint64) bool { return cc.take(id) != nil }

func (cc *clientConn) failure() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

// fail marks the connection broken for cause (first cause wins), fails
// every pending call and closes the socket, which ends the read loop.
func (cc *clientConn) fail(cause error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = fmt.Errorf("%w: %s: %w", ErrConnClosed, cc.c.addr, cause)
		cc.broken.Store(true)
	}
	err, pending := cc.err, cc.pending
	cc.pending = nil
	if cc.lifeEnd != nil {
		cc.lifeEnd.Stop()
	}
	cc.mu.Unlock()
	if errors.Is(cause, ErrAuth) {
		// The peer refused this connection (no secret, no TLS): a new
		// one would be refused too. Calls fail fast for RedialBackoff,
		// as after a failed dial. Was: the next call dialed again at
		// once, a connection (and a handshake) per frame from a
		// misconfigured router, for as long as it ran.
		cc.c.mu.Lock()
		cc.c.dialErr, cc.c.dialErrAt = err, cc.c.now()
		cc.c.mu.Unlock()
	}
	for _, cl := range pending {
		cc.deliver(cl, err)
	}
	_ = cc.nc.Close()
	if cc.retired.Load() {
		cc.c.mu.Lock()
		delete(cc.c.retired, cc)
		cc.c.mu.Unlock()
	}
}

func (cc *clientConn) readLoop() {
	lim := cc.c.cfg.Limits
	br := bufio.NewReaderSize(cc.nc, cc.c.cfg.ReadBufferSize)
	var buf []byte
	var err error
	for {
		buf, err = lim.ReadFrame(br, buf)
		if err != nil {
			break
		}
		cc.lastRead.Store(time.Now().UnixNano())
		if err = cc.dispatch(lim, buf); err != nil {
			break
		}
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
	cc.fail(err)
	cc.w.close()
}

// dispatch delivers one answer frame to its call. Errors in the frame's
// header end the connection; errors in its body fail that call only.
func (cc *clientConn) dispatch(lim Limits, frame []byte) error {
	h, err := lim.ParseHeader(frame)
	if err != nil {
		return err
	}
	if h.Type != FrameBatchResponse && h.Type != FrameError && h.Type != FramePushResponse {
		return &UnknownFrameTypeError{Type: h.Type}
	}
	if h.ID == 0 && h.Type == FrameError {
		// No request has id 0: the peer speaks of the connection (it
		// requires authentication, CodeAuth), which ends with that cause.
		_, rerr, err := lim.DecodeError(frame)
		if err == nil {
			err = rerr
		}
		return err
	}
	cl := cc.take(h.ID)
	if cl == nil {
		return nil // its caller gave up: drop the late answer
	}
	if h.Type == FrameError {
		_, rerr, err := lim.DecodeError(frame)
		if err == nil {
			err = rerr
		}
		cc.deliver(cl, err)
		return nil
	}
	if (h.Type == FramePushResponse) != (cl.ack != nil) {
		cc.deliver(cl, malformed(fmt.Sprintf("%v answer to the wrong kind of request", h.Type)))
		return nil
	}
	if cl.ack != nil {
		_, err = lim.DecodePushAck(frame, cl.ack)
		if err == nil && len(cl.ack.Status) != cl.want {
			err = malformed(fmt.Sprintf("%d statuses for %d parts", len(cl.ack.Status), cl.want))
		}
		cc.deliver(cl, err)
		return nil
	}
	_, err = lim.DecodeBatchResponse(frame, cl.resp)
	if err == nil && len(cl.resp.Results) != cl.want {
		err = malformed(fmt.Sprintf("%d results for %d checks", len(cl.resp.Results), cl.want))
	}
	cc.deliver(cl, err)
	return nil
}
