package clustertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// MarkDown, the first step of a graceful stop, answers by its deadline
// (the stop gives it 2s) on a leader whose disk hangs, whether it runs
// on the leader or is forwarded to it, and whether Raft took the write
// and never answered it, never took it (its main loop hangs on the
// first), or another membership change that Raft does not answer holds
// the leader's membership lock. The node's own bounds are 5s for Raft
// to take a write and 5.4s for its answer.
func TestMarkDownAnswersByItsDeadlineOnAStalledLeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before runs on the stalled leader first; from is the member
		// that marks itself down ("" for the leader).
		before func(c *Cluster, leader *Member)
		from   string
		want   time.Duration
		says   string
	}{
		{"taken, never answered", nil, "", 2 * time.Second, "raft had not answered the write when the request ended"},
		{"never taken, forwarded", func(c *Cluster, leader *Member) { putRulesAsync(leader, tightRule); synctest.Wait() },
			"follower", 2*time.Second - 10*time.Millisecond, "timed out enqueuing operation"},
		{"behind an unanswered membership change", func(c *Cluster, leader *Member) {
			go func() { _ = leader.Node().SetState(context.Background(), otherThan(c, leader.ID), "down") }()
			synctest.Wait()
		}, "", 2 * time.Second, "waiting for another membership change"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := New(t, 3, Options{DeadAfter: time.Hour})
				leader := c.Leader()
				resume := c.StallDisk(leader.ID)
				t.Cleanup(resume)
				synctest.Wait()
				if tc.before != nil {
					tc.before(c, leader)
				}
				m := leader
				if tc.from == "follower" {
					m = c.Member(otherThan(c, leader.ID))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				err := m.Node().MarkDown(ctx)
				if took := time.Since(start); took != tc.want || !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("MarkDown of %s with a 2s deadline on a leader whose disk hangs: %v after %v; want unavailable (%s) after %v", m.ID, err, took, tc.says, tc.want)
				}
			})
		})
	}
}

// MarkDown that the leader wrote, but that does not reach the member's
// own log by the deadline (its Raft links are cut), answers unavailable
// too, saying so, rather than the bare context error.
func TestMarkDownNotInTheMembersRingByItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		m := c.Member(otherThan(c, c.Leader().ID))
		c.CutRaft(m.ID) // it still knows the leader, and forwards to it
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := m.Node().MarkDown(ctx)
		if took := time.Since(start); took != 2*time.Second || !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "marked down, but") {
			t.Errorf("MarkDown of %s, cut off from Raft: %v after %v; want unavailable (marked down, but …) after 2s", m.ID, err, took)
		}
	})
}
