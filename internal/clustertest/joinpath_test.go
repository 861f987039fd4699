package clustertest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// A joining member whose join's answer was lost, and whose path to the
// leader's HTTP address then drops everything while Raft's works, joins
// through another member, which forwards its join to the leader. It
// knew the leader by then (from Raft), asked it alone at every retry,
// and stayed unready for as long as the path failed: it needs the
// answer's epoch to act on its log.
func TestJoinerWhoseLeaderHTTPFailsJoinsThroughAnotherMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *Cluster
		var lost atomic.Bool
		c = New(t, 3, Options{DeadAfter: time.Hour, JoinAnswer: func(from string, epoch uint64, err error) (uint64, error) {
			if from == "n4" && err == nil && lost.CompareAndSwap(false, true) {
				c.CutHTTP("n4", c.Leader().ID)
				return 0, fmt.Errorf("%w: the answer was lost", api.ErrUnavailable)
			}
			return epoch, err
		}})
		c.Join("n4")
		if !lost.Load() {
			t.Fatal("n4's first join answer was not lost: the test tested nothing")
		}
	})
}
