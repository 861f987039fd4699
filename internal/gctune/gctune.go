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
// It is GOMEMLIMIT-aware: an operator's GOGC or GOMEMLIMIT is never
// overridden, and a member in a cgroup with a memory limit (and no
// GOMEMLIMIT) gets a soft limit at 90% of it, so the collector works
// harder before the kernel kills the process.
//
// Percent is a pure function; Tune is the only part with side effects
// and one goroutine, which ends with its context.
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

// Settings is what Tune did, for the log.
type Settings struct {
	TuneGOGC    bool  // GOGC follows the live heap
	MemoryLimit int64 // the soft limit Tune set, 0 = none
}

// Tune applies the defaults unless getenv says the operator chose:
// GOGC set → the collector's percent is left alone; GOMEMLIMIT set → no
// soft limit from the cgroup. cgroupMax is the path of the cgroup's
// memory.max ("" = /sys/fs/cgroup/memory.max). It returns at once; the
// percent is adjusted every interval until ctx ends.
func Tune(ctx context.Context, getenv func(string) string, cgroupMax string, interval time.Duration) Settings {
	var s Settings
	if getenv("GOMEMLIMIT") == "" {
		if cgroupMax == "" {
			cgroupMax = "/sys/fs/cgroup/memory.max"
		}
		if lim, ok := readLimit(cgroupMax); ok {
			s.MemoryLimit = int64(cgroupShare * float64(lim))
			debug.SetMemoryLimit(s.MemoryLimit)
		}
	}
	if getenv("GOGC") != "" {
		return s
	}
	s.TuneGOGC = true
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := maxPercent
	set := func() {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return
		}
		if p := Percent(sample[0].Value.Uint64()); p != last {
			debug.SetGCPercent(p)
			last = p
		}
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				set()
			}
		}
	}()
	return s
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
