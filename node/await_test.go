package node

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// stuckFuture is a Raft future that is answered only when release is
// closed (hashicorp/raft#498: some are never answered).
type stuckFuture struct{ release chan struct{} }

func (f stuckFuture) Error() error { <-f.release; return nil }

// await gives up on a future Raft does not answer after commitTimeout,
// or at once when the node closes, with an error that says the outcome
// is unknown; an answered future's error comes back as it is.
func TestAwaitBoundsAFutureRaftNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := &Node{ctx: ctx, cfg: Config{RaftTimeout: time.Second}}
		f := stuckFuture{make(chan struct{})}
		defer close(f.release) // the waiter left behind ends with the test

		start := time.Now()
		answered, err := n.await(f, "write")
		if took := time.Since(start); answered || !errors.Is(err, api.ErrUnavailable) || took != n.commitTimeout() {
			t.Fatalf("await of a stuck future = %v, %v after %v; want unanswered, unavailable, after %v", answered, err, took, n.commitTimeout())
		}

		go func() {
			time.Sleep(time.Second)
			cancel()
		}()
		start = time.Now()
		answered, err = n.await(f, "membership change")
		if took := time.Since(start); answered || !errors.Is(err, api.ErrUnavailable) || took != time.Second {
			t.Fatalf("await while the node closes = %v, %v after %v; want unanswered, unavailable, after 1s", answered, err, took)
		}

		want := errors.New("raft's own answer")
		if answered, err := (&Node{ctx: context.Background(), cfg: Config{RaftTimeout: time.Second}}).await(answeredFuture{want}, "write"); !answered || err != want {
			t.Fatalf("await of an answered future = %v, %v; want answered, %v", answered, err, want)
		}
	})
}

type answeredFuture struct{ err error }

func (f answeredFuture) Error() error { return f.err }
