package limiter

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// An export restamped by d is the export taken d later, byte for byte,
// for states of every algorithm, of the newest rule set, of older ones
// (some live only for what they carry over) and of none.
func TestRestampIsALaterExport(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		keys := drawKeys(t, 1, allAlgorithms, drawSize(t, "max keys", 10, 60, 300))
		tb := mustTable(t, 1)
		now := rapid.Int64Range(0, 1<<60).Draw(t, "start")
		run := func(ops int, version uint64, scale int64) {
			for range ops {
				now += drawGap(t)
				k := keys.draw(t)
				r := *k.r
				r.Version, r.Limit = version, r.Limit*scale
				cost := rapid.Int64Range(0, r.Capacity()).Draw(t, "cost")
				if _, err := tb.Check(k.part, k.h, &r, now, cost); err != nil {
					t.Fatal(err)
				}
			}
		}
		run(drawSize(t, "unversioned ops", 0, 30, 300), 0, 1)
		for v := range uint64(rapid.IntRange(0, 3).Draw(t, "rule versions")) {
			scale := rapid.Int64Range(1, 3).Draw(t, "scale")
			var set []Rule
			for _, r := range keys.rules() {
				c := *r
				c.Limit *= scale
				set = append(set, c)
			}
			if err := tb.SetRules(v+1, set, now); err != nil {
				t.Fatal(err)
			}
			run(drawSize(t, "versioned ops", 0, 30, 300), v+1, scale)
		}
		from := now
		src := tb.Export(nil, 0, from)
		d := rapid.SampledFrom([]int64{0, 1, int64(time.Millisecond), int64(250 * time.Millisecond),
			int64(time.Second), int64(time.Minute), int64(time.Hour), int64(3 * time.Hour)}).Draw(t, "d")
		d += rapid.Int64Range(0, int64(time.Millisecond)).Draw(t, "jitter")
		got, err := tb.Restamp(nil, src, from, from+d)
		if err != nil {
			t.Fatalf("Restamp: %v", err)
		}
		if want := tb.Export(nil, 0, from+d); !bytes.Equal(got, want) {
			t.Fatalf("restamped by %v:\n got % x\nwant % x\n(from % x)", time.Duration(d), got, want, src)
		}
	})
}

// rules returns the distinct rules of the keys.
func (p *keyPicker) rules() []*Rule {
	seen := map[*Rule]bool{}
	var out []*Rule
	for _, k := range p.keys {
		if !seen[k.r] {
			seen[k.r] = true
			out = append(out, k.r)
		}
	}
	return out
}

// A hand-off restamped at its send decides on the importer, whatever its
// clock, as the exporter would have at that send; imported unrestamped,
// the state is as young as it was at the export, and admits less.
func TestRestampedImportDecidesAsTheExporter(t *testing.T) {
	const s, ms = int64(time.Second), int64(time.Millisecond)
	for _, tc := range []struct {
		rule Rule
		// Checks of cost 1 on the exporter at these instants, all
		// admitted; the export at exportAt; the send at sendAt; a query
		// right after on both sides.
		spends           []int64
		exportAt, sendAt int64
		want             int64 // the exporter's Remaining at sendAt
	}{{
		rule:     Rule{Name: "tb", Algorithm: TokenBucket, Limit: 10, Period: time.Second},
		spends:   []int64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // empty at 0, one token per 100ms
		exportAt: 100 * ms, sendAt: 600 * ms, want: 6,
	}, {
		rule:     Rule{Name: "gcra", Algorithm: GCRA, Limit: 2, Period: time.Second},
		spends:   []int64{0, 0},
		exportAt: 1 * ms, sendAt: s, want: 2,
	}, {
		rule:     Rule{Name: "lb", Algorithm: LeakyBucket, Limit: 10, Burst: 5, Period: time.Second},
		spends:   []int64{0, 0, 0, 0, 0},
		exportAt: 0, sendAt: 300 * ms, want: 3,
	}, {
		rule: Rule{Name: "fw", Algorithm: FixedWindow, Limit: 3, Period: time.Minute},
		// The next window. Stale by 25 s, over a quarter period, the
		// stream as exported reads as one of this window (a smaller
		// shift splits into the right window: see packDeadAt).
		spends:   []int64{10 * s, 20 * s, 40 * s},
		exportAt: 40 * s, sendAt: 65 * s, want: 3,
	}, {
		rule:     Rule{Name: "sw", Algorithm: SlidingWindow, Limit: 4, Period: time.Minute},
		spends:   []int64{10 * s, 20 * s, 30 * s, 40 * s},
		exportAt: 50 * s, sendAt: 90 * s, want: 2, // the previous window's 4 weigh (60−30)/60
	}, {
		rule:     Rule{Name: "sl", Algorithm: SlidingLog, Limit: 3, Period: time.Minute},
		spends:   []int64{0, 10 * s, 20 * s},
		exportAt: 25 * s, sendAt: 60*s + 1, want: 1, // the first has left the window
	}, {
		rule:     Rule{Name: "sl", Algorithm: SlidingLog, Limit: 3, Period: time.Minute},
		spends:   []int64{0, 10 * s, 20 * s},
		exportAt: 25 * s, sendAt: 90 * s, want: 3, // a window and more: all left
	}} {
		t.Run(fmt.Sprintf("%v/%v", tc.rule.Algorithm, time.Duration(tc.sendAt-tc.exportAt)), func(t *testing.T) {
			const base = (1 << 50) / int64(time.Hour) * int64(time.Hour) // the exporter's clock, windows aligned on it
			const skew = int64(7 * time.Hour)
			r := &tc.rule
			a := mustTable(t, 1)
			for i, at := range tc.spends {
				if d, err := a.Check(0, 42, r, base+at, 1); err != nil || !d.Allowed {
					t.Fatalf("spend %d at %v: %+v, %v", i, time.Duration(at), d, err)
				}
			}
			src := a.Export(nil, 0, base+tc.exportAt)
			sent, err := a.Restamp(nil, src, base+tc.exportAt, base+tc.sendAt)
			if err != nil {
				t.Fatal(err)
			}
			want, err := a.Check(0, 42, r, base+tc.sendAt, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want.Remaining != tc.want {
				t.Fatalf("exporter at the send: %d remaining, the table says %d", want.Remaining, tc.want)
			}
			// The importer's clock is 7h ahead, plus a fraction of a
			// window for the rules that do not align windows.
			at := base + tc.sendAt + skew
			if !r.Algorithm.window() {
				at += 123 * ms
			}
			for _, c := range []struct {
				name   string
				stream []byte
			}{{"restamped", sent}, {"as exported", src}} {
				b := mustTable(t, 1)
				if _, err := b.Import(0, c.stream, at); err != nil {
					t.Fatal(err)
				}
				got, err := b.Check(0, 42, r, at, 0)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case c.name == "restamped" && got.Remaining != want.Remaining:
					t.Errorf("imported restamped: %d remaining, the exporter at the send %d", got.Remaining, want.Remaining)
				case c.name == "as exported" && got.Remaining >= want.Remaining:
					t.Errorf("imported as exported: %d remaining, want fewer than the exporter's %d (it should look younger)", got.Remaining, want.Remaining)
				}
			}
		})
	}
}

// Restamp leaves out what is dead at the send: states and log entries
// of the newest rule set past their time, states of an older set once no
// carry-over can make them matter (past dropAt), and the sets no record
// uses any more. A table that does not hold the stream's sets keeps all
// its states: what they carry over to is unknown to it.
func TestRestampDropsWhatDied(t *testing.T) {
	const s = int64(time.Second)
	v1 := []Rule{{Name: "sl", Algorithm: SlidingLog, Limit: 5, Period: time.Minute, Version: 1}}
	v2 := []Rule{
		{Name: "sl", Algorithm: SlidingLog, Limit: 6, Period: time.Minute, Version: 2},
		{Name: "tb", Algorithm: TokenBucket, Limit: 1, Period: time.Hour, Version: 2},
	}
	a := mustTable(t, 1)
	spend := func(h uint64, r *Rule, at int64) {
		t.Helper()
		if d, err := a.Check(0, h, r, at, 1); err != nil || !d.Allowed {
			t.Fatalf("spend on %d at %v: %+v, %v", h, time.Duration(at), d, err)
		}
	}
	if err := a.SetRules(1, v1, 0); err != nil {
		t.Fatal(err)
	}
	spend(1, &v1[0], 0) // set 1: expiries 60s, 60s, 90s
	spend(1, &v1[0], 0)
	spend(1, &v1[0], 30*s)
	if err := a.SetRules(2, v2, 40*s); err != nil { // set 1's log lives until 40s + 1m (set 2's longest log) + lateWrites
		t.Fatal(err)
	}
	spend(3, &v2[0], 50*s) // set 2: expiries 110s, 130s
	spend(3, &v2[0], 70*s)
	spend(2, &v2[1], 100*s) // set 2: TAT 1h + 100s
	src := a.Export(nil, 0, 100*s)

	for _, tc := range []struct {
		to   int64
		recs int
		sets string
		ents int // entries of key 3's log
	}{
		{105 * s, 3, "[1 2]", 2},
		{111 * s, 2, "[2]", 1}, // set 1's log past its kind's dropAt (110s), though set 2 holds a rule of an hour
		{131 * s, 1, "[2]", 0},
		{int64(time.Hour) + 41*s, 1, "[2]", 0},
	} {
		got, err := a.Restamp(nil, src, 100*s, tc.to)
		if err != nil {
			t.Fatal(err)
		}
		if want := a.Export(nil, 0, tc.to); !bytes.Equal(got, want) {
			t.Errorf("restamped to %v:\n got % x\nwant % x", time.Duration(tc.to), got, want)
		}
		st, err := decodeStream(got, 0, tc.to)
		if err != nil {
			t.Fatal(err)
		}
		var vs []uint64
		for _, s := range st.sets {
			vs = append(vs, s.version)
		}
		ents := 0
		for _, l := range st.logs {
			if l.key == slotKey(3) {
				ents = int(l.l.n)
			}
		}
		if st.count != tc.recs || fmt.Sprint(vs) != tc.sets || ents != tc.ents {
			t.Errorf("restamped to %v: %d records of sets %v, %d entries of key 3; want %d of %s, %d entries",
				time.Duration(tc.to), st.count, vs, ents, tc.recs, tc.sets, tc.ents)
		}
	}

	got, err := mustTable(t, 1).Restamp(nil, src, 100*s, int64(time.Hour)+41*s)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := decodeStream(got, 0, 0); err != nil || st.count != 3 {
		t.Errorf("restamped by a table without its sets: %+v, %v; want all 3 states", st, err)
	}
}

// Restamp at a to before from changes nothing, and an invalid stream is
// refused as Import refuses it.
func TestRestampEdges(t *testing.T) {
	r := &Rule{Name: "tb", Algorithm: TokenBucket, Limit: 2, Period: time.Second}
	a := mustTable(t, 3)
	a.Check(2, 9, r, 1000, 2)
	src := a.Export(nil, 2, 1000)
	for _, to := range []int64{1000, 999, math.MinInt64} {
		if got, err := a.Restamp(nil, src, 1000, to); err != nil || !bytes.Equal(got, src) {
			t.Errorf("Restamp(from 1000, to %d) = % x, %v; want the stream as it is", to, got, err)
		}
	}
	prefix := []byte("keep")
	for _, bad := range [][]byte{nil, []byte("RLP1"), []byte("RLP1\x01\x02"), src[:len(src)-1], append(src[:len(src):len(src)], 0)} {
		got, err := a.Restamp(prefix, bad, 1000, 2000)
		if !errors.Is(err, ErrCorrupt) || !bytes.Equal(got, prefix) {
			t.Errorf("Restamp(% x) = % x, %v; want the prefix and ErrCorrupt", bad, got, err)
		}
	}
}
