package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
)

// A single member stopped gracefully keeps its budgets over a restart (at
// other addresses, as the embedded gateway restarts): the state goes to a
// file in the data dir at the stop and comes back at the start, and the
// time it was down counts. The file is gone once loaded.
func TestSingleMemberRestartKeepsBudgets(t *testing.T) {
	dir := t.TempDir()
	s := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s}, 1)
	putRules(t, []*Server{s},
		limiter.Rule{Name: "hourly", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Hour},
		limiter.Rule{Name: "fast", Algorithm: limiter.TokenBucket, Limit: 1, Period: 50 * time.Millisecond, Burst: 1})
	for i := range 3 {
		if r := check(t, s, "hourly", "spent"); !r.Allowed || r.Degraded {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	if r := check(t, s, "fast", "refills"); !r.Allowed {
		t.Fatalf("fast: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "buckets.rlsnap")); err != nil {
		t.Fatalf("no bucket file after a graceful stop: %v", err)
	}

	s2 := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s2}, 1)
	if r := check(t, s2, "hourly", "spent"); r.Allowed || r.Degraded {
		t.Fatalf("after the restart the spent key is %+v, want denied (3 of 3 spent before the stop)", r)
	}
	if r := check(t, s2, "hourly", "fresh"); !r.Allowed || r.Remaining != 2 {
		t.Fatalf("a fresh key after the restart: %+v, want allowed with 2 left", r)
	}
	if r := check(t, s2, "fast", "refills"); !r.Allowed {
		t.Fatalf("a 50ms bucket spent before the stop: %+v, want refilled by the time down", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "buckets.rlsnap")); !os.IsNotExist(err) {
		t.Fatalf("bucket file still there after loading it: %v", err)
	}
}

// A whole cluster stopped gracefully all at once (SIGTERM to every member
// together, as README's "stop all its members together" does) keeps its
// budgets over a restart: the member left last active receives the
// others' partitions and writes them to its data dir. The leader marked
// every member down, the last one included, so no member owned anything
// and nothing was written: every key came back full.
func TestWholeClusterStoppedTogetherKeepsBudgets(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var ss []*Server
	var addrs [][3]string
	for i, dir := range dirs {
		join := ""
		if i > 0 {
			join = ss[0].cfg.HTTPAdvertise
		}
		s := startMember(t, fmt.Sprintf("n%d", i+1), dir, join)
		ss = append(ss, s)
		addrs = append(addrs, [3]string{s.cfg.HTTPAdvertise, s.cfg.RaftAdvertise, s.cfg.PeerAdvertise})
	}
	waitSettled(t, ss, 3)
	waitPromoted(t, ss)
	putRules(t, ss, limiter.Rule{Name: "hourly", Algorithm: limiter.SlidingLog, Limit: 2, Period: time.Hour})
	const keys = 30
	for k := range keys {
		for i := range 2 {
			if r := check(t, ss[k%3], "hourly", fmt.Sprint("k", k)); !r.Allowed || r.Degraded {
				t.Fatalf("key %d, check %d: %+v", k, i, r)
			}
		}
	}

	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Logf("stopping %s: %v", s.Node.ID(), err)
			}
		})
	}
	wg.Wait()
	saved := 0
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "buckets.rlsnap")); err == nil {
			saved++
		}
	}
	if saved == 0 {
		t.Error("no member wrote its bucket state")
	}

	ss = make([]*Server, 3)
	for i := range dirs {
		wg.Go(func() { ss[i] = restartMemberAt(t, fmt.Sprintf("n%d", i+1), dirs[i], addrs[i]) })
	}
	wg.Wait()
	waitSettled(t, ss, 3)
	denied := 0
	for k := range keys {
		r := check(t, ss[k%3], "hourly", fmt.Sprint("k", k))
		if !r.Allowed && !r.Degraded {
			denied++
		}
	}
	if denied != keys {
		t.Fatalf("after the restart %d of %d keys spent before the stop were denied, want all", denied, keys)
	}
}

// restartMemberAt starts member id over dir at the addresses it had
// (HTTP, Raft, peer): its peers' Raft configuration names them.
func restartMemberAt(t *testing.T, id, dir string, addrs [3]string) *Server {
	t.Helper()
	var ls Listeners
	for i, l := range []*net.Listener{&ls.HTTP, &ls.Raft, &ls.Peer} {
		ln, err := net.Listen("tcp", addrs[i])
		if err != nil {
			t.Error(err)
			return nil
		}
		*l = ln
	}
	s, err := startMemberOn(t, id, dir, "", ls)
	if err != nil {
		t.Error(err)
	}
	return s
}

// A stop that cannot write its bucket file (here: a directory in its
// place, as a full disk would fail it) says so: Shutdown fails with
// node.ErrBucketsNotSaved, and serve exits 1 on it. Was: a WARN saying
// the state was kept in the data dir, and exit 0.
func TestStopThatCannotSaveBucketsFails(t *testing.T) {
	s, dir := spentSolo(t)
	if err := os.Mkdir(filepath.Join(dir, "buckets.rlsnap"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, node.ErrBucketsNotSaved) {
		t.Fatalf("Shutdown = %v, want an error wrapping node.ErrBucketsNotSaved", err)
	}
}

// A single member whose bucket file is damaged at its start serves every
// partition from nothing, and counts them where the budgets-reset alert
// looks (ringlimit_partitions_served_from_nothing_total): it logged an
// ERROR and counted none.
func TestSingleMemberWithADamagedBucketFileCountsItsResets(t *testing.T) {
	dir := t.TempDir()
	s := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "buckets.rlsnap")
	if err := os.WriteFile(path, []byte("not a bucket file"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s2}, 1)
	o := s2.Node.Owner()
	if got, want := o.ServedFromNothing(), uint64(o.Partitions()); got != want {
		t.Fatalf("served from nothing: %d, want every partition (%d)", got, want)
	}
}

// A stop whose hand-offs and bucket save take all of its deadline (a
// large table saved on a slow disk) has lost nothing: it closes what is
// left at once and succeeds, so serve exits 0. Was: the HTTP and data
// plane shutdowns, handed the spent deadline, failed the stop with
// "context deadline exceeded" after "bucket state saved", and serve
// exited 1 (a helper's 8M-key member: 12 s stops under a 10 s
// --drain-timeout).
func TestStopPastItsDeadlineAfterSavingSucceeds(t *testing.T) {
	s, dir := spentSolo(t)
	c, err := net.Dial("tcp", s.cfg.HTTPAdvertise) // a client's kept connection, idle
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // spent before the stop begins
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown past its deadline, the buckets saved: %v, want nil", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "buckets.rlsnap")); err != nil {
		t.Fatalf("no bucket file: %v", err)
	}
}

// spentSolo is a single member, settled, with one key of an hourly
// sliding_log rule spent once, and its data dir.
func spentSolo(t *testing.T) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	s := startMember(t, "solo", dir, "")
	waitSettled(t, []*Server{s}, 1)
	putRules(t, []*Server{s}, limiter.Rule{Name: "hourly", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Hour})
	if r := check(t, s, "hourly", "spent"); !r.Allowed {
		t.Fatalf("check: %+v", r)
	}
	return s, dir
}
