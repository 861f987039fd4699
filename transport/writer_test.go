package transport

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// gateConn is a net.Conn whose Writes are recorded and each wait for a
// token on gate (or fail with failWith, when set).
type gateConn struct {
	net.Conn // nil: only Write, SetWriteDeadline and Close are used
	gate     chan struct{}
	failWith error

	mu     sync.Mutex
	writes [][]byte
	closed bool
}

func (c *gateConn) Write(b []byte) (int, error) {
	<-c.gate
	if c.failWith != nil {
		return 0, c.failWith
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, bytes.Clone(b))
	return len(b), nil
}

func (c *gateConn) SetWriteDeadline(time.Time) error { return nil }

func (c *gateConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *gateConn) got() ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []string
	for _, w := range c.writes {
		ws = append(ws, string(w))
	}
	return ws, c.closed
}

// Frames handed over while a write is in progress leave together, in
// order, in the next write; a lone frame leaves in a write of its own.
// Both modes: the goroutine that finds the writer idle writes (direct,
// the server's answers), or the writer's own goroutine does (the
// client's requests, whose callers never block in a syscall).
func TestFrameWriterCoalesces(t *testing.T) {
	for _, direct := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			nc := &gateConn{gate: make(chan struct{})}
			w := newFrameWriter(nc, time.Second, 1<<20, direct)
			go w.run()
			first := make(chan error, 1)
			go func() { first <- w.write([]byte("a")) }()
			synctest.Wait() // "a" is in a write, held at the gate
			for _, f := range []string{"b", "c", "d"} {
				if err := w.write([]byte(f)); err != nil {
					t.Fatalf("write(%q) = %v", f, err)
				}
			}
			nc.gate <- struct{}{} // "a" leaves
			nc.gate <- struct{}{} // then "bcd", in one write
			if err := <-first; err != nil {
				t.Fatalf("write(a) = %v", err)
			}
			synctest.Wait()
			go func() { nc.gate <- struct{}{} }()
			if err := w.write([]byte("e")); err != nil {
				t.Fatal(err)
			}
			w.close() // waits for "e" to leave, then run returns
			got, closed := nc.got()
			if want := []string{"a", "bcd", "e"}; !slices.Equal(got, want) || closed {
				t.Errorf("direct=%v: writes %q, closed %v; want %q, not closed", direct, got, closed, want)
			}
			if err := w.write([]byte("f")); !errors.Is(err, errWriterClosed) {
				t.Errorf("write after close = %v, want errWriterClosed", err)
			}
		})
	}
}

// A failed write closes the connection, drops what was queued and fails
// every later write with its error.
func TestFrameWriterFailure(t *testing.T) {
	for _, direct := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			broken := errors.New("broken pipe")
			nc := &gateConn{gate: make(chan struct{}), failWith: broken}
			w := newFrameWriter(nc, time.Second, 1<<20, direct)
			go w.run()
			go func() { _ = w.write([]byte("a")) }()
			synctest.Wait()
			if err := w.write([]byte("b")); err != nil { // queued behind "a"
				t.Fatal(err)
			}
			nc.gate <- struct{}{}
			synctest.Wait()
			if err := w.write([]byte("c")); !errors.Is(err, broken) {
				t.Errorf("direct=%v: write after a failed write = %v, want %v", direct, err, broken)
			}
			if got, closed := nc.got(); len(got) != 0 || !closed {
				t.Errorf("direct=%v: writes %q, closed %v; want none, closed", direct, got, closed)
			}
			w.close()
		})
	}
}

// A writer whose queue holds maxPending bytes makes the next frame wait
// for room (one frame is always let through).
func TestFrameWriterBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nc := &gateConn{gate: make(chan struct{})}
		w := newFrameWriter(nc, time.Second, 4, true)
		go w.run()
		go func() { _ = w.write([]byte("a")) }()
		synctest.Wait()
		if err := w.write([]byte("bbbb")); err != nil { // fills the queue
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- w.write([]byte("c")) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("write past maxPending returned %v at once, want it to wait", err)
		default:
		}
		if err := w.writeNow([]byte("d")); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("writeNow past maxPending = %v, want ErrQueueFull", err)
		}
		nc.gate <- struct{}{} // "a"
		nc.gate <- struct{}{} // "bbbb"
		nc.gate <- struct{}{} // "c"
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		w.close()
		if got, _ := nc.got(); !slices.Equal(got, []string{"a", "bbbb", "c"}) {
			t.Errorf("writes %q, want [a bbbb c]", got)
		}
	})
}
