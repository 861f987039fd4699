//go:build unix

package limiter

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// The benchmarks compare the table with the usual way of limiting many
// keys in Go: a map of golang.org/x/time/rate limiters behind a mutex.
// Both see the same keys, "user-0" … "user-999999", in the same order,
// with the same rate (100 a minute, burst 100) and a clock that moves
// 50ns a check. The fixtures are built once and kept while the
// benchmarks that share them run (-count repeats them back to back).
//
// On a shared machine ns/op counts the time the benchmark waits for a
// core; single-goroutine benchmarks also report cpu-ns/op, the thread's
// own CPU time per op (Linux only), which other load inflates far less.

const (
	benchSeed  = 0x5eed_5eed_5eed_5eed
	benchParts = 1024
	benchKeys  = 1_000_000
	benchStart = int64(1 << 60)
	benchTick  = 50 // ns of the benchmark clock per check
)

var benchRules = map[string]*Rule{
	"token_bucket":   {Name: "tb", Algorithm: TokenBucket, Limit: 100, Period: time.Minute},
	"gcra":           {Name: "gcra", Algorithm: GCRA, Limit: 100, Period: time.Minute},
	"sliding_window": {Name: "sw", Algorithm: SlidingWindow, Limit: 100, Period: time.Minute},
	"sliding_log_10": {Name: "sl", Algorithm: SlidingLog, Limit: 10, Period: time.Minute},
}

// cpuClock measures the CPU time of the benchmark's thread.
type cpuClock struct{ start time.Duration }

func threadCPU() (time.Duration, bool) {
	if runtime.GOOS != "linux" {
		return 0, false
	}
	var ru syscall.Rusage
	if syscall.Getrusage(1, &ru) != nil { // RUSAGE_THREAD
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// startCPU pins the benchmark to its thread and starts the clock. It
// resets the timer, which forgets the metrics reported so far: report
// after stop.
func startCPU(b *testing.B) *cpuClock {
	runtime.LockOSThread()
	b.ResetTimer()
	t, _ := threadCPU()
	return &cpuClock{t}
}

func (c *cpuClock) stop(b *testing.B) {
	b.StopTimer()
	if t, ok := threadCPU(); ok && b.N > 0 {
		b.ReportMetric(float64(t-c.start)/float64(b.N), "cpu-ns/op")
	}
	runtime.UnlockOSThread()
}

func benchKey(i int) string { return "user-" + strconv.Itoa(i) }

// keyHashes are the seeded hashes of the first n benchmark keys.
func keyHashes(n int) []uint64 {
	hs := make([]uint64, n)
	buf := []byte("user-")
	for i := range hs {
		hs[i] = KeyHash(benchSeed, string(strconv.AppendInt(buf[:5], int64(i), 10)))
	}
	return hs
}

var benchKeyStrings = sync.OnceValue(func() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	return keys
})

// cached keeps the last fixture built, so that only one big fixture is
// alive at a time.
var cached struct {
	name string
	v    any
}

func fixture[T any](b *testing.B, name string, build func() T) T {
	if cached.name != name {
		b.StopTimer()
		cached.name, cached.v = "", nil
		runtime.GC()
		cached.v, cached.name = build(), name
		b.StartTimer()
	}
	return cached.v.(T)
}

// tableFixture is a table with n keys of one rule already checked once,
// and where each key lives.
type tableFixture struct {
	t       *Table
	r       *Rule
	salt    uint64
	parts   []uint32
	buckets []uint64
	now     atomic.Int64 // the benchmark clock, shared by runs
	perKey  float64      // heap bytes per key held by the table
}

func newTableFixture(r *Rule, n, checksPerKey int) *tableFixture {
	return newTableFixtureWith(nil, r, n, checksPerKey)
}

// newTableFixtureWith calls setup, if not nil, on the new table before
// filling it.
func newTableFixtureWith(setup func(*Table), r *Rule, n, checksPerKey int) *tableFixture {
	if err := r.Validate(); err != nil {
		panic(err)
	}
	f := &tableFixture{r: r, salt: RuleSalt(benchSeed, r.Name, r.Algorithm),
		parts: make([]uint32, n), buckets: make([]uint64, n)}
	for i, kh := range keyHashes(n) {
		f.parts[i], f.buckets[i] = uint32(kh%benchParts), BucketHash(kh, f.salt)
	}
	now := benchStart
	before := heapAlloc()
	f.t, _ = NewTable(benchParts)
	if setup != nil {
		setup(f.t)
	}
	for range checksPerKey {
		for i := range n {
			now += benchTick
			if _, err := f.t.Check(f.parts[i], f.buckets[i], r, now, 1); err != nil {
				panic(err)
			}
		}
	}
	f.perKey = float64(heapAlloc()-before) / float64(n)
	if l := f.t.Len(); l != n {
		panic(fmt.Sprintf("fixture holds %d states, want %d", l, n))
	}
	f.now.Store(now)
	return f
}

// newVersionedFixture is newTableFixture with r's set registered first.
func newVersionedFixture(r *Rule, n, checksPerKey int) *tableFixture {
	return newTableFixtureWith(func(t *Table) {
		if err := t.SetRules(r.Version, []Rule{*r}, benchStart); err != nil {
			panic(err)
		}
	}, r, n, checksPerKey)
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// rateFixture is the x/time/rate way: a map of limiters behind a mutex.
type rateFixture struct {
	mu     sync.Mutex
	lims   map[string]*rate.Limiter // guarded by mu
	keys   []string
	now    atomic.Int64
	perKey float64
}

func newRateFixture(n int) *rateFixture {
	f := &rateFixture{keys: make([]string, n)}
	if n == benchKeys {
		copy(f.keys, benchKeyStrings())
	}
	now := benchStart
	before := heapAlloc()
	f.lims = make(map[string]*rate.Limiter)
	for i := range n {
		if f.keys[i] == "" {
			f.keys[i] = benchKey(i) // counted: the map holds the string
		}
		now += benchTick
		f.allow(f.keys[i], time.Unix(0, now))
	}
	f.perKey = float64(heapAlloc()-before) / float64(n)
	f.now.Store(now)
	return f
}

// allow is the usual way: lock, look up or create, unlock, ask.
func (f *rateFixture) allow(key string, now time.Time) bool {
	f.mu.Lock()
	lim, ok := f.lims[key]
	if !ok {
		lim = rate.NewLimiter(rate.Every(600*time.Millisecond), 100)
		f.lims[key] = lim
	}
	f.mu.Unlock()
	return lim.AllowN(now, 1)
}

func BenchmarkTableCheck(b *testing.B) {
	for _, name := range []string{"token_bucket", "gcra", "sliding_window", "sliding_log_10"} {
		r := benchRules[name]
		get := func(b *testing.B) *tableFixture {
			return fixture(b, "check/"+name, func() *tableFixture { return newTableFixture(r, benchKeys, 1) })
		}
		b.Run(name, func(b *testing.B) {
			f := get(b)
			now := f.now.Load()
			c := startCPU(b)
			for i := range b.N {
				k := i % benchKeys
				now += benchTick
				f.t.Check(f.parts[k], f.buckets[k], r, now, 1)
			}
			c.stop(b)
			f.now.Store(now)
		})
		if name != "token_bucket" {
			continue
		}
		// The same with the rule in a registered rule set, as a node
		// checks: the states carry its tag.
		b.Run(name+"/versioned", func(b *testing.B) {
			vr := *r
			vr.Version = 7
			f := fixture(b, "check/"+name+"/versioned", func() *tableFixture {
				return newVersionedFixture(&vr, benchKeys, 1)
			})
			now := f.now.Load()
			c := startCPU(b)
			for i := range b.N {
				k := i % benchKeys
				now += benchTick
				f.t.Check(f.parts[k], f.buckets[k], &vr, now, 1)
			}
			c.stop(b)
			f.now.Store(now)
		})
		// Every key once more after the rule changed: each check carries
		// its key's state over to the new rule first.
		b.Run(name+"/converting", func(b *testing.B) {
			vr := *r
			vr.Version = 7
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				f := newVersionedFixture(&vr, benchKeys, 1)
				nr := vr
				nr.Version, nr.Limit = 8, vr.Limit/2
				now := f.now.Load()
				if err := f.t.SetRules(8, []Rule{nr}, now); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for k := 0; k < benchKeys && done < b.N; k++ {
					now += benchTick
					f.t.Check(f.parts[k], f.buckets[k], &nr, now, 1)
					done++
				}
			}
		})
		// The same, hashing the client key on the way, as a server must.
		b.Run(name+"/with_keyhash", func(b *testing.B) {
			f, keys := get(b), benchKeyStrings()
			now := f.now.Load()
			c := startCPU(b)
			for i := range b.N {
				now += benchTick
				kh := KeyHash(benchSeed, keys[i%benchKeys])
				f.t.Check(uint32(kh%benchParts), BucketHash(kh, f.salt), r, now, 1)
			}
			c.stop(b)
			f.now.Store(now)
		})
		// In parallel, each goroutine starts at a random key and keeps its
		// own clock (a shared atomic clock would cost more than a check).
		b.Run(name+"/parallel", func(b *testing.B) {
			f := get(b)
			b.RunParallel(func(pb *testing.PB) {
				k, now := rand.IntN(benchKeys), f.now.Load()
				for pb.Next() {
					if k++; k == benchKeys {
						k = 0
					}
					now += benchTick
					f.t.Check(f.parts[k], f.buckets[k], r, now, 1)
				}
			})
			f.now.Add(int64(b.N) * benchTick)
		})
		b.Run(name+"/parallel_with_keyhash", func(b *testing.B) {
			f, keys := get(b), benchKeyStrings()
			b.RunParallel(func(pb *testing.PB) {
				k, now := rand.IntN(benchKeys), f.now.Load()
				for pb.Next() {
					if k++; k == benchKeys {
						k = 0
					}
					now += benchTick
					kh := KeyHash(benchSeed, keys[k])
					f.t.Check(uint32(kh%benchParts), BucketHash(kh, f.salt), r, now, 1)
				}
			})
			f.now.Add(int64(b.N) * benchTick)
		})
	}
}

func BenchmarkXTimeRateMap(b *testing.B) {
	get := func(b *testing.B) *rateFixture {
		return fixture(b, "check/rate", func() *rateFixture { return newRateFixture(benchKeys) })
	}
	b.Run("single", func(b *testing.B) {
		f := get(b)
		now := f.now.Load()
		c := startCPU(b)
		for i := range b.N {
			now += benchTick
			f.allow(f.keys[i%benchKeys], time.Unix(0, now))
		}
		c.stop(b)
		f.now.Store(now)
	})
	b.Run("parallel", func(b *testing.B) {
		f := get(b)
		b.RunParallel(func(pb *testing.PB) {
			k, now := rand.IntN(benchKeys), f.now.Load()
			for pb.Next() {
				if k++; k == benchKeys {
					k = 0
				}
				now += benchTick
				f.allow(f.keys[k], time.Unix(0, now))
			}
		})
		f.now.Add(int64(b.N) * benchTick)
	})
}

// BenchmarkMemoryPerKey reports the heap bytes each active key costs
// (HeapAlloc after GC, before and after filling), and the time of a check
// on a table of that size. sliding_log keys hold 5 entries of 10.
func BenchmarkMemoryPerKey(b *testing.B) {
	for _, name := range []string{"token_bucket", "token_bucket_versioned", "gcra", "sliding_log_10", "x_time_rate"} {
		for _, n := range []int{1_000_000, 10_000_000} {
			b.Run(fmt.Sprintf("%s/keys=%dM", name, n/1_000_000), func(b *testing.B) {
				id := fmt.Sprintf("mem/%s/%d", name, n)
				if name == "x_time_rate" {
					f := fixture(b, id, func() *rateFixture { return newRateFixture(n) })
					now := f.now.Load()
					c := startCPU(b)
					for i := range b.N {
						now += benchTick
						f.allow(f.keys[i%n], time.Unix(0, now))
					}
					c.stop(b)
					b.ReportMetric(f.perKey, "B/key")
					f.now.Store(now)
					return
				}
				r, checks := benchRules[name], 1
				if name == "sliding_log_10" {
					checks = 5
				}
				build := func() *tableFixture { return newTableFixture(r, n, checks) }
				if name == "token_bucket_versioned" {
					vr := *benchRules["token_bucket"]
					vr.Version = 7
					r = &vr
					build = func() *tableFixture { return newVersionedFixture(r, n, checks) }
				}
				f := fixture(b, id, build)
				now := f.now.Load()
				c := startCPU(b)
				for i := range b.N {
					k := i % n
					now += benchTick
					f.t.Check(f.parts[k], f.buckets[k], r, now, 1)
				}
				c.stop(b)
				b.ReportMetric(f.perKey, "B/key")
				f.now.Store(now)
			})
		}
	}
}

// BenchmarkSlotsLookup measures the map alone, full (load 0.85, just
// before it grows) and just grown (0.68), on hits and misses, and reports
// the mean probe length: slots looked at per lookup.
func BenchmarkSlotsLookup(b *testing.B) {
	const c = 1 << 20
	for _, load := range []float64{0.68, 0.85} {
		var s slots[TAT]
		s.resize(c)
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]uint64, 0, c)
		for !overMax(s.n+1, c) && float64(s.n) < load*c {
			h := rng.Uint64() | 1
			if s.get(h) != nil {
				continue
			}
			s.insert(slotKey(h), legacyTag, 1, 0, testSets)
			keys = append(keys, h)
		}
		if len(s.ents) != c {
			b.Fatalf("map grew to %d", len(s.ents))
		}
		misses := make([]uint64, len(keys))
		for i := range misses {
			misses[i] = rng.Uint64() | 1
		}
		hit, miss := s.probeLengths()
		b.Run(fmt.Sprintf("load=%.2f/hit", float64(s.n)/c), func(b *testing.B) {
			c := startCPU(b)
			for i := range b.N {
				if s.get(keys[i%len(keys)]) == nil {
					b.Fatal("lost a key")
				}
			}
			c.stop(b)
			b.ReportMetric(hit, "probes/op")
		})
		b.Run(fmt.Sprintf("load=%.2f/miss", float64(s.n)/c), func(b *testing.B) {
			c := startCPU(b)
			for i := range b.N {
				s.get(misses[i%len(misses)])
			}
			c.stop(b)
			b.ReportMetric(miss, "probes/op")
		})
	}
}

// probeLengths returns the mean number of slots a successful and an
// unsuccessful lookup look at, from the layout of the map.
func (s *slots[V]) probeLengths() (hit, miss float64) {
	c := len(s.ents)
	var hits, misses int
	for i, e := range s.ents {
		if e.key != 0 {
			hits += (i-s.home(e.key)+c)%c + 1
		}
	}
	// A miss whose home is slot i looks at every slot up to the next
	// empty one, that one included.
	run := 0
	for i := 2*c - 1; i >= 0; i-- {
		if s.ents[i%c].key == 0 {
			run = 0
		} else {
			run++
		}
		if i < c {
			misses += run + 1
		}
	}
	return float64(hits) / float64(s.n), float64(misses) / float64(c)
}

// BenchmarkTableCheckGroup decides groups of two token buckets of one
// key (two rules, one partition, as Envoy RLS and the gateway send
// them) and of two keys on different partitions; per group, so compare
// with two Checks.
func BenchmarkTableCheckGroup(b *testing.B) {
	r := benchRules["token_bucket"]
	r2 := *r
	r2.Name = "tb2"
	f := fixture(b, "check/token_bucket", func() *tableFixture { return newTableFixture(r, benchKeys, 1) })
	for _, tt := range []struct {
		name  string
		other func(k int) (uint32, uint64)
	}{
		{"same_partition", func(k int) (uint32, uint64) { return f.parts[k], f.buckets[k] ^ 0x5a5a5a5a5a5a5a00 }},
		{"two_partitions", func(k int) (uint32, uint64) { k2 := (k + 1) % benchKeys; return f.parts[k2], f.buckets[k2] }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			now := f.now.Load()
			items, out := make([]Item, 2), make([]Decision, 2)
			c := startCPU(b)
			for i := range b.N {
				k := i % benchKeys
				now += benchTick
				p2, b2 := tt.other(k)
				items[0] = Item{f.parts[k], f.buckets[k], r, 1}
				items[1] = Item{p2, b2, &r2, 1}
				if _, err := f.t.CheckGroup(items, now, out); err != nil {
					b.Fatal(err)
				}
			}
			c.stop(b)
			f.now.Store(now)
		})
	}
}
