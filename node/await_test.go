package node

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
)

// stuckFuture is a Raft future that is answered only when release is
// closed (hashicorp/raft#498: some are never answered).
type stuckFuture struct{ release chan struct{} }

func (f stuckFuture) Error() error { <-f.release; return nil }

// await gives up on a future Raft does not answer after commitTimeout,
// when the request's context ends, or at once when the node closes, with
// an error that says the outcome is unknown; an answered future's error
// comes back as it is.
func TestAwaitBoundsAFutureRaftNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := &Node{ctx: ctx, cfg: Config{RaftTimeout: time.Second}, raft: &raftParts{}}
		f := stuckFuture{make(chan struct{})}
		defer close(f.release) // the waiter left behind ends with the test

		start := time.Now()
		answered, err := n.await(ctx, f, "write")
		if took := time.Since(start); answered || !errors.Is(err, api.ErrUnavailable) || took != n.commitTimeout() {
			t.Fatalf("await of a stuck future = %v, %v after %v; want unanswered, unavailable, after %v", answered, err, took, n.commitTimeout())
		}

		req, cancelReq := context.WithTimeout(ctx, 3*time.Second)
		start = time.Now()
		answered, err = n.await(req, f, "write")
		cancelReq()
		if took := time.Since(start); answered || !errors.Is(err, api.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || took != 3*time.Second {
			t.Fatalf("await with a request deadline = %v, %v after %v; want unanswered, unavailable, deadline exceeded, after 3s", answered, err, took)
		}

		go func() {
			time.Sleep(time.Second)
			cancel()
		}()
		start = time.Now()
		answered, err = n.await(n.ctx, f, "membership change")
		if took := time.Since(start); answered || !errors.Is(err, api.ErrUnavailable) || took != time.Second {
			t.Fatalf("await while the node closes = %v, %v after %v; want unanswered, unavailable, after 1s", answered, err, took)
		}

		want := errors.New("raft's own answer")
		if answered, err := (&Node{ctx: context.Background(), cfg: Config{RaftTimeout: time.Second}, raft: &raftParts{}}).await(context.Background(), answeredFuture{want}, "write"); !answered || err != want {
			t.Fatalf("await of an answered future = %v, %v; want answered, %v", answered, err, want)
		}
	})
}

type answeredFuture struct{ err error }

func (f answeredFuture) Error() error { return f.err }

// raftUnavailable wraps api.ErrUnavailable exactly once, whether Raft
// answered (its errors do not wrap it) or await gave up (its error does),
// and keeps Raft's error reachable.
func TestRaftUnavailableWrapsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &Node{ctx: context.Background(), cfg: Config{RaftTimeout: time.Second}, raft: &raftParts{}}
		f := stuckFuture{make(chan struct{})}
		defer close(f.release)
		_, gaveUp := n.await(n.ctx, f, "membership change")
		for _, tc := range []struct {
			err  error
			want string
		}{
			{raft.ErrLeadershipLost, "removing n2 from raft: unavailable: leadership lost while committing log"},
			{gaveUp, "removing n2 from raft: unavailable: raft did not answer a membership change within 7s: its outcome is unknown (it may still commit)"},
		} {
			got := raftUnavailable("removing n2 from raft", tc.err)
			if got.Error() != tc.want || !errors.Is(got, api.ErrUnavailable) || !errors.Is(got, tc.err) {
				t.Errorf("raftUnavailable(%q) = %q, want %q wrapping api.ErrUnavailable and the cause", tc.err, got, tc.want)
			}
		}
	})
}

// A write Raft refuses because it cannot take writes now (not the
// leader, leadership lost or being handed over, shutting down) answers
// unavailable, which callers retry and the HTTP API answers 503; it
// answered "raft apply: leadership transfer in progress", a 500 logged as
// an ERROR, to members marking themselves down while a stopping leader
// handed its leadership over (five members stopped together). So does a
// write the leader could not store (its disk full): it was a 500.
func TestOutcomeOfAWriteRaftCannotTakeIsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &Node{ctx: context.Background(), cfg: Config{RaftTimeout: time.Second}, raft: &raftParts{}}
		diskFull := errors.New("write raft.db: no space left on device") // what raft answers when the leader cannot store the write
		for _, err := range []error{raft.ErrNotLeader, raft.ErrLeadershipLost, raft.ErrEnqueueTimeout, raft.ErrRaftShutdown, raft.ErrLeadershipTransferInProgress, diskFull} {
			if got := n.outcome(n.ctx, refusedApply{answeredFuture{err}}); !errors.Is(got, api.ErrUnavailable) || !errors.Is(got, err) {
				t.Errorf("outcome of a write refused with %q = %v, want it wrapped in api.ErrUnavailable", err, got)
			}
		}
	})
}

// refusedApply is an ApplyFuture Raft has answered with an error.
type refusedApply struct{ answeredFuture }

func (refusedApply) Index() uint64         { return 0 }
func (refusedApply) Response() interface{} { return nil }

// raftParts.close lets Raft answer the futures await gave up on before
// it shuts Raft down (Raft drops some when it does, and their waiters
// then wait forever), for at most its bound: answers.wait returns as soon
// as none is left, or at the bound with how many are.
func TestAnswersWaitIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var a answers
		start := time.Now()
		if k := a.wait(time.Second); k != 0 || time.Since(start) != 0 {
			t.Fatalf("wait with nothing pending = %d after %v, want 0 at once", k, time.Since(start))
		}
		answered, stuck := stuckFuture{make(chan struct{})}, stuckFuture{make(chan struct{})}
		a.of(answered)
		done := a.of(stuck)
		go func() {
			time.Sleep(300 * time.Millisecond)
			close(answered.release)
		}()
		start = time.Now()
		if k := a.wait(time.Second); k != 1 || time.Since(start) != time.Second {
			t.Fatalf("wait with one future answered at 300ms and one never = %d after %v, want 1 after 1s", k, time.Since(start))
		}
		go func() {
			time.Sleep(200 * time.Millisecond)
			close(stuck.release)
		}()
		start = time.Now()
		if k := a.wait(time.Second); k != 0 || time.Since(start) != 200*time.Millisecond {
			t.Fatalf("wait with the last future answered at 200ms = %d after %v, want 0 after 200ms", k, time.Since(start))
		}
		if err := <-done; err != nil {
			t.Fatalf("answer = %v, want the future's (nil)", err)
		}
	})
}

// Once Raft shuts down, a future handed to answers gets no goroutine to
// wait for it: Raft may drop it unanswered, and its waiter would wait for
// ever (in a synctest bubble, a deadlock at the bubble's end). The
// answer's channel never delivers; await returns on the node's end.
func TestNoWaiterForAnswersOnceRaftShutsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var a answers
		a.close()
		dropped := stuckFuture{make(chan struct{})} // never answered
		done := a.of(dropped)
		if k := a.wait(time.Second); k != 0 {
			t.Fatalf("wait after close with a dropped future = %d waiting, want 0", k)
		}
		select {
		case err := <-done:
			t.Fatalf("an answer (%v) to a future Raft never answered", err)
		case <-time.After(time.Minute):
		}
	})
}
