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

// A join answers by its caller's deadline on a leader whose disk hangs,
// not at the node's own bound (5.4s here): whether Raft has taken the
// change to its configuration and not answered it, or another membership
// change that Raft does not answer holds the leader's membership lock.
// It waited on Raft with the node's context, so a joining member's
// request (5s), or an operator's, outlived its deadline.
func TestJoinAnswersByItsDeadlineOnAStalledLeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(c *Cluster, leader *Member)
		says   string
	}{
		// A join first waits for the log before it (a barrier), which is
		// what Raft takes first, as for a mark-down.
		{"taken, never answered", nil, "the log before it was not confirmed (raft did not answer in time); nothing written"},
		{"behind an unanswered membership change", func(c *Cluster, leader *Member) {
			go func() { _ = leader.Node().SetState(context.Background(), otherThan(c, leader.ID), "down") }()
			synctest.Wait()
		}, "waiting for another membership change"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, leader, _ := stalledLeader(t)
				if tc.before != nil {
					tc.before(c, leader)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				_, err := leader.Node().Join(ctx, api.JoinRequest{ID: "n9", HTTP: "http-n9:1", Raft: "raft-n9:1", Peer: "peer-n9:1"})
				if took := time.Since(start); took != 2*time.Second || !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("Join with a 2s deadline on a leader whose disk hangs: %v after %v; want unavailable (%s) after 2s", err, took, tc.says)
				}
			})
		})
	}
}

// A leader decides a join on a state that holds every write before it.
// Cut off from its quorum, it cannot confirm that, and answers
// unavailable, not from what its FSM shows. It answered from its FSM at
// once: a leader just elected, still replaying the log it leads with,
// took the last active member (itself, after a whole cluster restarted
// together) for one of two listed active, from a process it had not
// seen, and marked it down: every budget started afresh (1 run in about
// 800 of TestWholeClusterRestartedTogetherKeepsBudgets's).
func TestJoinWaitsForTheLogBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{})
		leader := c.Leader()
		m := c.Member(otherThan(c, leader.ID))
		c.CutRaft(leader.ID)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// Listed active at these addresses, and no incarnation: a join
		// answered before, which the leader answered from its FSM alone.
		_, err := leader.Node().Join(ctx, api.JoinRequest{ID: m.ID, HTTP: m.httpAddr(), Raft: m.raftAddr(), Peer: m.peerAddr()})
		if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "the log before it was not confirmed") {
			t.Errorf("join of %s on a leader cut off from its quorum: %v; want unavailable, the log before it not confirmed", m.ID, err)
		}
	})
}
