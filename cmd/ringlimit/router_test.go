package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/server"
)

// holeProxy forwards TCP to a target until it is turned into a black
// hole: then it drops the connections it carried and accepts new ones
// without ever answering, as a host that died without a RST would.
type holeProxy struct {
	ln     net.Listener
	target string
	hole   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newHoleProxy(t testing.TB, target string) *holeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.dropAll() })
	return p
}

func (p *holeProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if p.hole.Load() {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		go func() {
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.Copy(c, up)
			c.Close()
		}()
	}
}

func (p *holeProxy) kill() { p.hole.Store(true); p.dropAll() }

func (p *holeProxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

type testMember struct {
	s    *server.Server
	http string
	peer *holeProxy // the data-plane address others use
}

func startTestMember(t testing.TB, id, join string) *testMember {
	t.Helper()
	var ls server.Listeners
	for _, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		*l = ln
	}
	px := newHoleProxy(t, ls.Peer.Addr().String())
	s, err := server.Start(server.Config{
		ID: id, HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(),
		PeerAdvertise: px.ln.Addr().String(), DataDir: t.TempDir(), Join: []string{join},
		Ring: ring.Config{Partitions: 64, ReplicationFactor: 32, Load: 1.25}, RaftTimeout: 300 * time.Millisecond,
		Router: router.Config{Timeout: 5 * time.Second}, DeadAfter: time.Hour,
	}, ls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return &testMember{s: s, http: ls.HTTP.Addr().String(), peer: px}
}

// twoMembersWith starts members n1 and n2, writes rules and waits until
// both hold every one of them.
func twoMembersWith(t *testing.T, rules ...limiter.Rule) (n1, n2 *testMember) {
	t.Helper()
	n1 = startTestMember(t, "n1", "")
	n2 = startTestMember(t, "n2", n1.http)
	eventuallyWhy(t, "2 members", func() string { return unsettled([]*testMember{n1, n2}) })
	if _, err := n1.s.Node.PutRules(context.Background(), rules); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rules on both members", func() bool {
		for _, m := range []*testMember{n1, n2} {
			v := m.s.Node.View()
			if v == nil {
				return false
			}
			for _, r := range rules {
				if v.Rules[r.Name] == nil {
					return false
				}
			}
		}
		return true
	})
	return n1, n2
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWhy(t, what, func() string {
		if cond() {
			return ""
		}
		return "not yet"
	})
}

// eventuallyWhy waits until cond returns "", failing with cond's last
// answer (why it does not hold yet) when the budget runs out.
func eventuallyWhy(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func settled(ms []*testMember) bool { return unsettled(ms) == "" }

// unsettled says why ms are not a settled cluster of len(ms) members
// (every one ready, with a ring of them all at one epoch), or "".
func unsettled(ms []*testMember) string {
	var epoch uint64
	for i, m := range ms {
		v := m.s.Node.View()
		if v == nil {
			return m.s.Node.ID() + ": no view"
		}
		if err := m.s.Node.Ready(); err != nil {
			return m.s.Node.ID() + ": " + err.Error()
		}
		if n := len(v.Ring.Members()); n != len(ms) {
			return fmt.Sprintf("%s: %d members in its ring at epoch %d", m.s.Node.ID(), n, v.Ring.Epoch())
		}
		if i > 0 && v.Ring.Epoch() != epoch {
			return fmt.Sprintf("%s: epoch %d, %s: epoch %d", ms[0].s.Node.ID(), epoch, m.s.Node.ID(), v.Ring.Epoch())
		}
		epoch = v.Ring.Epoch()
	}
	return ""
}

// postBatch sends one batch through the router's HTTP front door. It
// may be called from any goroutine.
func postBatch(addr string, checks []api.CheckRequest) ([]api.Decision, error) {
	body, err := json.Marshal(api.BatchRequest{Checks: checks})
	if err != nil {
		return nil, err
	}
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("POST /v1/check: %d %s", resp.StatusCode, b)
	}
	var out api.BatchResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("POST /v1/check: decoding the answer: %w", err)
	}
	if len(out.Results) != len(checks) {
		return nil, fmt.Errorf("POST /v1/check: %d results for %d checks", len(out.Results), len(checks))
	}
	return out.Results, nil
}

// checkBatch is postBatch on the test goroutine: an error ends the test
// (t.Fatal may not be called from other goroutines; they use postBatch).
func checkBatch(t *testing.T, addr string, checks []api.CheckRequest) []api.Decision {
	t.Helper()
	res, err := postBatch(addr, checks)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func one(cost int64) *int64 { return &cost }

// Two members and a router: limits are exact through the router; a
// third member joins under load and the router follows with no degraded
// answer and still exact limits; a member's data plane dies and the
// router answers its keys by each rule's failure mode within its timeout.
func TestRouterFollowsTheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	n1, n2 := twoMembersWith(t,
		limiter.Rule{Name: "five", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour},
		limiter.Rule{Name: "shut", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour, FailureMode: limiter.FailClosed},
	)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Generous: a partition whose hand-off is still in flight makes its new
	// owner wait for the state within the check's budget, and an owner that
	// has not answered when the budget ends is answered by failure mode.
	timeout := 2 * time.Second
	cluster, token, refresh, linger, batch := n1.http+","+n2.http, "", 200*time.Millisecond, router.DefaultConfig().Linger, 512
	rp, err := startRouter(followerFlags{cluster: &cluster, adminToken: &token, refresh: &refresh, fwdTimeout: &timeout,
		linger: &linger, maxBatch: &batch}, ln, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rp.shutdown(context.Background()) })
	addr := ln.Addr().String()
	eventually(t, "the router's view with the rules", func() bool {
		v := rp.ring.Router().View()
		return v != nil && v.Rules["five"] != nil
	})

	// Exact: 40 keys, 8 rounds of one batch each: 5 admitted per key.
	keys := func(prefix string, n int, cost int64) []api.CheckRequest {
		var cs []api.CheckRequest
		for i := range n {
			cs = append(cs, api.CheckRequest{Rule: "five", Key: fmt.Sprintf("%s%d", prefix, i), Cost: one(cost)})
		}
		return cs
	}
	admitted := map[string]int{}
	degraded := 0
	round := func(cs []api.CheckRequest) {
		for i, d := range checkBatch(t, addr, cs) {
			if d.Allowed {
				admitted[cs[i].Key]++
			}
			if d.Degraded {
				degraded++
			}
		}
	}
	for range 8 {
		round(keys("a", 40, 1))
	}
	for k, n := range admitted {
		if n != 5 {
			t.Fatalf("key %s admitted %d times through the router, want 5", k, n)
		}
	}
	if degraded != 0 {
		t.Fatalf("%d degraded answers from a healthy cluster", degraded)
	}

	// A third member joins while checks flow.
	clear(admitted)
	for range 3 {
		round(keys("b", 40, 1))
	}
	stop := make(chan struct{})
	var during sync.WaitGroup
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); during.Wait() }
	// Also when the test goroutine fails before the join settles: the
	// checks stop before the members do, and report nothing after the end.
	defer halt()
	var mu sync.Mutex
	duringAdmitted := map[string]int{} // non-degraded admissions
	duringDegraded := map[string]int{}
	during.Go(func() {
		// At least 8 rounds, as for the "a" keys, so every key reaches its
		// limit however few rounds fit in the join (a join can settle in
		// 4 rounds, and then a key admitted 4 times was exact, not lost).
		for rounds := 0; ; rounds++ {
			select {
			case <-stop:
				if rounds >= 8 {
					return
				}
			default:
			}
			cs := keys("c", 20, 1)
			res, err := postBatch(addr, cs)
			if err != nil {
				// Not t.Fatal: this is not the test goroutine. The test
				// stops once the join has settled (see halt).
				t.Errorf("checks during the join, round %d: %v", rounds+1, err)
				return
			}
			mu.Lock()
			for i, d := range res {
				switch {
				case d.Degraded:
					duringDegraded[cs[i].Key]++
				case d.Allowed:
					duringAdmitted[cs[i].Key]++
				}
			}
			mu.Unlock()
		}
	})
	n3 := startTestMember(t, "n3", n1.http)
	all := []*testMember{n1, n2, n3}
	eventuallyWhy(t, "3 members", func() string { return unsettled(all) })
	eventually(t, "the router follows to 3 members", func() bool {
		v := rp.ring.Router().View()
		return v != nil && len(v.Ring.Members()) == 3 && v.Ring.Epoch() == n1.s.Node.View().Ring.Epoch()
	})
	halt()
	if t.Failed() {
		t.FailNow() // the checks during the join failed: the counts below mean nothing
	}
	for range 5 {
		round(keys("b", 40, 1))
	}
	for k, n := range admitted {
		if n != 5 {
			t.Errorf("key %s admitted %d times across the join, want 5", k, n)
		}
	}
	for k, n := range duringAdmitted {
		if n > 5 || (n != 5 && duringDegraded[k] == 0) {
			t.Errorf("key %s (checked during the join) admitted %d times by its owners (%d degraded answers), want 5", k, n, duringDegraded[k])
		}
	}
	mf, _ := rp.reg.Gather()
	for _, f := range mf {
		switch f.GetName() {
		case "ringlimit_not_owner_total", "ringlimit_forward_errors_total", "ringlimit_degraded_total":
			var sum float64 // ringlimit_degraded_total has a series per rule
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			t.Logf("router %s = %v", f.GetName(), sum)
		}
	}
	if degraded != 0 {
		t.Fatalf("%d degraded answers through the router before and after the join", degraded)
	}
	// KNOWN (reported to node's owner): while a partition's hand-off is in
	// flight or the new member holds no lease yet, the owner answers
	// UNAVAILABLE at once and the router answers by failure mode. The
	// owners themselves never over-admit (checked above); the count of
	// such answers is logged until the owner waits instead.
	if n := len(duringDegraded); n > 0 {
		t.Logf("KNOWN: %d keys got degraded answers during the join", n)
	}
	if len(duringAdmitted) != 20 {
		t.Fatalf("only %d keys were checked during the join", len(duringAdmitted))
	}

	// n2's data plane dies: its keys are answered by failure mode, within
	// the router's timeout.
	v := rp.ring.Router().View()
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("d%d", i)
		if m, _ := v.Ring.Owner(v.Ring.Partition(limiter.KeyHash(v.Seed, k))); m.ID == "n2" {
			key = k
		}
	}
	n2.peer.kill()
	start := time.Now()
	res := checkBatch(t, addr, []api.CheckRequest{{Rule: "five", Key: key}, {Rule: "shut", Key: key}})
	took := time.Since(start)
	if !res[0].Allowed || !res[0].Degraded || res[1].Allowed || !res[1].Degraded {
		t.Fatalf("owner dead: open rule %+v, closed rule %+v; want allowed+degraded and denied+degraded", res[0], res[1])
	}
	// The bound tells an answer by the timeout from one that waits on
	// (twice the timeout and more); its slack is for a loaded 2-core
	// machine (2.41 s once, with other test processes running).
	if took > timeout+time.Second {
		t.Fatalf("the failure mode answered after %v, want within the %v timeout", took, timeout)
	}
	t.Logf("failure mode answered in %v (timeout %v)", took, timeout)
}
