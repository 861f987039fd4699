package transport

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"time"
)

var errWriterClosed = errors.New("transport: connection writer closed")

// frameWriter is the single writer of one connection. The goroutine that
// hands it a frame while no write is in progress writes that frame itself,
// straight from its buffer (no copy, no wake-up of another goroutine);
// frames handed over while a write is in progress are queued, and the
// writing goroutine writes everything that piled up in one syscall after
// its own. So a lone frame costs one syscall, concurrent frames coalesce
// under load, and there is no flush timer.
//
// A writing goroutine drains the queue for at most drainRounds more writes,
// then hands the connection to the writer's own goroutine (run), which
// drains until the queue is empty: a caller is never held up for long by
// other callers' frames.
type frameWriter struct {
	nc         net.Conn
	timeout    time.Duration
	maxPending int
	direct     bool // the goroutine that finds the writer idle writes (else run does)

	wake   chan struct{} // run's token: a hand-off or close
	exited chan struct{} // closed when run returns

	// deadline is the write deadline in force; only the goroutine that
	// holds writing touches it.
	deadline time.Time

	mu      sync.Mutex
	cond    sync.Cond // on mu: room in pending, writing cleared, err set or closing set
	pending []byte    // guarded by mu: frames not yet handed to the kernel; empty unless writing
	spare   []byte    // guarded by mu: the other buffer, swapped with pending
	writing bool      // guarded by mu: a goroutine is writing to nc
	handoff bool      // guarded by mu: run holds writing and must drain
	err     error     // guarded by mu: sticky write error
	closing bool      // guarded by mu: no more frames
}

// drainRounds is how many writes of other goroutines' frames a goroutine
// does after its own before handing the rest to run.
const drainRounds = 2

func newFrameWriter(nc net.Conn, timeout time.Duration, maxPending int, direct bool) *frameWriter {
	w := &frameWriter{
		nc:         nc,
		direct:     direct,
		timeout:    timeout,
		maxPending: maxPending,
		wake:       make(chan struct{}, 1),
		exited:     make(chan struct{}),
	}
	w.cond.L = &w.mu
	return w
}

// write sends frame, or queues a copy of it while another goroutine is
// writing. It blocks while more than maxPending bytes wait, and fails once
// the writer has failed or is closing. A frame for which write returned an
// error was not sent whole, so the peer never decodes it.
func (w *frameWriter) write(frame []byte) error { return w.put(frame, true, false) }

// writeAfterOthers is write for a goroutine that knows other frames are
// about to be handed over (a server's workers deciding other batches of
// the connection): finding the writer idle, it first yields so that their
// frames can leave with its own in one syscall.
func (w *frameWriter) writeAfterOthers(frame []byte) error { return w.put(frame, true, true) }

// writeNow is write without waiting for room: past maxPending it fails
// with ErrQueueFull, and the connection goes on. It is for goroutines
// that must not block on the peer (Client.Go's callers include the
// connection's read loop).
func (w *frameWriter) writeNow(frame []byte) error { return w.put(frame, false, false) }

func (w *frameWriter) put(frame []byte, wait, yield bool) error {
	w.mu.Lock()
	for w.err == nil && !w.closing && len(w.pending) > 0 && len(w.pending)+len(frame) > w.maxPending {
		if !wait {
			w.mu.Unlock()
			return ErrQueueFull
		}
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
	if w.writing {
		w.pending = append(w.pending, frame...)
		w.mu.Unlock()
		return nil
	}
	// Nothing is queued (pending is empty unless writing): this goroutine
	// writes. Only when the caller knows other frames are on their way
	// (yield) does it let them go first, so that they leave with this one
	// in one syscall: a yield with nothing else runnable on its P parks
	// the thread and wakes another, which cost a member ~25% of its CPU
	// when every frame yielded. Frames handed over during the write still
	// leave together in the next one.
	w.writing = true
	w.pending = append(w.pending, frame...)
	if !w.direct {
		w.handoff = true
		w.mu.Unlock()
		w.wake <- struct{}{} // never blocks: one token per hand-off, and run holds writing until it took it
		return nil
	}
	w.mu.Unlock()
	if yield {
		runtime.Gosched()
	}
	w.drain(drainRounds + 1)
	return nil
}

// drain is called by the goroutine holding writing: it writes what is
// queued, at most rounds times (unbounded if rounds < 0), and then either
// clears writing (nothing left) or hands writing to run.
func (w *frameWriter) drain(rounds int) {
	for {
		w.mu.Lock()
		if w.err != nil {
			w.mu.Unlock()
			return
		}
		if len(w.pending) == 0 {
			w.writing = false
			w.mu.Unlock()
			w.cond.Broadcast()
			return
		}
		if rounds == 0 {
			w.handoff = true
			w.mu.Unlock()
			w.wake <- struct{}{} // never blocks: one token per hand-off, and run holds writing until it took it
			return
		}
		buf := w.pending
		w.pending, w.spare = w.spare[:0], nil
		w.mu.Unlock()
		w.cond.Broadcast() // room for writers waiting on maxPending
		_, err := w.send(buf)
		w.mu.Lock()
		w.spare = buf[:0]
		w.mu.Unlock()
		if err != nil {
			w.fail(err)
			return
		}
		rounds--
	}
}

// send writes b, refreshing the write deadline only when less than timeout
// is left of it: every write gets between timeout and 17/16 of it, and a
// busy connection sets a deadline (a runtime timer update) once per
// timeout/16 instead of once per write.
func (w *frameWriter) send(b []byte) (int, error) {
	if w.timeout > 0 {
		now := time.Now()
		if w.deadline.Sub(now) < w.timeout {
			w.deadline = now.Add(w.timeout + w.timeout/16)
			if err := w.nc.SetWriteDeadline(w.deadline); err != nil {
				return 0, err
			}
		}
	}
	return w.nc.Write(b)
}

// run drains the queue whenever a writing goroutine hands it over, until
// close.
func (w *frameWriter) run() {
	defer close(w.exited)
	for range w.wake {
		w.mu.Lock()
		handoff, closing := w.handoff, w.closing
		w.handoff = false
		w.mu.Unlock()
		if handoff {
			runtime.Gosched() // as in write: let ready frame producers go first
			w.drain(-1)
			continue
		}
		if closing {
			return
		}
	}
}

// fail records err (first wins), drops what is queued, releases writing
// and closes the connection, so its reader notices too.
func (w *frameWriter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.pending = w.pending[:0]
	w.writing = false
	w.mu.Unlock()
	w.cond.Broadcast()
	_ = w.nc.Close()
}

// close refuses further frames, waits until what is queued has been
// written (or the writer failed), and stops run. It does not close the
// connection.
func (w *frameWriter) close() {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		<-w.exited
		return
	}
	w.closing = true
	w.cond.Broadcast()
	for w.writing {
		w.cond.Wait()
	}
	w.mu.Unlock()
	w.wake <- struct{}{}
	<-w.exited
}
