package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// A rules write is applied by every member within a round trip of its
// commit, not at the leader's next idle replication (Raft's CommitTimeout,
// 20–40 ms): until a key's owner applies the write, the key refills under
// the old rule, and that refill is carried over. An audit measured it with
// real processes: a token bucket of 1000/s tightened to 1 per hour (burst
// 50), its owner a follower, admitted 31–45 after the write's 200 where at
// most 5–19 were left. Fake time: the in-memory transport takes no time,
// so every follower has the write when the leader's PutRules returns.
func TestRulesWriteReachesFollowersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{})
		leader := c.Leader()
		// Raft idle: the next replication is CommitTimeout away.
		time.Sleep(time.Second)
		synctest.Wait()
		r := limiter.Rule{Name: "tight", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour, Burst: 50}
		if _, err := leader.Node().PutRules(context.Background(), []limiter.Rule{r}); err != nil {
			t.Fatal(err)
		}
		want := leader.Node().State().RulesIndex
		synctest.Wait() // what is on its way arrives; no time passes
		for _, m := range c.Members() {
			if st := m.Node().State(); st == nil || st.RulesIndex != want {
				got := uint64(0)
				if st != nil {
					got = st.RulesIndex
				}
				t.Errorf("%s: rules index %d when the leader's write (%d) returned; want it applied within the round trip", m.ID, got, want)
			}
		}
	})
}
