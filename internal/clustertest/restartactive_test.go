package clustertest

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
)

// Two members listed active restarted together (crashed, or stopped
// while no leader could mark them down) each have themselves marked down
// first, to recover from their backups. The one that asks second is then
// the last active member, whose mark-down the cluster refuses (nobody
// would take its partitions), and it took that refusal for a duplicate
// process holding its id: it never registered again, and the cluster
// never settled. It now needs no recovery, as a member listed the only
// active one at its restart does not.
func TestMembersListedActiveRestartedTogetherBothServe(t *testing.T) {
	eachRun(t, 10, func(t *testing.T) {
		c := New(t, 3, Options{DataDirs: true})
		spendTogether(t, c, 12)
		c.Stop("n1", 10*time.Second) // down: no part in what follows
		c.Crash("n2")
		c.Crash("n3")
		for _, id := range []string{"n1", "n2", "n3"} {
			c.Restart(id)
		}
		c.WaitSettled(3)
	})
}

// The cluster refuses to mark its last active member down; that check
// must count a mark-down whose write is still pending. Here the first of
// two asked (for B) answers "unavailable" while the leader's disk hangs
// on storing it, and commits once the disk is back: the second (for the
// leader itself) was checked against the state before the first and
// written too, which left the cluster with no active member (seen with
// five members stopped together: the first to join again served every
// partition afresh). It now waits for the log first, and answers
// "unavailable" having written nothing.
func TestMarkDownsPendingTogetherLeaveOneActive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			armed  atomic.Bool
			c      *Cluster
			leader *Member
			others []*Member
			resume = make(chan func(), 1)
		)
		c = New(t, 3, Options{DeadAfter: time.Hour, OnStore: func(member string, logs []*raft.Log) {
			if armed.Load() && member == others[1].ID && slices.ContainsFunc(logs, func(l *raft.Log) bool { return l.Type == raft.LogCommand }) &&
				armed.CompareAndSwap(true, false) {
				resume <- c.StallDisk(member) // the write of this command hangs
			}
		}})
		leader = c.Leader()
		for _, m := range c.Members() {
			if m.ID != leader.ID {
				others = append(others, m)
			}
		}
		c.Stop(others[0].ID, 10*time.Second)
		armed.Store(true)
		// Both stop (so neither registers again once marked down).
		for _, m := range []*Member{others[1], leader} {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			err := m.Node().MarkDown(ctx)
			cancel()
			if !errors.Is(err, api.ErrUnavailable) {
				t.Fatalf("marking %s down on a leader whose disk hangs: %v, want unavailable", m.ID, err)
			}
		}
		(<-resume)()
		c.WaitFor(others[1].ID+" marked down", 10*time.Second, func() bool {
			m, _ := leader.Node().State().Member(others[1].ID)
			return m.State == fsm.Down
		})
		time.Sleep(time.Second) // anything else written commits meanwhile (virtual time)
		if active := leader.Node().State().Active(); len(active) != 1 {
			t.Fatalf("active members after both writes: %v, want the leader alone", active)
		}
	})
}

// A member whose mark-down fails (it cannot reach the leader) while a
// hand-off to it is on its way takes the hand-off before it saves its
// state. It saved at once, and refused the hand-off from then on
// (sealed), so its sender, stopping too, waited out its whole drain.
func TestStopWithFailedMarkDownTakesHandoffsOnTheirWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DataDirs: true, DeadAfter: time.Hour})
		leader := c.Leader().ID
		var from, to string
		for _, m := range c.Members() {
			switch {
			case m.ID == leader:
			case from == "":
				from = m.ID
			default:
				to = m.ID
			}
		}
		c.PutRules(leader, tightRule)
		for i := range 8 { // some of them go to `to` when `from` leaves
			if r := c.Check(leader, tightRule.Name, c.KeyOwnedBy(from, i), tightRule.Limit); !r.Allowed {
				t.Fatalf("spending: %+v", r)
			}
		}
		c.SetLink(from, to, true, 0) // from's hand-offs to `to` hang
		took := make(chan time.Duration, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			if err := c.Member(from).Node().StopGracefully(ctx); err != nil {
				t.Errorf("stopping %s: %v", from, err)
			}
			took <- time.Since(start)
			c.Crash(from)
		}()
		c.WaitFor(to+" awaiting "+from+"'s hand-offs", 10*time.Second, func() bool {
			return c.Member(to).Node().Owner().Awaiting() > 0
		})
		c.CutHTTP(to, leader) // its mark-down fails after its 2s bound
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			c.Stop(to, 10*time.Second)
		}()
		time.Sleep(2500 * time.Millisecond)
		c.SetLink(from, to, false, 0)
		if d := <-took; d > 5*time.Second {
			t.Errorf("%s stopped in %v: its hand-offs to %s, which had saved its state, waited out its drain", from, d, to)
		}
		<-stopped
	})
}
