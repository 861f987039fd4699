package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server answers BatchRequest frames with a Handler.
//
// Each connection has a read loop, up to MaxConcurrentBatches workers (each
// with its own request, response and encoding buffers, reused from batch to
// batch) and a writer. The read loop decodes a frame into an idle worker;
// while every worker is busy it stops reading, which pushes back on the
// sender through TCP. A PromptHandler's batch that would be decided at once
// and has no frame waiting behind it is decided by the read loop itself,
// in the worker's buffers, saving the hand-off. Create one with NewServer;
// the zero value is not usable.
//
// The context a Handler gets ends when its batch's budget is spent or the
// server closes; the worker reuses it for its next batch, so a handler
// must not keep it after it returns.
type Server struct {
	cfg    ServerConfig
	h      Handler
	prompt PromptHandler    // h, when it is one; else nil
	err    error            // from NewServer: bad config or nil handler
	now    func() time.Time // the clock frames' budgets are measured with

	ctx    context.Context // parent of every handler context
	cancel context.CancelFunc
	quit   chan struct{} // closed when shutdown begins

	inShutdown atomic.Bool    // set under mu, read without it
	wg         sync.WaitGroup // one per connection goroutine

	mu        sync.Mutex
	listeners map[net.Listener]struct{} // guarded by mu
	conns     map[*serverConn]struct{}  // guarded by mu
}

// NewServer returns a Server that answers with h. If cfg is invalid or h is
// nil, Serve returns that error.
func NewServer(cfg ServerConfig, h Handler) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:       cfg,
		h:         h,
		err:       cfg.Validate(),
		now:       time.Now,
		ctx:       ctx,
		cancel:    cancel,
		quit:      make(chan struct{}),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*serverConn]struct{}),
	}
	s.prompt, _ = h.(PromptHandler)
	if s.err == nil && h == nil {
		s.err = fmt.Errorf("%w: nil Handler", ErrInvalidConfig)
	}
	return s
}

// Serve accepts connections on ln and serves each in its own goroutines. It
// always closes ln, and returns ErrServerClosed once Shutdown or Close was
// called, or the error that stopped accepting.
func (s *Server) Serve(ln net.Listener) error {
	defer ln.Close()
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	if s.inShutdown.Load() {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.inShutdown.Load() {
				return ErrServerClosed
			}
			if !temporary(err) {
				return fmt.Errorf("transport: accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logf(fmt.Errorf("transport: accept: %w; retrying in %v", err, backoff))
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.quit:
				t.Stop()
			}
			continue
		}
		backoff = 0
		s.track(nc)
	}
}

func temporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EMFILE) ||
		errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

func (s *Server) track(nc net.Conn) {
	sc := &serverConn{
		s:    s,
		nc:   nc,
		lim:  s.cfg.Limits,
		w:    newFrameWriter(nc, s.cfg.WriteTimeout, s.cfg.MaxPendingWrite, true),
		idle: make(chan *worker, s.cfg.MaxConcurrentBatches),
	}
	sc.pushCond.L = &sc.pushMu
	s.mu.Lock()
	if s.inShutdown.Load() {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go sc.serve()
}

// aLongTimeAgo is a read deadline that makes blocked reads return at once.
var aLongTimeAgo = time.Unix(1, 0)

// beginShutdown stops accepting and makes every connection's read loop stop
// after its current frame; batches already read are still answered.
func (s *Server) beginShutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inShutdown.Load() {
		s.inShutdown.Store(true)
		close(s.quit)
	}
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for sc := range s.conns {
		_ = sc.nc.SetReadDeadline(aLongTimeAgo)
	}
}

// Shutdown stops accepting connections and reading frames, lets the batches
// already read finish and their answers be written, then closes every
// connection. If ctx ends first, it closes everything as Close does and
// returns ctx.Err(). Frames a peer had sent but the server had not read yet
// are dropped; their callers see ErrConnClosed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginShutdown()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		_ = s.Close()
		<-done
		return ctx.Err()
	}
}

// Close stops accepting, closes every connection, cancels the context of
// every running handler and waits for the connections' goroutines to end
// (which waits for running handlers to return).
func (s *Server) Close() error {
	s.beginShutdown()
	s.cancel()
	s.mu.Lock()
	for sc := range s.conns {
		_ = sc.nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) logf(err error) {
	if s.cfg.ErrorLog != nil {
		s.cfg.ErrorLog(err)
	}
}

// serverConn is one accepted connection.
type serverConn struct {
	s   *Server
	nc  net.Conn
	lim Limits
	w   *frameWriter

	idle     chan *worker   // workers waiting for a batch
	inflight sync.WaitGroup // batches handed to workers and not yet answered
	workerWG sync.WaitGroup // worker goroutines

	workers []*worker // owned by the read loop
	// deciding counts the batches handed to workers and not yet decided:
	// a worker that finishes while others are deciding lets their answers
	// join its write (writeAfterOthers).
	deciding atomic.Int32

	pushMu    sync.Mutex
	pushCond  sync.Cond // on pushMu: a push in flight ended
	pushBytes int       // guarded by pushMu: frame bytes of the pushes in flight
	pushes    int       // guarded by pushMu: pushes in flight
}

// Pushes in flight on one connection, each answered on a goroutine of its
// own with a decoded copy of its frame: at most maxPushes of them, and
// at most maxPushBytes of frames unless only one is in flight (a push of
// the largest frame always goes). Past that the read loop waits, so a
// peer that sends pushes faster than they are handled is held back by
// TCP. Was: a goroutine and a copy per push, without bound.
const (
	maxPushes    = 64
	maxPushBytes = 4 * DefaultMaxFrameSize
)

// admitPush waits until a push of n frame bytes may go, and counts it.
func (sc *serverConn) admitPush(n int) {
	sc.pushMu.Lock()
	for sc.pushes >= maxPushes || sc.pushes > 0 && sc.pushBytes+n > maxPushBytes {
		sc.pushCond.Wait()
	}
	sc.pushes++
	sc.pushBytes += n
	sc.pushMu.Unlock()
}

// pushDone ends a push of n frame bytes admitted by admitPush.
func (sc *serverConn) pushDone(n int) {
	sc.pushMu.Lock()
	sc.pushes--
	sc.pushBytes -= n
	sc.pushMu.Unlock()
	sc.pushCond.Broadcast()
}

// worker handles one batch at a time; its buffers are reused.
type worker struct {
	in       chan struct{} // a token: req, id, deadline and received are set
	id       uint64
	deadline time.Duration
	received time.Time
	req      BatchRequest
	resp     BatchResponse
	out      []byte
	ctx      batchCtx // the handler's context for a batch with a deadline
}

func (sc *serverConn) serve() {
	defer sc.s.wg.Done()
	go sc.w.run()
	err := sc.readLoop()
	if !sc.s.inShutdown.Load() && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		sc.s.logf(fmt.Errorf("transport: connection from %v: %w", sc.nc.RemoteAddr(), err))
	}
	sc.inflight.Wait()
	for _, w := range sc.workers {
		close(w.in)
	}
	sc.workerWG.Wait()
	sc.w.close()
	_ = sc.nc.Close()
	sc.s.mu.Lock()
	delete(sc.s.conns, sc)
	sc.s.mu.Unlock()
}

// readLoop reads frames until the connection fails, the peer breaks the
// protocol or shutdown sets a past read deadline, and returns why.
func (sc *serverConn) readLoop() error {
	br := bufio.NewReaderSize(sc.nc, sc.s.cfg.ReadBufferSize)
	var buf, ebuf []byte
	var deadline time.Time // the read deadline in force
	for {
		if cap(buf) > 1<<20 { // do not keep a huge frame's buffer (whatever the frame was)
			buf = nil
		}
		if idle := sc.s.cfg.IdleTimeout; idle > 0 {
			// The next frame, whole, must arrive within IdleTimeout. The
			// deadline is moved only when less than that is left of it
			// (to IdleTimeout·17/16 from now), so a busy connection
			// updates its runtime timer once per IdleTimeout/16, not per
			// frame. The check after setting it keeps shutdown's past
			// deadline; a deadline left in place keeps it too.
			if now := sc.s.now(); deadline.Sub(now) < idle {
				deadline = now.Add(idle + idle/16)
				if err := sc.nc.SetReadDeadline(deadline); err != nil {
					return err
				}
			}
			if sc.s.inShutdown.Load() {
				return net.ErrClosed
			}
		}
		frame, err := sc.lim.ReadFrame(br, buf)
		if err != nil {
			return err
		}
		buf = frame
		received := sc.s.now()
		if ph, ok := sc.s.h.(PushHandler); ok && len(frame) >= HeaderSize && FrameType(frame[5]) == FramePushRequest {
			if err := sc.push(ph, frame); err != nil {
				return err
			}
			continue
		}
		h, err := sc.lim.parseAs(frame, FrameBatchRequest)
		if err != nil {
			// The peer does not speak our protocol: tell it why (in a
			// version-1 error frame, flushed before the close) and hang up.
			var ve *UnsupportedVersionError
			var te *UnknownFrameTypeError
			if errors.As(err, &ve) || errors.As(err, &te) {
				_ = sc.w.write(AppendError(ebuf[:0], h.ID, CodeMalformed, err.Error()))
			}
			return err
		}
		w := sc.idleWorker()
		id, deadline, err := sc.lim.DecodeBatchRequest(frame, &w.req)
		if err != nil {
			// The frame boundary is intact: answer this request only.
			sc.idle <- w
			ebuf = AppendError(ebuf[:0], h.ID, CodeMalformed, err.Error())
			if err := sc.w.write(ebuf); err != nil {
				return err
			}
			continue
		}
		w.id, w.deadline, w.received = id, deadline, received
		if sc.s.prompt != nil && br.Buffered() == 0 && sc.prompt(&w.req) {
			// Nothing waits behind this frame and it will not wait:
			// decide it here rather than wake a worker for it.
			sc.process(w, false)
			sc.idle <- w
		} else {
			sc.inflight.Add(1)
			sc.deciding.Add(1)
			w.in <- struct{}{}
		}
	}
}

// prompt asks the PromptHandler whether req will not wait; a panic in it
// is logged and taken for "it may wait" (the batch goes to a worker, whose
// handler call recovers panics too), as HandleBatch's and HandlePush's
// are recovered. Was: a panic in Prompt, on the read loop, killed the
// process.
func (sc *serverConn) prompt(req *BatchRequest) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			sc.s.logf(fmt.Errorf("transport: prompt handler panic: %v", p))
			ok = false
		}
	}()
	return sc.s.prompt.Prompt(req)
}

// push decodes a partition push and answers it from its own goroutine,
// so a large hand-off does not hold up the checks behind it.
func (sc *serverConn) push(ph PushHandler, frame []byte) error {
	n := len(frame)
	sc.admitPush(n) // before the copy: at most maxPushBytes of them
	var p Push
	id, err := sc.lim.DecodePush(frame, &p) // copies the data out of frame
	if err != nil {
		sc.pushDone(n)
	}
	if err != nil {
		var ve *UnsupportedVersionError
		if errors.As(err, &ve) {
			_ = sc.w.write(AppendError(nil, id, CodeMalformed, err.Error()))
			return err
		}
		return sc.w.write(AppendError(nil, id, CodeMalformed, err.Error()))
	}
	sc.inflight.Add(1)
	go func() {
		defer sc.inflight.Done()
		defer sc.pushDone(n)
		ack := PushAck{Status: make([]PushStatus, len(p.Parts))}
		for i := range ack.Status {
			ack.Status[i] = PushRejected
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					sc.s.logf(fmt.Errorf("transport: push handler panic: %v", r))
				}
			}()
			ph.HandlePush(sc.s.ctx, &p, &ack)
		}()
		if len(ack.Status) != len(p.Parts) {
			ack.Status = make([]PushStatus, len(p.Parts))
			for i := range ack.Status {
				ack.Status[i] = PushRejected
			}
		}
		_ = sc.w.write(AppendPushAck(nil, id, &ack))
	}()
	return nil
}

func (sc *serverConn) idleWorker() *worker {
	select {
	case w := <-sc.idle:
		return w
	default:
	}
	if len(sc.workers) < cap(sc.idle) {
		w := &worker{in: make(chan struct{}, 1), ctx: batchCtx{parent: sc.s.ctx, now: sc.s.now}}
		sc.workers = append(sc.workers, w)
		sc.workerWG.Add(1)
		go sc.runWorker(w)
		return w
	}
	return <-sc.idle
}

func (sc *serverConn) runWorker(w *worker) {
	defer sc.workerWG.Done()
	for range w.in {
		sc.process(w, true)
		sc.idle <- w
		sc.inflight.Done()
	}
}

// process decides w's batch and writes its answer; onWorker says it runs
// on w's own goroutine (a batch counted in deciding), not the read loop.
func (sc *serverConn) process(w *worker, onWorker bool) {
	n := len(w.req.Checks)
	w.resp.Epoch = 0
	if w.deadline > 0 && sc.s.now().Sub(w.received) >= w.deadline {
		// The budget was spent in transit or in the queue: do not decide.
		w.resp.Results = fill(w.resp.Results, n, StatusUnavailable)
	} else {
		w.resp.Results = fill(w.resp.Results, n, StatusInternal)
		sc.handle(w)
	}
	w.out = AppendBatchResponse(w.out[:0], w.id, &w.resp)
	if len(w.out) > sc.lim.maxFrame() {
		w.out = AppendError(w.out[:0], w.id, CodeTooLarge,
			fmt.Sprintf("answer of %d bytes exceeds the frame limit of %d", len(w.out), sc.lim.maxFrame()))
	}
	// An error means the connection is failing; the read loop will see it.
	if onWorker && sc.deciding.Add(-1) > 0 {
		_ = sc.w.writeAfterOthers(w.out)
		return
	}
	_ = sc.w.write(w.out)
}

func (sc *serverConn) handle(w *worker) {
	n := len(w.req.Checks)
	ctx := sc.s.ctx
	if w.deadline > 0 {
		w.ctx.reset(w.received.Add(w.deadline))
		defer w.ctx.retire()
		ctx = &w.ctx
	}
	defer func() {
		if p := recover(); p != nil {
			sc.s.logf(fmt.Errorf("transport: handler panic: %v", p))
			w.resp.Results = fill(w.resp.Results, n, StatusInternal)
		}
	}()
	sc.s.h.HandleBatch(ctx, &w.req, &w.resp)
	if len(w.resp.Results) != n {
		w.resp.Results = fill(w.resp.Results, n, StatusInternal)
	}
}

// fill returns rs resized to n results, each Result{Status: st}.
func fill(rs []Result, n int, st Status) []Result {
	rs = slices.Grow(rs[:0], n)[:n]
	for i := range rs {
		rs[i] = Result{Status: st}
	}
	return rs
}
