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

// stalledLeader starts a cluster of 3 (no member marked dead while the
// test runs) and stalls its leader's disk until resume, or the test's
// cleanup, which runs before the cluster closes. It returns once Raft's
// main loop is idle: the next write it takes hangs storing it.
func stalledLeader(t *testing.T) (c *Cluster, leader *Member, resume func()) {
	t.Helper()
	c = New(t, 3, Options{DeadAfter: time.Hour})
	leader = c.Leader()
	resume = c.StallDisk(leader.ID)
	t.Cleanup(resume)
	synctest.Wait()
	return c, leader, resume
}

// A leader whose disk hangs keeps calling itself leader and takes a write
// into its log, which Raft then never answers: the write answers
// "unavailable" within the bound instead of hanging, and commits once the
// disk is back (the outcome was unknown, not failed).
func TestStalledLeaderAnswersWritesUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, leader, resume := stalledLeader(t)

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
		c, leader, resume := stalledLeader(t)

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
// barrier a join waits for first (the log before it) is never answered,
// and the error, which says so and wraps api.ErrUnavailable, is not
// wrapped in it again.
func TestStalledLeaderAnswersJoinUnavailableOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, leader, _ := stalledLeader(t)

		_, err := leader.Node().Join(context.Background(), api.JoinRequest{ID: "n9", HTTP: "http-n9:1", Raft: "raft-n9:1", Peer: "peer-n9:1"})
		if !errors.Is(err, api.ErrUnavailable) || strings.Count(err.Error(), "unavailable") != 1 || !strings.HasPrefix(err.Error(), "unavailable: adding n9: the log before it was not confirmed (raft did not answer in time)") {
			t.Fatalf("Join on a leader whose disk hangs: %v; want one error wrapping api.ErrUnavailable once, reading \"unavailable: adding n9: the log before it was not confirmed (raft did not answer in time) …\"", err)
		}
	})
}

// A write's deadline bounds both of Raft's waits on a leader whose disk
// hangs: the wait for Raft's answer to a write it took, and, once its
// main loop hangs on that write, the wait for it to take the next one.
// Either answers "unavailable" at the deadline, well before the node's
// own bounds (5.4s here, and 5s to take a write), so that an HTTP write
// can answer within the server's write timeout.
func TestStalledLeaderAnswersWritesByTheirDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, leader, _ := stalledLeader(t)

		for _, tc := range []struct {
			name         string
			within, want time.Duration
			says         string
		}{
			{"taken, never answered", 2 * time.Second, 2 * time.Second, "raft had not answered the write when the request ended"},
			// Raft stops trying to take it just before the deadline, so
			// that its answer (not written) is not mistaken for a write
			// taken and not answered.
			{"never taken", time.Second, time.Second - 10*time.Millisecond, "timed out enqueuing operation"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), tc.within)
			start := time.Now()
			_, err := leader.Node().PutRules(ctx, []limiter.Rule{tightRule})
			cancel()
			if took := time.Since(start); took != tc.want || !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%s: PutRules with a %v deadline on a leader whose disk hangs: %v after %v; want unavailable (%s) after %v", tc.name, tc.within, err, took, tc.says, tc.want)
			}
		}
	})
}

// A rules write through a follower answers once the follower has the
// leader's rules version of the write's answer, not once its rules equal
// the set it wrote: a later write applied in the same update never shows
// that set. The follower's disk stalls while its write commits and
// another lands after it; when the disk is back it applies both, mostly
// in one update.
// Was: 5 s, then 503 "written but not in force on this node yet" (an
// audit: 8 of 1,350 PUTs racing through three members).
func TestFollowerWriteOvertakenByAnotherAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		f := c.Member(otherThan(c, leader.ID))
		resume := c.StallDisk(f.ID)
		defer resume()
		first := limiter.Rule{Name: "first", Algorithm: limiter.TokenBucket, Limit: 5, Period: time.Second}
		later := limiter.Rule{Name: "later", Algorithm: limiter.TokenBucket, Limit: 5, Period: time.Second}
		errc := putRulesAsync(f, first)
		c.WaitFor("the follower's write in force on the leader", 10*time.Second, func() bool {
			return leader.Router().View().Rules["first"] != nil
		})
		if _, err := leader.Node().PutRules(context.Background(), []limiter.Rule{later}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		start := time.Now()
		resume()
		if err := <-errc; err != nil {
			t.Fatalf("the follower's write, overtaken: %v after the disk came back", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("the follower's write answered %v after its disk came back, want at once", took)
		}
		// Read your writes: "first" in force on the follower, or the
		// write that replaced it (whether its view showed "first" on the
		// way depends on whether it applied the two entries in one
		// update: the case that hung).
		if v := f.Router().View(); v.Rules["first"] == nil && v.Rules["later"] == nil {
			t.Fatalf("the follower answered with neither write in force: %v", v.List)
		}
	})
}

// Every member snapshots its Raft log once it holds about a thousand
// entries past its last snapshot, within two of Raft's snapshot intervals
// (30 s to 60 s): a restart replays only the entries after it. 600 rules
// writes (1,200 entries: each write is followed by a barrier). Was:
// hashicorp/raft's 8,192 entries and 120 s, and a member restarted over
// 10,000 entries of 100-rule writes took 10–13 s to be ready (an audit).
func TestRulesWritesAreSnapshottedSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: time.Hour})
		leader := c.Leader()
		for i := range 600 {
			r := limiter.Rule{Name: "churn", Algorithm: limiter.TokenBucket, Limit: int64(10 + i), Period: time.Second}
			if _, err := leader.Node().PutRules(context.Background(), []limiter.Rule{r}); err != nil {
				t.Fatal(err)
			}
		}
		c.WaitFor("a snapshot on every member", 2*time.Minute, func() bool {
			for _, m := range c.Members() {
				if idx := m.Node().Raft().Stats()["last_snapshot_index"]; idx == "" || idx == "0" {
					return false
				}
			}
			return true
		})
	})
}
