package clustertest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/router"
)

// seedList is deploy/compose's --join: every member is given all three
// addresses, n1 first, so n1 is the seed.
var seedList = []string{"n1", "n2", "n3"}

// The seed (the member its --join list names first) that comes back
// over an empty data dir (a lost volume) while the others run joins
// their cluster. It bootstrapped a second, one-member cluster: it
// answered every check on fresh budgets and owned every partition,
// while the old cluster listed it down and refused its Raft calls.
//
// Crashed (not stopped), it is still listed active when it comes back:
// its join found it listed and changed nothing, so no partition moved
// and the backups never served what it held; 11 of 30 spent keys were
// fresh again (a new user, real processes and compose). Now its join,
// from a new process, has it marked down first, as a member restarted
// over its data dir after a crash has itself marked.
func TestSeedOverAnEmptyDataDirJoinsTheRunningCluster(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "crashed"}[crash], func(t *testing.T) { seedOverEmptyDataDir(t, crash) })
	}
}

func seedOverEmptyDataDir(t *testing.T, crash bool) {
	synctest.Test(t, func(t *testing.T) {
		var want atomic.Uint64
		// n1's views once it is back: each must be of the running
		// cluster (its hash seed), never a ring of its own.
		var (
			mu      sync.Mutex
			back    bool
			strange []string
		)
		c := NewTogether(t, 3, Options{JoinList: seedList, DataDirs: true, GuardRaft: true, OnView: func(member string, v *router.View) {
			mu.Lock()
			defer mu.Unlock()
			if member == "n1" && back {
				if ms := v.Ring.Members(); v.Seed != want.Load() || len(ms) == 1 {
					strange = append(strange, fmt.Sprintf("epoch %d, hash seed %x, ring of %d", v.Epoch(), v.Seed, len(ms)))
				}
			}
		}})
		want.Store(c.Member("n2").Node().View().Seed)
		c.PutRules("n2", tightRule)
		var keys []string
		for i := range 3 {
			k := c.KeyOwnedBy("n1", i)
			keys = append(keys, k)
			for range tightRule.Limit {
				if r := c.Check("n2", tightRule.Name, k, 1); !r.Allowed {
					t.Fatalf("spending %s: %+v", k, r)
				}
			}
		}
		if crash {
			time.Sleep(time.Second) // the spends reached their backups
			c.Crash("n1")           // docker kill; the volume is lost
		} else {
			c.Stop("n1", 5*time.Second) // docker-compose rm -sf n1: SIGTERM
			c.WaitSettled(2)
		}
		mu.Lock()
		back = true
		mu.Unlock()
		c.RestartWiped("n1")
		c.WaitSettled(3)
		mu.Lock()
		if len(strange) > 0 {
			t.Errorf("n1, back over an empty data dir, published views of another cluster: %v", strange)
		}
		mu.Unlock()

		n1 := c.Member("n1").Node()
		if cf := n1.Raft().GetConfiguration(); cf.Error() != nil || len(cf.Configuration().Servers) != 3 {
			t.Fatalf("n1's Raft configuration: %+v (%v), want the cluster's three members", cf.Configuration().Servers, cf.Error())
		}
		for _, id := range []string{"n2", "n3"} {
			if got, want := c.Member(id).Node().View().Seed, n1.View().Seed; got != want {
				t.Errorf("%s's hash seed %x, n1's %x: two clusters", id, got, want)
			}
		}
		if c.Leader() == nil || c.Leader().Node().Raft().State() != raft.Leader {
			t.Fatal("no leader")
		}
		// The budgets spent before are still spent, whoever is asked.
		for _, via := range []string{"n1", "n2", "n3"} {
			for _, k := range keys {
				if r := c.Check(via, tightRule.Name, k, 0); r.Allowed || r.Degraded {
					t.Errorf("%s via %s after n1 came back wiped: %+v, want denied (spent before)", k, via, r)
				}
			}
		}
	})
}

// Members given the same list and started together form one cluster:
// the seed bootstraps once the others have answered that they hold
// none (at once, not after the grace), and they join it. Started in
// any order, or with one member late past the seed's grace.
func TestMembersGivenOneJoinListFormOneCluster(t *testing.T) {
	for _, tc := range []struct {
		name   string
		order  []string
		late   string // started 20s after the others (past the grace); "" none
		within time.Duration
	}{
		{"seed first", []string{"n1", "n2", "n3"}, "", 3 * time.Second},
		{"seed last", []string{"n3", "n2", "n1"}, "", 3 * time.Second},
		{"one member late", []string{"n1", "n2", "n3"}, "n3", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachRun(t, 5, func(t *testing.T) {
				start := time.Now()
				c := newCluster(t, Options{JoinList: seedList, GuardRaft: true})
				for _, id := range tc.order {
					if id != tc.late {
						c.add(id, true)
					}
				}
				if tc.late != "" {
					c.WaitSettled(2)
					if took := time.Since(start); took < node.DefaultSeedGrace {
						t.Errorf("the seed bootstrapped after %v, with %s silent: want the grace (%v) first", took, tc.late, node.DefaultSeedGrace)
					}
					time.Sleep(20*time.Second - time.Since(start))
					c.add(tc.late, true)
				}
				c.WaitSettled(3)
				if took := time.Since(start); tc.within > 0 && took > tc.within {
					t.Errorf("settled in %v, want within %v", took, tc.within)
				}
				for _, m := range c.Members() {
					if cf := m.Node().Raft().GetConfiguration(); len(cf.Configuration().Servers) != 3 {
						t.Errorf("%s's Raft configuration: %v", m.ID, cf.Configuration().Servers)
					}
				}
			})
		})
	}
}
