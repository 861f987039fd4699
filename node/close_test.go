package node

import (
	"testing"
	"testing/synctest"

	"github.com/hashicorp/raft"
)

// goLoop starts nothing once Close has begun: a request answered as or
// after its node closes (a member's own leave, which the leader answers
// once the member has applied its removal, by which time the member may
// have stopped) must not add to the WaitGroup Close waits on, which is a
// race, and a goroutine Close did not wait for.
func TestGoLoopStartsNothingOnceClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, trans := raft.NewInmemTransport("raft-a")
		n, err := Open(Config{ID: "a", HTTPAddr: "http-a:1", RaftAdvertise: "raft-a", PeerAddr: "peer-a:1",
			RaftTransport: trans, LogStore: raft.NewInmemStore(), StableStore: raft.NewInmemStore(), SnapshotStore: raft.NewInmemSnapshotStore(),
			Forward: nopForwarder{}, DataPlane: nopDataPlane{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		ran := false
		if n.goLoop(func() { ran = true }) {
			t.Error("goLoop after Close reported that it started its goroutine")
		}
		synctest.Wait()
		if ran {
			t.Error("goLoop after Close ran its function")
		}
	})
}
