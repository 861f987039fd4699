package clustertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
)

// The member that bootstraps a cluster is in its first ring, even when
// another member's join reaches it before its own registration does.
// Started together (README's cluster on one machine), the joining
// members ask the first one as soon as it leads, and its registration
// raced theirs: a first ring of a joiner alone gave that joiner every
// partition for one epoch, and the bootstrapper, in the next ring,
// awaited hand-offs that nobody would send, holding checks for its
// partitions for the hand-off timeout (4s) right after the start.
//
// Here the join is asked as n1's Raft stores its first command (the
// cluster's Init), so it holds n1's membership lock before n1's own
// registration, which waits for that command to apply, asks for it.
func TestBootstrapperIsInTheFirstRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n9 := api.JoinRequest{ID: "n9", HTTP: "http-n9.0:1", Raft: "raft-n9.0:1", Peer: "peer-n9.0:1"}
		var (
			once   sync.Once
			joined = make(chan error, 1)
			mu     sync.Mutex
			first  []string // n1's first ring that lists n9
		)
		c := newCluster(t, Options{
			Prober: neverCaughtUp{}, // n9 is no process: it stays a non-voter, the quorum n1's
			OnView: func(member string, v *router.View) {
				ms := v.Ring.Members()
				mu.Lock()
				defer mu.Unlock()
				if member != "n1" || first != nil || !slices.ContainsFunc(ms, func(m ring.Member) bool { return m.ID == "n9" }) {
					return
				}
				for _, m := range ms {
					first = append(first, m.ID)
				}
			},
		})
		c.opts.OnStore = func(member string, logs []*raft.Log) {
			if member != "n1" || !slices.ContainsFunc(logs, func(l *raft.Log) bool { return l.Type == raft.LogCommand }) {
				return
			}
			once.Do(func() {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, err := c.Member("n1").Node().Join(ctx, n9)
					joined <- err
				}()
			})
		}
		c.add("n1", false)
		if err := <-joined; err != nil {
			t.Fatalf("n9's join: %v", err)
		}
		c.WaitFor("n1 ready", 10*time.Second, func() bool { return c.Member("n1").Node().Ready() == nil })
		mu.Lock()
		got := first
		mu.Unlock()
		if !slices.Contains(got, "n1") {
			t.Errorf("n1's first ring listing n9 is %v: without n1, which bootstrapped the cluster", got)
		}
	})
}

// neverCaughtUp reaches every address and never finds a member caught up.
type neverCaughtUp struct{}

func (neverCaughtUp) Reach(context.Context, string) error { return nil }
func (neverCaughtUp) Ready(context.Context, string) error { return errors.New("not caught up") }

// Members started together (README's `&`) settle within moments and
// answer every check at once, undegraded: no partition waits out a
// hand-off that nobody sends (4s). The harness's together-start does not
// line up the race TestBootstrapperIsInTheFirstRing forces; this is the
// property that race broke, for the start as it usually runs.
func TestMembersStartedTogetherSettleAtOnce(t *testing.T) {
	eachRun(t, 20, func(t *testing.T) {
		start := time.Now()
		c := NewTogether(t, 3, Options{})
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("3 members started together settled in %v, want within 3s", took)
		}
		c.PutRules("n2", tightRule)
		for i := range 30 {
			if r := c.Check(fmt.Sprintf("n%d", i%3+1), tightRule.Name, fmt.Sprintf("k%d", i), 1); !r.Allowed || r.Degraded {
				t.Fatalf("k%d right after the start: %+v", i, r)
			}
		}
	})
}
