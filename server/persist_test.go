package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
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
