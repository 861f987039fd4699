package clustertest

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/router"
)

// A member whose published view lags its log is not ready: the
// bootstrapper, whose view is still the empty ring of the cluster's Init
// when its own registration is in its log, waits until its view shows
// it. Taking it for ready let New add the others at once; the
// bootstrapper's view then went from the empty ring to a ring of three
// (its view loop held, as a loaded scheduler holds it), which it took
// for a gap in the rings it saw, and it awaited hand-offs of its own
// partitions that nobody sends, for handoffWait (45 min at a dead-after
// of an hour): the cluster never settled (2-3 in 40 runs of the
// -race suite under load before the fix).
func TestBootstrapperIsReadyOnlyWithAViewOfItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		// The hold ends when a member sees the ring of three, or after a
		// second, so a bootstrapper that (rightly) waits for its view
		// before anyone joins is let go.
		go func() {
			t := time.NewTimer(time.Second)
			defer t.Stop()
			select {
			case <-t.C:
				free()
			case <-release:
			}
		}()
		New(t, 3, Options{DeadAfter: time.Hour, OnView: func(member string, v *router.View) {
			switch {
			case member == "n1" && len(v.Ring.Members()) == 0:
				<-release // n1's view loop, at the empty ring of the Init
			case len(v.Ring.Members()) == 3:
				free()
			}
		}})
	})
}
