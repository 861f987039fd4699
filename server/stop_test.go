package server

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// A member stopped right after Start returns stops. serve does that when
// the cluster refuses its id as a live member's (Conflict), which can be
// answered before Start returns; the goroutine that serves HTTP may then
// not have run yet, and fasthttp's Shutdown before its Serve changes
// nothing: Serve then accepted for ever and stop waited for it (a
// duplicate process that never exited, seen under load in
// cmd/ringlimit's TestServeDuplicateIDExits). With one P the new
// goroutines run only once the stopping one blocks, as under load.
func TestStopRightAfterStart(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 10 {
		ls := listen(t)
		s, err := Start(Config{
			ID: "n1", HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: t.TempDir(), Ring: ring.Config{Partitions: 16, ReplicationFactor: 16, Load: 1.25},
			RaftTimeout: testRaftTimeout, Logger: testLogger(),
		}, ls)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		done := make(chan error, 1)
		go func() { done <- s.Abort(ctx) }()
		select {
		case <-done:
			cancel()
		case <-time.After(15 * time.Second):
			cancel()
			_ = ls.HTTP.Close() // let the stuck stop end
			t.Fatal("Abort right after Start has not returned after 15s")
		}
	}
}
