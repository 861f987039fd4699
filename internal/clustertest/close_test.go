package clustertest

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// Close has Raft answer the futures the node gave up waiting on before it
// shuts Raft down: Raft drops some it holds when it shuts down (here a
// leadership transfer still in its queue: the leader's main loop hangs on
// its disk, and finds the node shut down when the disk is back), and the
// goroutine waiting for the answer (await) then waited forever, which
// synctest reports as a deadlock once the test ends.
func TestCloseHasRaftAnswerWhatItHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, leader, resume := stalledLeader(t)
		hangMainLoop(c, leader)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := leader.Node().Leave(ctx, leader.ID) // hands the lead on first: Raft takes the transfer, never begins it
		cancel()
		if !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("Leave of the leader whose disk hangs: %v, want an error wrapping api.ErrUnavailable", err)
		}

		closed := make(chan struct{})
		go func() {
			c.Crash(leader.ID)
			close(closed)
		}()
		synctest.Wait() // Close has begun
		resume()
		select {
		case <-closed:
		case <-time.After(applyBound):
			t.Fatalf("Close of a node with a leadership transfer pending still blocked %v after its disk came back", applyBound)
		}
	})
}
