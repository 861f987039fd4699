// Package gctune sets a member's garbage collector for a heap that is
// mostly bucket tables: large, long-lived, pointer-free arrays that cost
// the collector almost nothing to mark, next to a small stream of
// short-lived request garbage.
//
// Go's default (GOGC=100) lets the heap grow to twice the live heap
// before a collection, so a member holding 200 MB of buckets may keep
// 400 MB resident: RSS per active key doubles. Collections here are cheap
// (the tables are noscan), so the headroom can be a fixed budget instead
// of a multiple of the live heap. Tune keeps it at Headroom(live): 100%
// of a small heap (the default), shrinking to 5% (never under 8 MiB) as
// the tables grow.
//
// The runtime's background scavenger returns free heap pages to the OS
// only down to about 10% over the heap goal, and slowly (about 1% of a
// CPU). Growing tables leave their old arrays behind, and the arrays freed
// by a burst of growth are seldom reused by the next, larger ones: after
// a fill of 10M keys (a 205 MiB live heap) 13–26 MiB of free pages stayed
// resident, 1.3–2.7 bytes per key. So Tune also returns the free heap to
// the OS (debug.FreeOSMemory) once the tables have settled after growing
// or shrinking, if more than max(8 MiB, 2% of the live heap) is free (see
// Release). A release forces a collection, cheap here (the tables are not
// scanned), then some milliseconds of madvise; the heap faults back in
// what it uses again. Under steady traffic the pages of the GC headroom
// come back within one collection, so those are released at most once a
// minute; sooner only when the live heap moved by more than
// max(1 MiB, 1%), or a collection left free pages beyond what the heap
// can use before its goal.
//
// It is GOMEMLIMIT-aware: an operator's GOGC or GOMEMLIMIT is never
// overridden, and a member in a cgroup with a memory limit (and no
// GOMEMLIMIT) gets a soft limit at 90% of it, so the collector works
// harder before the kernel kills the process. An operator's GOGC turns
// off both the percent and the releases (which force collections).
// SoftLimit is that soft limit alone, for processes that hold no tables
// (ringlimit router and gateway).
//
// Percent and Release are pure functions; Tune is the only part with
// side effects and one goroutine, which ends with its context.
package gctune

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

const (
	minHeadroom  = 8 << 20 // bytes the heap may always grow by
	headroomFrac = 0.05    // of the live heap, when that is more
	minPercent   = 5
	maxPercent   = 100 // Go's default: small heaps behave as usual
	cgroupShare  = 0.9 // of a cgroup's memory limit, as the soft limit

	minFree      = 8 << 20     // free bytes always kept
	freeFrac     = 0.02        // of the live heap, when that is more
	minMove      = 1 << 20     // a live heap that changed by more than this…
	moveFrac     = 0.01        // …and this share of it has moved
	releaseEvery = time.Minute // the longest between releases while the live heap holds
)

// Percent is the GOGC for a live heap of live bytes.
func Percent(live uint64) int {
	if live == 0 {
		return maxPercent
	}
	headroom := max(float64(minHeadroom), headroomFrac*float64(live))
	p := math.Ceil(100*headroom/float64(live) - 1e-9)
	return int(min(max(p, minPercent), maxPercent))
}

// Heap is a reading of the heap, from runtime/metrics.
type Heap struct {
	Live   uint64 // bytes of the heap that survived the last collection
	Free   uint64 // bytes of wholly free pages not yet returned to the OS
	InUse  uint64 // bytes of the pages in use (objects and the gaps between them)
	Goal   uint64 // the heap size at which the next collection ends
	Cycles uint64 // collections completed
}

// Release reports whether to return the free heap to the OS, given the
// reading now (cur), the one before it (prev), the one just after the
// last release (last; the zero Heap if none), and the time since that
// release (0 for a clock that ran backwards). It releases when
//
//   - more than max(8 MiB, 2% of the live heap) is free,
//   - the live heap has settled: it moved by at most max(1 MiB, 1%) since
//     prev, so a fill or a sweep in progress is not chased, and
//   - the heap freed something the GC headroom will not take back: the
//     live heap moved since last (tables grew or shrank, so their old
//     arrays are free), or a collection since last left more free pages
//     than the heap can use before its goal (Goal − InUse) by that same
//     max(8 MiB, 2%); or else a minute has passed.
//
// Under steady traffic the live heap holds, and the free pages are mostly
// the GC headroom, which the heap takes back within a collection: those
// are released at most once a minute. A table that grows with its live
// heap leaves both signals; either suffices.
func Release(cur, prev, last Heap, since time.Duration) bool {
	keep := max(minFree, freeFrac*float64(cur.Live))
	switch {
	case float64(cur.Free) <= keep:
		return false
	case moved(prev.Live, cur.Live):
		return false
	case since >= releaseEvery || moved(last.Live, cur.Live):
		return true
	}
	usable := float64(cur.Goal) - float64(cur.InUse)
	return cur.Cycles != last.Cycles && float64(cur.Free)-max(0, usable) > keep
}

// moved reports whether the live heap moved from a to b bytes: by more
// than max(1 MiB, 1% of b).
func moved(a, b uint64) bool {
	d := b - a
	if a > b {
		d = a - b
	}
	return float64(d) > max(minMove, moveFrac*float64(b))
}

// Settings is what Tune did, for the log.
type Settings struct {
	TuneGOGC    bool  // GOGC follows the live heap, and free heap is released
	MemoryLimit int64 // the soft limit Tune set, 0 = none
}

// Tune applies the defaults unless getenv says the operator chose:
// GOGC set → the collector's percent is left alone and nothing is
// released; GOMEMLIMIT set → no soft limit from the cgroup. cgroupMax is
// the path of the cgroup's memory.max ("" = /sys/fs/cgroup/memory.max).
// It returns at once; every interval until ctx ends, it adjusts the
// percent and releases the free heap when Release says so.
func Tune(ctx context.Context, getenv func(string) string, cgroupMax string, interval time.Duration) Settings {
	s := Settings{MemoryLimit: SoftLimit(getenv, cgroupMax)}
	if getenv("GOGC") != "" {
		return s
	}
	s.TuneGOGC = true
	t := newTuner(heapReader(), debug.SetGCPercent, debug.FreeOSMemory)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				t.step(now)
			}
		}
	}()
	return s
}

// SoftLimit is the part of Tune that suits any process, not only a
// member: unless getenv says GOMEMLIMIT is set, it sets the runtime's
// soft memory limit to 90% of the cgroup's memory limit read from
// cgroupMax ("" = /sys/fs/cgroup/memory.max), so that the collector
// works harder before the kernel kills the process. It returns the limit
// it set, 0 when none (GOMEMLIMIT set, no cgroup limit).
func SoftLimit(getenv func(string) string, cgroupMax string) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	if cgroupMax == "" {
		cgroupMax = "/sys/fs/cgroup/memory.max"
	}
	lim, ok := readLimit(cgroupMax)
	if !ok {
		return 0
	}
	soft := int64(cgroupShare * float64(lim))
	debug.SetMemoryLimit(soft)
	return soft
}

// tuner is Tune's state between steps, with its effects injected.
// It is not safe for concurrent use: one goroutine steps it.
type tuner struct {
	read     func() (Heap, bool)
	setGC    func(percent int) int
	release  func()
	percent  int       // the GOGC last set
	prev     Heap      // the last reading
	last     Heap      // the reading at the last release
	released time.Time // when the last release was made; zero = never
}

func newTuner(read func() (Heap, bool), setGC func(int) int, release func()) *tuner {
	return &tuner{read: read, setGC: setGC, release: release, percent: maxPercent}
}

// step reads the heap at now, sets the percent for it if that changed,
// and releases the free heap if Release says so.
func (t *tuner) step(now time.Time) {
	h, ok := t.read()
	if !ok {
		return
	}
	if p := Percent(h.Live); p != t.percent {
		t.setGC(p)
		t.percent = p
	}
	since := time.Duration(math.MaxInt64) // never released
	if !t.released.IsZero() {
		since = max(0, now.Sub(t.released))
	}
	if Release(h, t.prev, t.last, since) {
		t.release()
		if after, ok := t.read(); ok {
			h = after // the release collected: the live heap and cycles moved
		}
		t.last, t.released = h, now
	}
	t.prev = h
}

// heapReader returns a reader of the live heap and its free pages, from
// runtime/metrics. The reader is not safe for concurrent use.
func heapReader() func() (Heap, bool) {
	s := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/heap/goal:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	return func() (Heap, bool) {
		metrics.Read(s)
		for _, v := range s {
			if v.Value.Kind() != metrics.KindUint64 {
				return Heap{}, false
			}
		}
		u := func(i int) uint64 { return s[i].Value.Uint64() }
		return Heap{Live: u(0), Free: u(1), InUse: u(2) + u(3), Goal: u(4), Cycles: u(5)}, true
	}
}

// readLimit reads a cgroup v2 memory.max: a byte count, or "max" for none.
func readLimit(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v := strings.TrimSpace(string(b))
	if v == "max" || v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil && n > 0
}
