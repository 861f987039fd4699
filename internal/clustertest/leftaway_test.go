package clustertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/node"
)

// crashUntilDead crashes a member that does not lead and waits until the
// leader has marked it dead; it returns its id.
func crashUntilDead(t *testing.T, c *Cluster) string {
	t.Helper()
	victim := otherThan(c, c.Leader().ID)
	c.Crash(victim)
	c.WaitFor(victim+" marked dead", 10*time.Second, func() bool {
		l := c.Leader()
		if l == nil {
			return false
		}
		m, _ := l.Node().State().Member(victim)
		return m.State == fsm.Dead
	})
	return victim
}

// A member that crashed, was marked dead and was then removed (ringlimit
// leave through the leader) never received its removal: started again
// over its data dir, it used to wait for a Raft leader that sent it
// nothing and campaign forever, its votes refused, neither ready nor
// stopped (an operator audit with docker compose). It asks the members
// its log knows, learns that it left, and stops with the error a start
// over a log holding the removal gets, within seconds; the others go on
// as two.
func TestMemberRemovedWhileDeadStopsWhenRestarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: 2 * time.Second, DataDirs: true})
		victim := crashUntilDead(t, c)
		if err := c.Leader().Node().Leave(context.Background(), victim); err != nil {
			t.Fatalf("leave %s (dead): %v", victim, err)
		}
		time.Sleep(time.Second) // the operator's restart comes later: Raft's last append to it is long given up
		c.Restart(victim)
		start := time.Now()
		c.WaitFor(victim+" stopped, restarted after its leave", 10*time.Second, func() bool { return !c.Member(victim).Running() })
		// Two Raft timeouts (200ms each) before it asks, one for the answers.
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s stopped %v after its restart, want within 1s", victim, took)
		}
		err := c.Member(victim).Left()
		if !errors.Is(err, node.ErrDataDir) || !strings.Contains(err.Error(), `member "`+victim+`" left the cluster`) ||
			!strings.Contains(err.Error(), "start it over an empty --data-dir") {
			t.Fatalf("%s stopped with %v; want ErrDataDir, saying it left the cluster and to start it over an empty --data-dir", victim, err)
		}
		c.WaitSettled(2)
	})
}

// The control: a member restarted over its data dir while cut off from
// the others (everything cut, so nobody answers it; or Raft alone, so
// they answer and list it, dead) is not taken for one that left: it
// waits, and once the cut heals it is an active member again.
func TestMemberCutOffWhenRestartedDoesNotStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(c *Cluster, id string)
	}{
		{"partitioned", func(c *Cluster, id string) { c.Partition(id) }},
		{"raft cut, http answers", func(c *Cluster, id string) { c.CutRaft(id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := New(t, 3, Options{DeadAfter: 2 * time.Second, DataDirs: true})
				victim := crashUntilDead(t, c)
				tc.cut(c, victim)
				c.Restart(victim)
				time.Sleep(10 * time.Second)
				if m := c.Member(victim); !m.Running() || m.Left() != nil {
					t.Fatalf("%s, cut off, stopped (running %v): %v", victim, m.Running(), m.Left())
				}
				c.Heal()
				c.WaitSettled(3)
				if m := c.Member(victim); !m.Running() || m.Left() != nil {
					t.Fatalf("%s stopped after the heal: %v", victim, m.Left())
				}
			})
		})
	}
}

// Restarted the moment its leave ends, the member may still receive the
// leader's last append to a server it removes, and catch up past its
// removal in one go, never seeing itself listed: it then re-registered,
// and the cluster took it back as a new member over the data dir of one
// that left. It stops instead (with the left error, or as a member
// removed while running when its log showed it listed first), and the
// cluster never lists it again.
func TestMemberRestartedAsItsLeaveEndsStaysOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: 2 * time.Second, DataDirs: true})
		victim := crashUntilDead(t, c)
		leader := c.Leader()
		if err := leader.Node().Leave(context.Background(), victim); err != nil {
			t.Fatalf("leave %s (dead): %v", victim, err)
		}
		c.Restart(victim)
		c.WaitFor(victim+" stopped, restarted as its leave ended", 10*time.Second, func() bool { return !c.Member(victim).Running() })
		if err := c.Member(victim).Left(); err != nil && !errors.Is(err, node.ErrDataDir) {
			t.Fatalf("%s stopped with %v; want ErrDataDir or none", victim, err)
		}
		time.Sleep(5 * time.Second)
		if _, ok := leader.Node().State().Member(victim); ok {
			t.Fatalf("%s is listed again after its leave", victim)
		}
		c.WaitSettled(2)
	})
}

// A running member that the others removed while its Raft links were cut
// (as while its disk was full: its log could not take the removal) never
// received its removal, and ran on for good, campaigning, neither ready
// nor stopped, after a `leave` that answered "left" (an audit). With no
// Raft leader reaching it, it asks the members it knows, learns that it
// left, and stops with the error a start over a log holding the removal
// gets; the others go on as three.
func TestRunningMemberRemovedWhileCutOffStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 4, Options{DeadAfter: 2 * time.Second})
		victim := otherThan(c, c.Leader().ID)
		c.CutRaft(victim)
		if err := c.Leader().Node().Leave(context.Background(), victim); err != nil {
			t.Fatalf("leave %s (cut off from Raft): %v", victim, err)
		}
		c.WaitFor(victim+" stopped after its removal", 20*time.Second, func() bool { return !c.Member(victim).Running() })
		err := c.Member(victim).Left()
		if !errors.Is(err, node.ErrDataDir) || !strings.Contains(err.Error(), `member "`+victim+`" left the cluster`) {
			t.Fatalf("%s stopped with %v; want ErrDataDir, saying it left the cluster", victim, err)
		}
		c.WaitSettled(3)
	})
}
