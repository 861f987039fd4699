package gctune

import (
	"context"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const MiB = 1 << 20
	for _, tt := range []struct {
		live uint64
		want int
	}{
		{0, 100},
		{1 * MiB, 100},    // small heaps: Go's default
		{8 * MiB, 100},    // 8 MiB headroom is 100%
		{8*MiB + 1, 100},  // rounding up never goes past 100
		{9 * MiB, 89},     // 8/9, rounded up
		{16 * MiB, 50},    // the 8 MiB floor
		{21 * MiB, 39},    // 1M token buckets
		{80 * MiB, 10},    // 8 MiB is 10%
		{160 * MiB, 5},    // 8 MiB is 5%
		{210 * MiB, 5},    // 10M token buckets: 5%, 10.5 MiB
		{1000 * MiB, 5},   // 5%
		{1<<40 + 1, 5},    // huge
		{3 * 8 * MiB, 34}, // 33.3 rounded up
	} {
		if got := Percent(tt.live); got != tt.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", tt.live/MiB, got, tt.want)
		}
	}
}

func TestTuneRespectsTheOperator(t *testing.T) {
	dir := t.TempDir()
	limit := filepath.Join(dir, "memory.max")
	if err := os.WriteFile(limit, []byte("1000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	prevLimit := debug.SetMemoryLimit(-1)
	prevPercent := debug.SetGCPercent(100)
	t.Cleanup(func() {
		debug.SetMemoryLimit(prevLimit)
		debug.SetGCPercent(prevPercent)
	})
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	s := Tune(ctx, env(nil), limit, time.Hour)
	if !s.TuneGOGC || s.MemoryLimit != 900000000 || debug.SetMemoryLimit(-1) != 900000000 {
		t.Errorf("no operator settings: %+v, limit %d; want GOGC tuned and a 900000000 soft limit", s, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(prevLimit)
	s = Tune(ctx, env(map[string]string{"GOGC": "50", "GOMEMLIMIT": "1GiB"}), limit, time.Hour)
	if s.TuneGOGC || s.MemoryLimit != 0 || debug.SetMemoryLimit(-1) != prevLimit {
		t.Errorf("GOGC and GOMEMLIMIT set: %+v; want both left alone", s)
	}
	if err := os.WriteFile(limit, []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s = Tune(ctx, env(map[string]string{"GOGC": "50"}), limit, time.Hour); s.MemoryLimit != 0 {
		t.Errorf(`memory.max "max": %+v; want no soft limit`, s)
	}
	if s = Tune(ctx, env(map[string]string{"GOGC": "50"}), filepath.Join(dir, "absent"), time.Hour); s.MemoryLimit != 0 {
		t.Errorf("no cgroup file: %+v; want no soft limit", s)
	}
}
