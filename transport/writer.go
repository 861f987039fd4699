package transport

import (
	"errors"
	"net"
	"sync"
	"time"
)

var errWriterClosed = errors.New("transport: connection writer closed")

// frameWriter is the single writer of one connection. Goroutines hand it
// whole frames with write; its run goroutine writes everything that piled up
// since its last write in one syscall, so concurrent frames coalesce under
// load while a lone frame is written at once (no flush timer).
type frameWriter struct {
	nc         net.Conn
	timeout    time.Duration
	maxPending int

	wake   chan struct{} // capacity 1: a token means pending may be non-empty
	exited chan struct{} // closed when run returns

	mu      sync.Mutex
	cond    sync.Cond // on mu: pending drained, err set or closing set
	pending []byte    // guarded by mu: frames not yet handed to the kernel
	err     error     // guarded by mu: sticky write error
	closing bool      // guarded by mu: no more frames; run flushes and returns
}

func newFrameWriter(nc net.Conn, timeout time.Duration, maxPending int) *frameWriter {
	w := &frameWriter{
		nc:         nc,
		timeout:    timeout,
		maxPending: maxPending,
		wake:       make(chan struct{}, 1),
		exited:     make(chan struct{}),
	}
	w.cond.L = &w.mu
	return w
}

// write queues a copy of frame. It blocks while more than maxPending bytes
// wait, and fails once the writer has failed or is closing; a frame for
// which write returned an error was not sent.
func (w *frameWriter) write(frame []byte) error {
	w.mu.Lock()
	for w.err == nil && !w.closing && len(w.pending) > 0 && len(w.pending)+len(frame) > w.maxPending {
		w.cond.Wait()
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	if w.closing {
		w.mu.Unlock()
		return errWriterClosed
	}
	first := len(w.pending) == 0
	w.pending = append(w.pending, frame...)
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// run writes pending frames until close is called or a write fails; a
// failed write closes the connection, so its reader notices too.
func (w *frameWriter) run() {
	defer close(w.exited)
	var buf []byte
	for {
		<-w.wake
		w.mu.Lock()
		buf, w.pending = w.pending, buf[:0]
		closing := w.closing
		w.mu.Unlock()
		w.cond.Broadcast()
		if len(buf) > 0 {
			if w.timeout > 0 {
				_ = w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
			}
			if _, err := w.nc.Write(buf); err != nil {
				w.fail(err)
				return
			}
		}
		if closing {
			return
		}
	}
}

func (w *frameWriter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.cond.Broadcast()
	_ = w.nc.Close()
}

// close makes run flush what is pending and return, and waits for it. It
// does not close the connection.
func (w *frameWriter) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.cond.Broadcast()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.exited
}
