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
		{"taken, never answered", nil, "raft had not answered the membership change when the request ended"},
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
