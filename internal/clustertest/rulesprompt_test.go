package clustertest

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/limiter"
)

// A rules write is applied by every member within a round trip of its
// commit, not at the leader's next idle replication (Raft's CommitTimeout,
// 250–500 ms): until a key's owner applies the write, the key refills under
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

// A write whose caller gave up waiting still reaches the followers at
// once when it commits: the leader announces what it applied when its
// state changes, not only when an apply returns. The followers' disks
// hang until the caller's deadline has passed, then come back; with no
// time passing after that, every member must have the write. Was: only
// apply announced, and followers waited for Raft's next idle
// replication (CommitTimeout), where a rules write's owner kept
// refilling keys under the old rule.
func TestGivenUpWriteReachesFollowersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		time.Sleep(time.Second) // Raft idle
		synctest.Wait()
		var resume []func()
		for _, m := range c.Members() {
			if m != leader {
				resume = append(resume, c.StallDisk(m.ID))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		r := limiter.Rule{Name: "tight", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour, Burst: 50}
		if _, err := leader.Node().PutRules(ctx, []limiter.Rule{r}); err == nil {
			t.Fatal("PutRules answered with every follower's disk hung; want its deadline's error")
		}
		for _, f := range resume {
			f()
		}
		synctest.Wait() // the write commits; what it sends arrives; no time passes
		want := leader.Node().State().RulesIndex
		if want == 0 {
			t.Fatal("the leader has not applied the write once its followers' disks came back")
		}
		for _, m := range c.Members() {
			if got := m.Node().State().RulesIndex; got != want {
				t.Errorf("%s: rules index %d once the write (%d) committed on the leader; want it applied without waiting for Raft's idle replication", m.ID, got, want)
			}
		}
	})
}

// One write is announced by one barrier, though both its apply and the
// leader's state change announce it: each barrier is a log entry every
// member stores.
func TestWriteAnnouncedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var barriers atomic.Int64
		c := New(t, 3, Options{OnStore: func(member string, logs []*raft.Log) {
			for _, l := range logs {
				if l.Type == raft.LogBarrier && member == "n1" {
					barriers.Add(1)
				}
			}
		}})
		leader := c.Leader()
		time.Sleep(time.Second)
		synctest.Wait()
		before := barriers.Load()
		r := limiter.Rule{Name: "tight", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour, Burst: 50}
		if _, err := leader.Node().PutRules(context.Background(), []limiter.Rule{r}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := barriers.Load() - before; n != 1 {
			t.Errorf("n1 stored %d barriers for one rules write; want 1", n)
		}
	})
}
