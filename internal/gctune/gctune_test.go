package gctune

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
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

const MiB = 1 << 20

func TestRelease(t *testing.T) {
	const live = 200 * MiB // 2% is 4 MiB: the 8 MiB floor holds; 1% is 2 MiB
	settled := Heap{Live: live}
	for _, tt := range []struct {
		name            string
		cur, prev, last Heap
		since           time.Duration
		want            bool
	}{
		{"never released, settled, 26 MiB free", Heap{Live: live, Free: 26 * MiB}, settled, Heap{}, math.MaxInt64, true},
		{"8 MiB free is kept", Heap{Live: live, Free: 8 * MiB}, settled, Heap{}, math.MaxInt64, false},
		{"just over 8 MiB", Heap{Live: live, Free: 8*MiB + 1}, settled, Heap{}, math.MaxInt64, true},
		{"2% of a large heap is kept", Heap{Live: 1000 * MiB, Free: 20 * MiB}, Heap{Live: 1000 * MiB}, Heap{}, math.MaxInt64, false},
		{"over 2% of a large heap", Heap{Live: 1000 * MiB, Free: 21 * MiB}, Heap{Live: 1000 * MiB}, Heap{}, math.MaxInt64, true},
		{"growing: wait", Heap{Live: live, Free: 26 * MiB}, Heap{Live: live - 3*MiB}, Heap{}, math.MaxInt64, false},
		{"shrinking: wait", Heap{Live: live, Free: 26 * MiB}, Heap{Live: live + 3*MiB}, Heap{}, math.MaxInt64, false},
		{"moved by 1% (2 MiB): settled", Heap{Live: live, Free: 26 * MiB}, Heap{Live: live - 2*MiB}, Heap{}, math.MaxInt64, true},
		{"small heap moved by 1 MiB: settled", Heap{Live: 20 * MiB, Free: 9 * MiB}, Heap{Live: 19 * MiB}, Heap{}, math.MaxInt64, true},
		{"small heap moved by 1 MiB + 1: wait", Heap{Live: 20 * MiB, Free: 9 * MiB}, Heap{Live: 19*MiB - 1}, Heap{}, math.MaxInt64, false},
		{"same live heap as the last release, 59 s ago", Heap{Live: live, Free: 26 * MiB}, settled, Heap{Live: live}, 59 * time.Second, false},
		{"live heap within 2 MiB (1%) of the last release", Heap{Live: live, Free: 26 * MiB}, settled, Heap{Live: live - 2*MiB}, 59 * time.Second, false},
		{"same live heap as the last release, 1 min ago", Heap{Live: live, Free: 26 * MiB}, settled, Heap{Live: live}, time.Minute, true},
		{"grew by over 1% since the last release", Heap{Live: live, Free: 26 * MiB}, settled, Heap{Live: live - 2*MiB - 1}, 0, true},
		{"shrank by over 1%", Heap{Live: live, Free: 26 * MiB}, settled, Heap{Live: live + 2*MiB + 1}, time.Second, true},
		{"small heap grew by 1 MiB", Heap{Live: 28 * MiB, Free: 9 * MiB}, Heap{Live: 28 * MiB}, Heap{Live: 27 * MiB}, time.Second, false},
		{"small heap grew by over 1 MiB", Heap{Live: 28 * MiB, Free: 9 * MiB}, Heap{Live: 28 * MiB}, Heap{Live: 27*MiB - 1}, time.Second, true},
		// A collection since the last release freed pages beyond the goal: goal 210, in use 205, 26 free.
		{"collected since, free beyond the goal", Heap{Live: live, Free: 26 * MiB, InUse: 205 * MiB, Goal: 210 * MiB, Cycles: 8}, settled, Heap{Live: live, Cycles: 7}, time.Second, true},
		{"collected since, free within the goal", Heap{Live: live, Free: 13 * MiB, InUse: 205 * MiB, Goal: 210 * MiB, Cycles: 8}, settled, Heap{Live: live, Cycles: 7}, time.Second, false},
		{"collected since, free just over goal + 8 MiB", Heap{Live: live, Free: 13*MiB + 1, InUse: 205 * MiB, Goal: 210 * MiB, Cycles: 8}, settled, Heap{Live: live, Cycles: 7}, time.Second, true},
		{"in use past the goal", Heap{Live: live, Free: 9 * MiB, InUse: 215 * MiB, Goal: 210 * MiB, Cycles: 8}, settled, Heap{Live: live, Cycles: 7}, time.Second, true},
		{"free beyond the goal, no collection since", Heap{Live: live, Free: 26 * MiB, InUse: 205 * MiB, Goal: 210 * MiB, Cycles: 7}, settled, Heap{Live: live, Cycles: 7}, time.Second, false},
		{"nothing free, a minute later", Heap{Live: live, Free: 0}, settled, Heap{Live: live}, time.Hour, false},
		{"empty heap", Heap{}, Heap{}, Heap{}, math.MaxInt64, false},
	} {
		if got := Release(tt.cur, tt.prev, tt.last, tt.since); got != tt.want {
			t.Errorf("%s: Release(%+v, %+v, %+v, %v) = %v, want %v", tt.name, tt.cur, tt.prev, tt.last, tt.since, got, tt.want)
		}
	}
}

// TestTunerSteps drives a tuner through a fill and the quiet after it.
func TestTunerSteps(t *testing.T) {
	var (
		heap     Heap
		percent  = -1
		released int
	)
	tu := newTuner(func() (Heap, bool) { return heap, true }, func(p int) int { percent = p; return 0 }, func() { released++ })
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for i, st := range []struct {
		at          time.Duration
		live, free  uint64
		wantPercent int // -1: not set by this step
		wantRelease bool
	}{
		{0, 4 * MiB, 2 * MiB, -1, false},                   // small heap: GOGC stays 100
		{1 * time.Second, 40 * MiB, 12 * MiB, 20, false},   // filling
		{2 * time.Second, 120 * MiB, 20 * MiB, 7, false},   // filling
		{3 * time.Second, 200 * MiB, 26 * MiB, 5, false},   // the last of the fill
		{4 * time.Second, 200 * MiB, 26 * MiB, -1, true},   // settled: release
		{5 * time.Second, 200 * MiB, 9 * MiB, -1, false},   // traffic refills the headroom; same live heap
		{50 * time.Second, 201 * MiB, 11 * MiB, -1, false}, // moved by under 1%
		{64 * time.Second, 201 * MiB, 11 * MiB, -1, true},  // a minute later
		{65 * time.Second, 260 * MiB, 30 * MiB, -1, false}, // growing again
		{66 * time.Second, 261 * MiB, 30 * MiB, -1, true},  // settled, and moved since the last release
		{67 * time.Second, 261 * MiB, 30 * MiB, -1, false}, // has not moved since
		{68 * time.Second, 264 * MiB, 30 * MiB, -1, false}, // moving
		{60 * time.Second, 264 * MiB, 30 * MiB, -1, true},  // moved, then held; the clock ran backwards
		{61 * time.Second, 264 * MiB, 30 * MiB, -1, false}, // a minute has not passed since 60 s
		{120 * time.Second, 264 * MiB, 30 * MiB, -1, true}, // it has
	} {
		heap, percent, released = Heap{Live: st.live, Free: st.free}, -1, 0
		tu.step(t0.Add(st.at))
		if percent != st.wantPercent || (released == 1) != st.wantRelease || released > 1 {
			t.Errorf("step %d at %v, %+v: set GOGC %d, released %d times; want GOGC %d, release %v",
				i, st.at, heap, percent, released, st.wantPercent, st.wantRelease)
		}
	}
}

func TestTunerSkipsFailedReads(t *testing.T) {
	calls := 0
	tu := newTuner(func() (Heap, bool) { return Heap{Live: 200 * MiB, Free: 100 * MiB}, false },
		func(int) int { calls++; return 0 }, func() { calls++ })
	tu.step(time.Now())
	tu.step(time.Now())
	if calls != 0 {
		t.Errorf("unreadable metrics: %d calls to SetGCPercent or FreeOSMemory, want 0", calls)
	}
}

func TestHeapReader(t *testing.T) {
	runtime.GC() // the live heap is 0 until a collection ends
	h, ok := heapReader()()
	if !ok || h.Live == 0 {
		t.Errorf("heapReader() = %+v, %v; want a live heap", h, ok)
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

// SoftLimit (router, gateway) sets 90% of the cgroup's limit unless
// GOMEMLIMIT is set, and nothing without a cgroup limit.
func TestSoftLimit(t *testing.T) {
	dir := t.TempDir()
	limit := filepath.Join(dir, "memory.max")
	unlimited := filepath.Join(dir, "memory.max.unlimited")
	for path, v := range map[string]string{limit: "268435456\n", unlimited: "max\n"} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, tc := range []struct {
		gomemlimit, path string
		want             int64
	}{
		{"", limit, 241591910},
		{"200MiB", limit, 0},
		{"", unlimited, 0},
		{"", filepath.Join(dir, "absent"), 0},
	} {
		debug.SetMemoryLimit(prev)
		got := SoftLimit(func(k string) string {
			if k == "GOMEMLIMIT" {
				return tc.gomemlimit
			}
			return ""
		}, tc.path)
		wantRuntime := prev
		if tc.want != 0 {
			wantRuntime = tc.want
		}
		if got != tc.want || debug.SetMemoryLimit(-1) != wantRuntime {
			t.Errorf("SoftLimit(GOMEMLIMIT=%q, %s) = %d (runtime %d), want %d (runtime %d)",
				tc.gomemlimit, filepath.Base(tc.path), got, debug.SetMemoryLimit(-1), tc.want, wantRuntime)
		}
	}
}

// TestTunerReadsAfterRelease: the collection a release forces moves the
// live heap; the tuner compares later readings with the heap after it, so
// that move alone calls for no second release.
func TestTunerReadsAfterRelease(t *testing.T) {
	readings := []Heap{
		{Live: 210 * MiB, Free: 26 * MiB, Cycles: 7}, // step 1: the first reading has not settled
		{Live: 210 * MiB, Free: 26 * MiB, Cycles: 7}, // step 2: never released → release
		{Live: 200 * MiB, Free: 1 * MiB, Cycles: 8},  // read after the release: garbage collected
		{Live: 200 * MiB, Free: 9 * MiB, Cycles: 8},  // step 3: same as after the release
	}
	released := 0
	tu := newTuner(func() (Heap, bool) { h := readings[0]; readings = readings[1:]; return h, true },
		func(int) int { return 0 }, func() { released++ })
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for i, want := range []int{0, 1, 1} {
		tu.step(t0.Add(time.Duration(i) * time.Second))
		if released != want {
			t.Fatalf("after step %d: %d releases, want %d", i+1, released, want)
		}
	}
}
