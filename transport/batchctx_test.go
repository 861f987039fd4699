package transport

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A worker's reused batch context ends at each batch's deadline, through
// Err (no timer) and through Done (a timer, armed on demand); retire
// cancels it; the server's Close ends it.
func TestBatchCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancel(t.Context())
		c := &batchCtx{parent: parent, now: time.Now}
		for batch := range 3 { // reuse: each batch as the first
			start := time.Now()
			c.reset(start.Add(50 * time.Millisecond))
			if dl, ok := c.Deadline(); !ok || !dl.Equal(start.Add(50*time.Millisecond)) {
				t.Fatalf("batch %d: Deadline = %v, %v", batch, dl, ok)
			}
			if err := c.Err(); err != nil {
				t.Fatalf("batch %d: Err before the deadline = %v", batch, err)
			}
			if batch == 1 { // Err alone, no Done: ends when the clock passes the deadline
				time.Sleep(50 * time.Millisecond) // the bubble's clock: no wall time
				if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("batch %d: Err at the deadline = %v", batch, err)
				}
			} else {
				<-c.Done()
				if waited := time.Since(start); waited != 50*time.Millisecond {
					t.Fatalf("batch %d: Done after %v, want 50ms", batch, waited)
				}
				if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("batch %d: Err = %v", batch, err)
				}
			}
			c.retire()
		}

		// Retired before its deadline: Canceled, and Done handed out
		// before is closed.
		c.reset(time.Now().Add(time.Hour))
		done := c.Done()
		c.retire()
		select {
		case <-done:
		default:
			t.Fatal("Done not closed by retire")
		}
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err after retire = %v, want Canceled", err)
		}

		// The parent ends (Server.Close): Done closes at once.
		c.reset(time.Now().Add(time.Hour))
		done = c.Done()
		cancel()
		<-done
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err after the parent's cancel = %v", err)
		}
		c.retire()
		synctest.Wait() // no timer or watch left behind
	})
}

// A handler that blocks on its context is released at its batch's
// deadline, also when its worker (and so its context) is reused.
func TestHandlerContextEndsAtBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		got := make(chan error, 1)
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			if req.Checks[0].Rule == "block" {
				<-ctx.Done()
				got <- ctx.Err()
			}
			echo(ctx, req, resp)
		})
		c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())
		for range 2 { // the second batch reuses the worker and its context
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			start := time.Now()
			_ = c.Do(ctx, batchOf(1, "block"), new(BatchResponse))
			cancel()
			if err := <-got; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("handler's ctx.Err() = %v, want DeadlineExceeded", err)
			}
			if waited := time.Since(start); waited != 20*time.Millisecond {
				t.Fatalf("handler released after %v, want 20ms", waited)
			}
		}
		stop()
	})
}

// Done first asked for after the batch's deadline is closed, once. Was:
// the poll inside Done ended the batch and closed the channel it had just
// made, and Done closed it again: "close of closed channel".
func TestBatchCtxDoneAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &batchCtx{parent: t.Context(), now: time.Now}
		c.reset(time.Now().Add(10 * time.Millisecond))
		time.Sleep(20 * time.Millisecond) // the deadline passes; nobody asked Err
		select {
		case <-c.Done():
		default:
			t.Fatal("Done not closed after the deadline")
		}
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() = %v, want DeadlineExceeded", err)
		}
		c.retire()
	})
}

// A handler that first waits on its context after the batch's budget ran
// out answers the batch; was: it panicked (above), and the server answered
// the whole batch StatusInternal although its checks were decided.
func TestHandlerDoneAfterBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logged []error
		scfg := DefaultServerConfig()
		scfg.ErrorLog = func(err error) { logged = append(logged, err) }
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			time.Sleep(30 * time.Millisecond) // waits on something, not on ctx
			select {
			case <-ctx.Done():
			default:
			}
			echo(ctx, req, resp)
		})
		c, _, stop := pipeServe(t, h, scfg, DefaultClientConfig())
		defer stop()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		_ = c.Do(ctx, batchOf(1, "r"), new(BatchResponse))
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		for _, err := range logged {
			t.Errorf("server logged: %v", err)
		}
	})
}
