package limiter

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// groupRules are two rules of one algorithm: a roomy one and a tight
// one (capacity 2) that denies first.
func groupRules(t testing.TB, a Algorithm) (roomy, tight *Rule) {
	roomy = mustRule(t, Rule{Name: "roomy", Algorithm: a, Limit: 10, Period: time.Minute})
	tight = mustRule(t, Rule{Name: "tight", Algorithm: a, Limit: 2, Period: time.Second})
	return roomy, tight
}

// The three cases of a group, for each algorithm: one that passes spends
// on every item as Checks would; one whose second item denies spends
// nothing on the first, which answers as a query; items on different
// partitions behave the same.
func TestCheckGroupAllOrNothing(t *testing.T) {
	const now = int64(1_800_000_000) * int64(time.Second) // a minute boundary
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			roomy, tight := groupRules(t, a)
			tb, replay := mustTable(t, 4), mustTable(t, 4)
			ha, hb := uint64(0xa1a1), uint64(0xb2b2)
			group := func(cost int64) ([]Decision, bool) {
				t.Helper()
				out := make([]Decision, 2)
				pass, err := tb.CheckGroup([]Item{{1, ha, roomy, cost}, {2, hb, tight, cost}}, now, out)
				if err != nil {
					t.Fatal(err)
				}
				return out, pass
			}
			check := func(tb *Table, part uint32, h uint64, r *Rule, cost int64) Decision {
				t.Helper()
				d, err := tb.Check(part, h, r, now, cost)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			// Passing groups: the decisions of the same Checks, in order.
			for i := range 2 {
				out, pass := group(1)
				want := []Decision{check(replay, 1, ha, roomy, 1), check(replay, 2, hb, tight, 1)}
				if !pass || out[0] != want[0] || out[1] != want[1] {
					t.Fatalf("group %d: pass %v, %+v; want true, %+v", i, pass, out, want)
				}
			}
			// The tight limit is spent: the group is denied and spends
			// nothing on the roomy one.
			before := check(tb, 1, ha, roomy, 0)
			for i := range 3 {
				out, pass := group(1)
				denied := check(replay, 2, hb, tight, 1)
				query := before
				query.Allowed = false
				if pass || out[0] != query || out[1] != denied || out[1].RetryAfter <= 0 {
					t.Fatalf("denied group %d: pass %v, %+v; want false, [%+v %+v]", i, pass, out, query, denied)
				}
			}
			if after := check(tb, 1, ha, roomy, 0); after != before {
				t.Fatalf("the roomy limit after denied groups: %+v, want %+v (nothing spent)", after, before)
			}
		})
	}
}

// Errors spend nothing: a bad item anywhere, one bucket twice, an
// unregistered version, too few decisions.
func TestCheckGroupErrors(t *testing.T) {
	roomy, tight := groupRules(t, TokenBucket)
	versioned := *roomy
	versioned.Version = 9
	tb := mustTable(t, 4)
	const now = int64(time.Hour)
	for _, tt := range []struct {
		name  string
		items []Item
		out   int
		want  error
	}{
		{"cost", []Item{{0, 1, roomy, 1}, {0, 2, tight, 3}}, 2, ErrCost},
		{"partition", []Item{{0, 1, roomy, 1}, {4, 2, tight, 1}}, 2, ErrPartition},
		{"one bucket twice", []Item{{0, 1, roomy, 1}, {1, 2, tight, 1}, {0, 1, tight, 1}}, 3, ErrGroup},
		{"version", []Item{{0, 1, roomy, 1}, {1, 2, &versioned, 1}}, 2, ErrVersion},
		{"too few decisions", []Item{{0, 1, roomy, 1}, {1, 2, tight, 1}}, 1, ErrGroup},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tb.CheckGroup(tt.items, now, make([]Decision, tt.out))
			if !errors.Is(err, tt.want) {
				t.Fatalf("CheckGroup = %v, want %v", err, tt.want)
			}
			if tb.Len() != 0 {
				t.Fatalf("%d states stored after an error", tb.Len())
			}
		})
	}
	// A large group finds its duplicate too (by map).
	var items []Item
	for i := range 40 {
		items = append(items, Item{uint32(i % 4), uint64(i) << 8, roomy, 1})
	}
	items = append(items, items[7])
	if _, err := tb.CheckGroup(items, now, make([]Decision, len(items))); !errors.Is(err, ErrGroup) || tb.Len() != 0 {
		t.Fatalf("a large group with one bucket twice: %v, %d states", err, tb.Len())
	}
	if pass, err := tb.CheckGroup(nil, now, nil); !pass || err != nil {
		t.Fatalf("empty group: %v, %v; want true, nil", pass, err)
	}
}

// peek decides on the oracle without changing it.
func (o *oracle) peek(h uint64, r *Rule, now, cost int64) Decision {
	switch {
	case r.Algorithm.tat():
		_, d := StepTAT(o.tats[h], r, now, cost)
		return d
	case r.Algorithm.window():
		_, d := StepWindow(o.wins[h], r, now, cost)
		return d
	}
	s := &stepper{r: r}
	if l := o.logs[h]; l != nil {
		s.log = *l
	}
	return s.clone().step(now, cost)
}

// group is CheckGroup's contract written plainly: try every item; all
// allow → spend each in turn; else spend nothing.
func (o *oracle) group(ks []tableKey, costs []int64, now int64) ([]Decision, bool) {
	out := make([]Decision, len(ks))
	pass := true
	for i, k := range ks {
		out[i] = o.peek(k.h, k.r, now, costs[i])
		pass = pass && out[i].Allowed
	}
	for i, k := range ks {
		switch {
		case pass:
			out[i] = o.check(k.h, k.r, now, costs[i])
		case out[i].Allowed:
			out[i] = o.peek(k.h, k.r, now, 0)
			out[i].Allowed, out[i].RetryAfter, out[i].Delay = false, 0, 0
		}
	}
	return out, pass
}

// Random groups and single checks in a random order decide exactly as
// the plain contract says, so a denied group changes no state (the
// oracle changed none, and later decisions still agree), and what each
// bucket admits stays within its limit.
func TestCheckGroupMatchesOracle(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := rapid.IntRange(1, 4).Draw(t, "partitions")
		tb := mustTable(t, parts)
		o := newOracle()
		keys := drawKeys(t, parts, allAlgorithms, drawSize(t, "max keys", 4, 12, 40))
		now := rapid.Int64Range(0, 1<<60).Draw(t, "start")
		adm := map[oracleKey][]arrival{}
		for i := range drawSize(t, "ops", 30, 200, 1000) {
			now += drawGap(t)
			n := rapid.IntRange(1, min(4, len(keys.keys))).Draw(t, "group size")
			var ks []tableKey
			var costs []int64
			var items []Item
			used := map[oracleKey]bool{}
			for len(ks) < n {
				k := keys.draw(t)
				if used[oracleKey{kindOf(k.r.Algorithm), k.h}] || sameSlot(ks, k) {
					break
				}
				used[oracleKey{kindOf(k.r.Algorithm), k.h}] = true
				c := rapid.Int64Range(0, k.r.Capacity()).Draw(t, "cost")
				ks, costs, items = append(ks, k), append(costs, c), append(items, Item{k.part, k.h, k.r, c})
			}
			got := make([]Decision, len(items))
			pass, err := tb.CheckGroup(items, now, got)
			if err != nil {
				t.Fatalf("op %d: CheckGroup: %v", i, err)
			}
			want, wantPass := o.group(ks, costs, now)
			if pass != wantPass {
				t.Fatalf("op %d: CheckGroup(%+v) passed %v, want %v", i, items, pass, wantPass)
			}
			for j := range got {
				if got[j] != want[j] {
					t.Fatalf("op %d: item %d (%v, cost %d): %+v, want %+v", i, j, ks[j].r.Algorithm, costs[j], got[j], want[j])
				}
				if pass && costs[j] > 0 {
					k := oracleKey{kindOf(ks[j].r.Algorithm), ks[j].h}
					adm[k] = append(adm[k], arrival{now, costs[j]})
				}
			}
		}
		for _, k := range keys.keys {
			r := k.r
			checkIntervals(t, r, adm[oracleKey{kindOf(r.Algorithm), k.h}], func(span, sum int64) bool {
				switch {
				case r.Algorithm.tat():
					return (sum-r.Capacity())*int64(r.Period) <= span*r.Limit
				case r.Algorithm == SlidingLog:
					return span >= int64(r.Period) || sum <= r.Limit
				}
				return span >= int64(r.Period) || sum <= 2*r.Limit // two windows meet in one period
			})
		}
		checkInvariants(t, tb)
	})
}

// sameSlot reports whether k shares a bucket with one of ks as the table
// tells them apart (partition and slot key, whatever the store).
func sameSlot(ks []tableKey, k tableKey) bool {
	for _, o := range ks {
		if o.part == k.part && slotKey(o.h) == slotKey(k.h) {
			return true
		}
	}
	return false
}

// Concurrent groups over shared buckets at one instant (no refill): each
// bucket has spent exactly the cost of the groups that passed with it,
// never more than its capacity, under the race detector too.
func TestCheckGroupConcurrent(t *testing.T) {
	const now = int64(time.Hour)
	tb := mustTable(t, 4)
	var rules []*Rule
	for i, a := range allAlgorithms {
		rules = append(rules, mustRule(t, Rule{Name: fmt.Sprint("r", i), Algorithm: a, Limit: 50, Period: time.Hour}))
	}
	const buckets = 6
	spent := make([]int64, buckets) // guarded by mu
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				// Buckets w, w+1 (mod buckets), spread over partitions
				// in both orders, so that lock order matters.
				a, b := (w+i)%buckets, (w+i+1+i%2)%buckets
				items := []Item{
					{uint32(a % 4), uint64(a+1) << 8, rules[a], 1},
					{uint32(b % 4), uint64(b+1) << 8, rules[b], 2},
				}
				out := make([]Decision, 2)
				pass, err := tb.CheckGroup(items, now, out)
				if err != nil {
					t.Error(err)
					return
				}
				if pass {
					mu.Lock()
					spent[a]++
					spent[b] += 2
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i := range buckets {
		d, err := tb.Check(uint32(i%4), uint64(i+1)<<8, rules[i], now, 0)
		if err != nil {
			t.Fatal(err)
		}
		if spent[i] > 50 || d.Remaining != 50-spent[i] {
			t.Errorf("bucket %d (%v): remaining %d, want 50 − %d spent", i, rules[i].Algorithm, d.Remaining, spent[i])
		}
	}
}
