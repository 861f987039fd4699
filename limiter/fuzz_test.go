package limiter

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fuzzPart is the partition every fuzzed stream is imported into.
const fuzzPart = 1

// fuzzSeeds exports real partitions: every kind of state, the zero hash,
// long logs, an empty partition.
func fuzzSeeds(t testing.TB) [][]byte {
	const now = int64(1 << 60)
	tb := mustTable(t, 2)
	rules := []*Rule{
		{Name: "tb", Algorithm: TokenBucket, Limit: 10, Burst: 20, Period: time.Second},
		{Name: "gc", Algorithm: GCRA, Limit: 3, Period: time.Hour},
		{Name: "lb", Algorithm: LeakyBucket, Limit: 100, Period: time.Minute},
		{Name: "fw", Algorithm: FixedWindow, Limit: 1000, Period: time.Minute},
		{Name: "sw", Algorithm: SlidingWindow, Limit: 50, Period: 10 * time.Second},
		{Name: "sl", Algorithm: SlidingLog, Limit: 10, Period: time.Minute},
	}
	seeds := [][]byte{tb.Export(nil, fuzzPart, now)}
	for i, r := range rules {
		for h := range uint64(4) {
			for k := range int64(i + 3) {
				tb.Check(fuzzPart, h*0x9e3779b97f4a7c15, r, now+k*int64(time.Millisecond), 1+k%3)
			}
		}
		seeds = append(seeds, tb.Export(nil, fuzzPart, now+int64(10*time.Millisecond)))
	}
	// A sliding window with a previous and a current count.
	tb.Check(fuzzPart, 99, rules[4], now+int64(11*time.Second), 1)
	seeds = append(seeds, tb.Export(nil, fuzzPart, now+int64(11*time.Second)))

	// States of two rule sets, and of none.
	at := now + int64(12*time.Second)
	v1, v2 := versioned(rules, 7, 1), versioned(rules, 9, 2)
	for _, set := range [][]Rule{v1, v2} {
		if err := tb.SetRules(set[0].Version, set, at); err != nil {
			t.Fatal(err)
		}
		for i := range set {
			for h := range uint64(2) {
				tb.Check(fuzzPart, 1000+h+uint64(10*set[0].Version), &set[i], at, 1)
			}
		}
		at += int64(time.Millisecond)
	}
	seeds = append(seeds, tb.Export(nil, fuzzPart, at))
	return seeds
}

// versioned returns rules as the rule set of version v, every limit times
// k.
func versioned(rules []*Rule, v uint64, k int64) []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		out[i] = *r
		out[i].Version = v
		out[i].Limit *= k
		if out[i].Burst != 0 {
			out[i].Burst *= k
		}
	}
	return out
}

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzImport/seed-export-* from fuzzSeeds")

// The committed seed corpus is what fuzzSeeds exports today (go test
// -run TestFuzzSeedCorpus -update-seeds rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzImport")
	seeds := fuzzSeeds(t)
	if *updateSeeds {
		old, _ := filepath.Glob(filepath.Join(dir, "seed-export-*"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, s := range seeds {
		name := filepath.Join(dir, fmt.Sprintf("seed-export-%02d", i))
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nint64(%d)\n", s, int64(1<<60))
		if *updateSeeds {
			if err := os.WriteFile(name, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(name)
		if err != nil || string(got) != want {
			t.Errorf("%s is not fuzzSeeds()[%d] (err %v); run go test -run TestFuzzSeedCorpus -update-seeds ./limiter", name, i, err)
		}
	}
}

func FuzzImport(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, int64(1<<60))
	}
	f.Add([]byte("RLP1\x02\x01\x00\x00"), int64(-1))
	f.Add([]byte("RLP1\x03\x01\x01\x05\x01\x01\x01\x00\x00\x00\x00\x00\x00\x01\x01\x01"), int64(1<<40)) // a set by reference
	f.Fuzz(func(t *testing.T, src []byte, now int64) {
		tb := mustTable(t, 2)
		n, err := tb.Import(fuzzPart, src, now)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrPartition) && !errors.Is(err, ErrUnknownSet) {
				t.Fatalf("error %v is neither ErrCorrupt, ErrPartition nor ErrUnknownSet", err)
			}
			if n != 0 || tb.Len() != 0 {
				t.Fatalf("failed import returned %d and stored %d states", n, tb.Len())
			}
			return
		}
		// The encoding is canonical: what was accepted exports back to
		// the same bytes at the same now.
		if tb.Len() != n {
			t.Fatalf("imported %d records, table holds %d", n, tb.Len())
		}
		if out := tb.Export(nil, fuzzPart, now); !bytes.Equal(out, src) {
			t.Fatalf("re-export differs:\n in % x\nout % x", src, out)
		}
		// Importing it again merges every state with itself, which
		// changes nothing.
		if n2, err := tb.Import(fuzzPart, src, now); err != nil || n2 != n || tb.Len() != n {
			t.Fatalf("second import: %d, %v; table holds %d, want %d", n2, err, tb.Len(), n)
		}
		if out := tb.Export(nil, fuzzPart, now); !bytes.Equal(out, src) {
			t.Fatalf("merged with itself, the partition exports differently:\n in % x\nout % x", src, out)
		}
		// Restamped a second later, it is what the table exports then;
		// a table that holds none of its sets restamps it too, to a
		// stream that imports.
		later := now
		if now < math.MaxInt64-int64(time.Second) {
			later = now + int64(time.Second)
		}
		re, err := tb.Restamp(nil, src, now, later)
		if err != nil {
			t.Fatalf("Restamp of an imported stream: %v", err)
		}
		if out := tb.Export(nil, fuzzPart, later); !bytes.Equal(re, out) {
			t.Fatalf("restamped by 1s:\n got % x\nwant % x", re, out)
		}
		if re, err = mustTable(t, 2).Restamp(nil, src, now, later); err != nil {
			t.Fatalf("Restamp by a table without the sets: %v", err)
		}
		if _, err := mustTable(t, 2).Import(fuzzPart, re, later); err != nil {
			t.Fatalf("Import of a restamped stream: %v\n% x", err, re)
		}
		// Whatever was imported, the steps run on it without panicking,
		// under rules of every algorithm and at the extremes of cost.
		p := &tb.parts[fuzzPart]
		var hashes []uint64
		// A slot key is a bucket hash of its own slot key.
		p.tats.all(func(h uint64, _ uint8, _ TAT) { hashes = append(hashes, h) })
		p.wins.all(func(h uint64, _ uint8, _ Window) { hashes = append(hashes, h) })
		for h := range p.logs {
			hashes = append(hashes, h)
		}
		rules := fuzzRules
		for _, v := range tb.RuleVersions()[1:] {
			rules = append(rules, fuzzRulesAt(v)...)
		}
		for _, r := range rules {
			for _, h := range hashes[:min(len(hashes), 64)] {
				for _, cost := range []int64{0, 1, r.Capacity()} {
					for _, at := range []int64{now, later} {
						if _, err := tb.Check(fuzzPart, h, r, at, cost); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		checkInvariants(t, tb)
	})
}

var fuzzRules = []*Rule{
	{Name: "tb", Algorithm: TokenBucket, Limit: 10, Burst: 20, Period: time.Second},
	{Name: "lb", Algorithm: LeakyBucket, Limit: MaxLimit, Period: MaxPeriod},
	{Name: "fw", Algorithm: FixedWindow, Limit: 7, Period: time.Minute},
	{Name: "sw", Algorithm: SlidingWindow, Limit: MaxLimit, Period: time.Millisecond},
	{Name: "sw2", Algorithm: SlidingWindow, Limit: 3, Period: MaxPeriod},
	{Name: "sl", Algorithm: SlidingLog, Limit: 5, Period: time.Second},
	{Name: "sl2", Algorithm: SlidingLog, Limit: MaxLogLimit, Period: MaxPeriod},
}

// fuzzRulesAt returns fuzzRules under version v.
func fuzzRulesAt(v uint64) []*Rule {
	out := make([]*Rule, len(fuzzRules))
	for i, r := range fuzzRules {
		c := *r
		c.Version = v
		out[i] = &c
	}
	return out
}

// The seeds are valid streams, and the rules are valid rules.
func TestFuzzSeeds(t *testing.T) {
	for i, s := range fuzzSeeds(t) {
		if _, err := mustTable(t, 2).Import(fuzzPart, s, 0); err != nil {
			t.Errorf("seed %d: %v", i, err)
		}
	}
	for _, r := range fuzzRules {
		if err := r.Validate(); err != nil {
			t.Error(err)
		}
	}
}
