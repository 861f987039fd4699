package clustertest

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
)

// A member whose join is on its way to the leader when its graceful stop
// begins stays marked down. The join, answered after the mark-down,
// listed it active again, with its process gone: a whole cluster stopped
// together then waited on it (over 3s, about 1 run in 100 of
// TestWholeClusterStopsTogetherWithinMoments, where a member's
// registration found it not listed active, as its own mark-down had just
// made it, and joined). A stop now cancels the registration under way
// and waits for it before it marks the member down.
func TestStopOutlastsTheJoinOnItsWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hold atomic.Bool
		var held atomic.Int32
		release := make(chan struct{})
		c := New(t, 3, Options{OnForward: func(from, op string) {
			if op == "join" && hold.Load() {
				held.Add(1)
				<-release
			}
		}})
		leader := c.Leader()
		var m *Member
		for _, x := range c.Members() {
			if x != leader {
				m = x
				break
			}
		}
		// Marked down while it runs (taken for dead, say), the member
		// joins again at once; its join is held on its way.
		hold.Store(true)
		if err := leader.Node().SetState(context.Background(), m.ID, string(fsm.Down)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if held.Load() == 0 {
			t.Fatalf("%s, marked down, sent no join", m.ID)
		}
		stopped := make(chan error)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopped <- m.Node().StopGracefully(ctx)
		}()
		time.Sleep(100 * time.Millisecond)
		close(release)
		if err := <-stopped; err != nil {
			t.Logf("stopping %s: %v", m.ID, err)
		}
		synctest.Wait()
		if st, _ := leader.Node().State().Member(m.ID); st.State != fsm.Down {
			t.Errorf("%s, stopped gracefully, is listed %s (epoch %d): the join it sent before its stop reached the leader after its mark-down", m.ID, st.State, st.Since)
		}
		c.kill(m, false)
	})
}
