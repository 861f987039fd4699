package limiter

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// sweepAll sweeps every partition of tb at now: one round (sweepPass).
func sweepAll(tb *Table, now int64) {
	for p := range tb.Partitions() {
		tb.Sweep(uint32(p), now)
	}
}

// orphanTag returns a partition holding a state whose tag names no set
// tb holds, and that tag, or -1, -1.
func orphanTag(tb *Table) (part, tag int) {
	g := tb.sets.Load()
	for i := range tb.parts {
		p := &tb.parts[i]
		p.mu.Lock()
		var used [maxTags]bool
		p.tags(&used)
		p.mu.Unlock()
		for t, u := range used {
			if u && g.byTag[t] == nil {
				return i, t
			}
		}
	}
	return -1, -1
}

// Rules written with no key live are let go by the sweeps once no check
// can be decided under them any more (lateWrites after the next set),
// not kept until the 254 tags run out. Was: kept, ~0.8 MB a set of
// 5,000 rules; an audit writing 100 such sets with no key live saw a
// member's heap at 80 MB, freed only by a restart.
func TestSweepsReleaseSetsNoStateCarries(t *testing.T) {
	const parts, sets, rules = 4, 20, 50
	sec := int64(time.Second)
	tb, err := NewTable(parts)
	if err != nil {
		t.Fatal(err)
	}
	for v := uint64(1); v <= sets; v++ {
		rs := make([]Rule, rules)
		for i := range rs {
			rs[i] = Rule{Name: fmt.Sprintf("r%d", i), Algorithm: TokenBucket, Limit: int64(v) + 1, Period: time.Hour}
		}
		if err := tb.SetRules(v, rs, int64(v)*sec); err != nil {
			t.Fatal(err)
		}
	}
	versions := func(vs ...uint64) []uint64 { return append([]uint64{0}, vs...) }
	all := versions()
	for v := uint64(1); v <= sets; v++ {
		all = append(all, v)
	}
	next := 0 // the partition swept next
	for _, step := range []struct {
		at    int64 // when the sweeps run
		parts int   // how many partitions are swept
		want  []uint64
	}{
		{5 * sec, parts, all},                          // none settled: set 1 superseded 3s before
		{29 * sec, parts - 1, all},                     // a round not over releases nothing
		{29 * sec, 1, versions(19, 20)},                // the round's end: 1–18 settled (set 19 superseded 9s before)
		{30 * sec, parts - 1, versions(19, 20)},        // set 19 settled: the next round
		{30 * sec, 1, versions(20)},                    // lets it go
		{time.Hour.Nanoseconds(), parts, versions(20)}, // the newest set stays
	} {
		for range step.parts {
			// As a member's sweep loop: the partition after the last one
			// swept, so a round goes on where it was.
			tb.Sweep(uint32(next%parts), step.at)
			next++
		}
		if got := tb.RuleVersions(); !slices.Equal(got, step.want) {
			t.Fatalf("after %d sweeps at %v: versions %v, want %v", step.parts, time.Duration(step.at), got, step.want)
		}
	}
	checkInvariants(t, tb)
}

// A superseded set whose states are live is kept, and its states carried
// over by the next check; once none carries it, the next round lets it go.
func TestSweepsKeepSetsWithLiveStates(t *testing.T) {
	sec := int64(time.Second)
	tb, _ := NewTable(2)
	r1 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Hour, Version: 1}
	r2 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 20, Period: time.Hour, Version: 2}
	if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	const key = 0x42 << 8
	if d, err := tb.Check(1, key, &r1, 0, 10); err != nil || !d.Allowed {
		t.Fatalf("spending the key whole under set 1: %+v %v", d, err)
	}
	if err := tb.SetRules(2, []Rule{r2}, sec); err != nil {
		t.Fatal(err)
	}
	sweepAll(tb, 12*sec)
	sweepAll(tb, 13*sec)
	if got, want := tb.RuleVersions(), []uint64{0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("versions %v, want %v: set 1 holds a live state", got, want)
	}
	if d, err := tb.Check(1, key, &r2, 14*sec, 1); err != nil || d.Allowed {
		t.Fatalf("check under set 2 of the key spent under set 1: %+v %v, want denied", d, err)
	}
	sweepAll(tb, 15*sec)
	if got, want := tb.RuleVersions(), []uint64{0, 2}; !slices.Equal(got, want) {
		t.Fatalf("versions %v, want %v: the check carried set 1's only state to set 2", got, want)
	}
}

// A state imported, under a set the table holds, into a partition the
// round has swept already keeps that set: it is not released under it.
func TestSweepsKeepSetsImportedDuringTheRound(t *testing.T) {
	sec := int64(time.Second)
	r1 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Hour, Version: 1}
	r2 := Rule{Name: "r", Algorithm: TokenBucket, Limit: 20, Period: time.Hour, Version: 2}
	ex, _ := NewTable(2)
	if err := ex.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	const key = 0x42 << 8
	if d, err := ex.Check(0, key, &r1, 0, 10); err != nil || !d.Allowed {
		t.Fatalf("spending the key whole under set 1: %+v %v", d, err)
	}
	stream := ex.Export(nil, 0, 12*sec)

	tb, _ := NewTable(2)
	if err := tb.SetRules(1, []Rule{r1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := tb.SetRules(2, []Rule{r2}, sec); err != nil {
		t.Fatal(err)
	}
	tb.Sweep(0, 12*sec) // the round starts, set 1 its candidate
	if _, err := tb.Import(0, stream, 12*sec); err != nil {
		t.Fatal(err)
	}
	tb.Sweep(1, 12*sec) // and ends
	if p, tag := orphanTag(tb); p >= 0 {
		t.Fatalf("partition %d holds a state of tag %d, which names no set (versions %v)", p, tag, tb.RuleVersions())
	}
	if got, want := tb.RuleVersions(), []uint64{0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
	if d, err := tb.Check(0, key, &r2, 13*sec, 1); err != nil || d.Allowed {
		t.Fatalf("check under set 2 of the imported key: %+v %v, want denied", d, err)
	}
}

// Rules written every 3 s while checks (some behind by a set or two, and
// by up to 12 s of clock) and sweeps run on every partition: after each
// write every stored state's tag names a set the table holds, and the
// sets held stay few. Run with -race.
func TestSweepsReleaseUnderChecks(t *testing.T) {
	const writes = 80
	tb := rulesWrittenUnderChecks(t, 16, writes, true, func(v uint64) Rule {
		algs := []Algorithm{TokenBucket, FixedWindow, SlidingLog}
		return Rule{Name: "r", Algorithm: algs[(v/16)%3], Limit: 5 + int64(v%3), Period: time.Second, Version: v}
	})
	// Second-long rules: the sets of the last few writes at most.
	if got := len(tb.RuleVersions()); got > 8 {
		t.Errorf("%d versions held after %d writes: %v", got, writes, tb.RuleVersions())
	}
}
