package clustertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
)

// applyBound is what these tests allow a Raft write whose outcome Raft
// never reports: the node's bound (applyTimeout + 2 RaftTimeouts, 5.4s
// here) with room to spare, in virtual time.
const applyBound = 10 * time.Second

var tightRule = limiter.Rule{Name: "tight", Algorithm: limiter.TokenBucket, Limit: 2, Period: time.Hour}

// putRulesAsync writes rules through m's node in the background and
// returns where its error arrives.
func putRulesAsync(m *Member, rs ...limiter.Rule) <-chan error {
	errc := make(chan error, 1)
	n := m.Node()
	go func() {
		_, err := n.PutRules(context.Background(), rs)
		errc <- err
	}()
	return errc
}

// A leader whose disk hangs keeps calling itself leader and takes a write
// into its log, which Raft then never answers: the write answers
// "unavailable" within the bound instead of hanging, and commits once the
// disk is back (the outcome was unknown, not failed).
func TestStalledLeaderAnswersWritesUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		resume := c.StallDisk(leader.ID)
		t.Cleanup(resume) // runs before the cluster closes
		synctest.Wait()   // Raft's main loop idle: it takes the write, then hangs storing it

		start := time.Now()
		errc := putRulesAsync(leader, tightRule)
		select {
		case err := <-errc:
			if !errors.Is(err, api.ErrUnavailable) {
				t.Fatalf("PutRules on a leader whose disk hangs: %v, want an error wrapping api.ErrUnavailable", err)
			}
			t.Logf("after %v: %v", time.Since(start), err)
		case <-time.After(applyBound):
			t.Fatalf("PutRules on a leader whose disk hangs still blocked after %v", applyBound)
		}

		resume()
		c.WaitFor("the unknown write committed after all", 10*time.Second, func() bool {
			v := leader.Router().View()
			return v != nil && v.Rules["tight"] != nil
		})
	})
}

// Close releases a write waiting on Raft: the write answers "unavailable"
// as soon as Close begins, not when Raft answers or the bound passes, and
// Close returns once Raft itself can stop (its main loop waits for the
// hung disk: StallDisk).
func TestCloseReleasesAPendingWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		resume := c.StallDisk(leader.ID)
		t.Cleanup(resume)
		synctest.Wait()

		errc := putRulesAsync(leader, tightRule)
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("PutRules returned before the test closed the node: %v", err)
		default:
		}
		// Nothing the leader logged can commit now: when its disk is back
		// Raft answers the write (leadership lost) rather than apply it
		// after the node stopped listening.
		c.CutRaft(leader.ID)

		closed := make(chan struct{})
		go func() {
			c.Crash(leader.ID)
			close(closed)
		}()
		select {
		case err := <-errc:
			if !errors.Is(err, api.ErrUnavailable) {
				t.Fatalf("PutRules pending while its node closed: %v, want an error wrapping api.ErrUnavailable", err)
			}
		case <-time.After(time.Second): // well within the bound: Close, not the bound, ends it
			t.Fatalf("PutRules pending while its node closed still blocked after 1s of Close")
		}

		resume()
		select {
		case <-closed:
		case <-time.After(applyBound):
			t.Fatalf("Close of a node with a write pending still blocked %v after its disk came back", applyBound)
		}
	})
}

// A join on a leader whose disk hangs answers "unavailable" once: the
// Raft membership change is never answered, and await's error, which
// says so and wraps api.ErrUnavailable, is not wrapped in it again.
func TestStalledLeaderAnswersJoinUnavailableOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		resume := c.StallDisk(leader.ID)
		t.Cleanup(resume)
		synctest.Wait()

		err := leader.Node().Join(context.Background(), api.JoinRequest{ID: "n9", HTTP: "http-n9:1", Raft: "raft-n9:1", Peer: "peer-n9:1"})
		if !errors.Is(err, api.ErrUnavailable) || strings.Count(err.Error(), "unavailable") != 1 || !strings.HasPrefix(err.Error(), "adding n9 to raft: unavailable: raft did not answer") {
			t.Fatalf("Join on a leader whose disk hangs: %v; want one error wrapping api.ErrUnavailable once, reading \"adding n9 to raft: unavailable: raft did not answer …\"", err)
		}
	})
}
