package transport

import (
	"context"
	"sync"
	"time"
)

// batchCtx is the context a Server hands its Handler for a batch with a
// deadline: the server's context plus the batch's deadline. Each worker
// owns one and reuses it from batch to batch (reset, then retire when the
// handler returns), so a batch costs no allocation and no timer: the
// deadline is compared with the clock when Err is called, and a channel
// and a timer exist only once a handler asks for Done (a handler that
// blocks). After retire it reports context.Canceled, as the context of
// context.WithDeadline does after its cancel; a handler must not keep it
// past its return, since the next batch's reset revives it.
//
// Its methods are safe for concurrent use.
type batchCtx struct {
	parent context.Context  // the server's: Close cancels it
	now    func() time.Time // the clock the batch's budget is measured with

	mu         sync.Mutex
	deadline   time.Time     // guarded by mu
	err        error         // guarded by mu: set once the batch's context ended
	done       chan struct{} // guarded by mu: made by the first Done of a batch; closed with err
	timer      *time.Timer   // guarded by mu: made by the first Done ever, reused
	stopParent func() bool   // guarded by mu: the parent watch of the current Done
}

// reset starts a batch that must be decided by deadline.
func (c *batchCtx) reset(deadline time.Time) {
	c.mu.Lock()
	c.deadline, c.err, c.done = deadline, nil, nil
	c.mu.Unlock()
}

// retire ends the batch: its context reports context.Canceled from now.
func (c *batchCtx) retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.end(context.Canceled)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stopParent != nil {
		c.stopParent()
		c.stopParent = nil
	}
}

// end records err and closes done if it was handed out. Called with mu
// held and err not yet set.
func (c *batchCtx) end(err error) {
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

// poll ends the batch if the parent ended or the deadline passed. Called
// with mu held.
func (c *batchCtx) poll() {
	if c.err != nil {
		return
	}
	if err := c.parent.Err(); err != nil {
		c.end(err)
	} else if !c.now().Before(c.deadline) {
		c.end(context.DeadlineExceeded)
	}
}

func (c *batchCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *batchCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.poll()
	return c.err
}

func (c *batchCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	// Poll before the channel exists: a poll that ends the batch closes
	// the channel it finds (end), so polling after making it closed it
	// twice — a panic for a handler whose first Done came after its
	// budget ran out.
	c.poll()
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return c.done
	}
	d := c.deadline.Sub(c.now())
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.fire)
	} else {
		c.timer.Reset(d)
	}
	parent := c.parent
	c.stopParent = context.AfterFunc(parent, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err == nil {
			c.end(parent.Err())
		}
	})
	return c.done
}

// fire is the timer's: it ends the current batch if its deadline has
// passed (a timer armed for an earlier batch may fire late; it then finds
// a later deadline and does nothing).
func (c *batchCtx) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		c.poll()
	}
}

func (c *batchCtx) Value(key any) any { return c.parent.Value(key) }
