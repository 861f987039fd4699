package clustertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
)

// A batch that waits for a partition (its hand-off on the way) is not
// decided once the member's lease has run out meanwhile: by then the
// member may be marked dead and its partitions served by others. Was:
// the lease was checked once, when the batch came, and a batch sent with
// 5 ms of lease left was decided 1.4 s later, after the dead mark (30 of
// 30 runs admitted twice the limit). Found by an audit of leases.
//
// n4 joins; nobody's data-plane calls reach it (its own calls pass: a
// one-way cut), so its hand-offs never arrive and its lease runs out
// DeadAfter/4 + 0.7 DeadAfter after the leader first saw it. A client
// that still reaches n4 sends it a batch just before then, with a 2s
// deadline (stateWait's bound). n4 promotes its (empty) backup copies
// handoffWait after its view, when its lease has run out and the old
// owner serves the partition again: the batch must then go undecided.
// (Its Raft is cut too once it has its view, so it does not learn that
// it is dead.)
func TestBatchWaitingPastItsLeaseIsNotDecided(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, 3, Options{DeadAfter: 2 * time.Second})
		leader := c.Leader()
		c.PutRules(leader.ID, logRule)
		for _, m := range c.Members() {
			c.CutCalls(m.ID, "n4")
		}
		n4 := c.add("n4", true)
		c.WaitFor("n4 in its own ring, awaiting", 10*time.Second, func() bool {
			nd := n4.Node()
			if nd == nil || nd.View() == nil || nd.Owner() == nil {
				return false
			}
			_, ok := nd.View().Ring.Member("n4")
			return ok && nd.Owner().Awaiting() > 0
		})
		c.CutRaft("n4") // nor does the log reach it any more
		v := n4.Node().View()
		o := n4.Node().Owner()
		var key string
		var hash uint64
		var part uint32
		awaiting := o.AwaitingParts()
		for i := 0; ; i++ { // a key of a partition n4 owns in its own view and awaits
			if i == 1<<20 {
				t.Fatalf("no key of n4's awaited partitions %v", awaiting)
			}
			key = fmt.Sprintf("key-%d", i)
			hash = limiter.KeyHash(v.Seed, key)
			part = v.Ring.Partition(hash)
			if ow, _ := v.Ring.Owner(part); ow.ID == "n4" && slices.Contains(awaiting, part) {
				break
			}
		}
		// Just before n4's lease runs out.
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			if rem, _ := o.LeaseRemaining(); o.Serving() && rem <= 5*time.Millisecond {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatal("n4's lease never ran low")
			}
		}
		sent := time.Now()
		req := &transport.BatchRequest{Epoch: v.Epoch(), RulesVersion: v.RulesVersion}
		for range 10 {
			req.Checks = append(req.Checks, transport.Check{Rule: "log", KeyHash: hash, Partition: part, Cost: 1})
		}
		resp := &transport.BatchResponse{Results: make([]transport.Result, len(req.Checks))}
		done := make(chan struct{})
		go func() {
			defer close(done)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			n4.Node().HandleBatch(ctx, req, resp)
		}()
		// Meanwhile the majority marks n4 dead and serves its partitions.
		c.WaitFor("n4 dead", 10*time.Second, func() bool {
			m, _ := leader.Node().State().Member("n4")
			return m.State == fsm.Dead
		})
		deadAt := time.Since(sent)
		c.WaitFor("n4 out of the leader's ring", 10*time.Second, func() bool {
			_, ok := leader.Node().View().Ring.Member("n4")
			return !ok
		})
		majority, _ := spend(c, leader.ID, key, 10)
		<-done
		took := time.Since(sent)
		stale := 0
		for _, r := range resp.Results {
			if r.Status == transport.StatusOK && r.Allowed {
				stale++
			}
		}
		t.Logf("batch sent with %v of lease left, n4 marked dead %v later, batch decided %v after it was sent: %d of 10 allowed (status %v); majority admitted %d",
			5*time.Millisecond, deadAt, took, stale, resp.Results[0].Status, majority)
		if stale+majority > 10 {
			t.Errorf("over-admitted: %d by n4 after its lease ran out + %d by the majority, limit 10", stale, majority)
		}
	})
}

// A member whose lease runs out while it serves says so, at warn level,
// and says when it has it again: its checks are answered unavailable in
// between (by each rule's failure mode). Was: nothing but Raft's own
// election lines said why decisions came back degraded (a new user's
// walk through the README on a starved machine: degraded answers for
// seconds after a restart, no line about the lease).
func TestLeaseLapseIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logbuf.Buffer{}
		c := New(t, 3, Options{DeadAfter: 2 * time.Second, Logs: logs})
		leader := c.Leader()
		var m string // a member that is not the leader
		for _, x := range c.Members() {
			if x.ID != leader.ID {
				m = x.ID
				break
			}
		}
		o := c.Member(m).Node().Owner()
		c.WaitFor(m+" holding a lease", 5*time.Second, o.Serving)
		logs.Take()

		c.CutCalls(m, leader.ID) // its lease requests; the leader's pings still pass
		said := func(msg string) func() bool {
			return func() bool { return strings.Contains(logs.String(), msg) }
		}
		c.WaitFor(m+" saying its lease ran out", 5*time.Second, said("lease ran out"))
		if o.Serving() {
			t.Fatalf("%s said its lease ran out while it holds one", m)
		}
		c.Heal()
		c.WaitFor(m+" saying its lease is renewed", 5*time.Second, said("lease renewed"))
		if !o.Serving() {
			t.Fatalf("%s said its lease is renewed without one", m)
		}

		var out, back int
		for _, l := range logbuf.Parse(t, logs.Take()) {
			msg, _ := l["msg"].(string)
			switch {
			case strings.Contains(msg, "lease ran out"):
				if l["node"] != m || l["level"] != "WARN" || !strings.Contains(fmt.Sprint(l["why"]), leader.ID) {
					t.Errorf("lapse line %v: want a warning from %s naming the leader %s", l, m, leader.ID)
				}
				out++
			case strings.Contains(msg, "lease renewed"):
				if l["node"] != m {
					t.Errorf("renewal line %v: want it from %s", l, m)
				}
				back++
			}
		}
		if out != 1 || back != 1 {
			t.Fatalf("%d lapse and %d renewal lines, want one each", out, back)
		}
	})
}

// A member stopping gracefully is granted no lease once it has marked
// itself down, and its stop's connection drain (up to 2 s in serve)
// outlasts the lease it had: that lapse is the stop's, not a starved
// machine's, and says nothing. Was: a warning 1.3 s (a follower) or
// 0.45 s (a former leader) into every graceful stop (a review).
func TestGracefulStopSaysNothingOfItsLease(t *testing.T) {
	for _, stopLeader := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader=%v", stopLeader), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &logbuf.Buffer{}
				c := New(t, 3, Options{DeadAfter: 2 * time.Second, Logs: logs})
				victim := c.Leader()
				if !stopLeader {
					for _, x := range c.Members() {
						if x.ID != victim.ID {
							victim = x
							break
						}
					}
				}
				o := victim.Node().Owner()
				c.WaitFor(victim.ID+" holding a lease", 5*time.Second, o.Serving)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := victim.Node().StopGracefully(ctx); err != nil {
					t.Fatal(err)
				}
				c.WaitFor(victim.ID+"'s lease run out", 10*time.Second, func() bool { return !o.Serving() })
				time.Sleep(3 * time.Second) // a stop's drain, in the bubble's time: the lease loop keeps looking
				if strings.Contains(logs.String(), "lease ran out") {
					t.Fatalf("a graceful stop logged a lease lapse:\n%s", logs.String())
				}
				c.kill(victim, false)
			})
		})
	}
}

// A whole cluster started again says nothing of leases: a member serves
// without one while its ring lists only itself (a lone member needs
// none), and the lease it needs once the others are back is its first,
// not one that ran out. Was: every follower warned of a lapse about a
// second into every whole-cluster restart (a Compose walk through the
// deployment docs).
func TestWholeClusterRestartSaysNothingOfLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logbuf.Buffer{}
		c := New(t, 3, Options{DataDirs: true, Logs: logs})
		stopTogether(c)
		logs.Take()
		for _, m := range c.Members() {
			c.Restart(m.ID)
		}
		c.WaitSettled(3)
		time.Sleep(5 * time.Second) // in the bubble's time: the lease loops keep looking
		if out := logs.String(); strings.Contains(out, "lease ran out") {
			t.Fatalf("a whole-cluster restart logged a lease lapse:\n%s", out)
		}
	})
}
