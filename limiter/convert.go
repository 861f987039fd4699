package limiter

import (
	"math"
	"math/bits"
)

// Carrying a key's state over a rule change.
//
// A rule change never re-reads old state under the new rule. The state a
// key has when the rule changes (at `at`, nanoseconds on the caller's
// clock) is carried over by one of the functions below, from the rule it
// was made under to the new one, and only then does the new rule decide:
//
//   - token_bucket, gcra: the tokens the key had at the change, capped at
//     the new capacity; leaky_bucket: the queue it had, capped at the new
//     burst. Both then refill (drain) at the new rate.
//   - fixed_window, sliding_window: the admissions that still counted at
//     the change, placed in the windows of the new period that contain
//     them. A window state keeps counts and the time of its latest
//     admission (see Window), so every admission of a window is placed at
//     that latest time, or, for an earlier window, at its last instant:
//     never earlier than it happened, so a converted state never admits
//     more than the exact placement would.
//   - sliding_log: each admission keeps its time and expires one new
//     period after it.
//
// What the new rule then answers is bounded by the new rule alone:
// ResetAfter and RetryAfter never exceed what a key of the new rule can
// be told, waiting RetryAfter lets the same check pass, and a tightened
// rule still counts what was admitted before the change.
//
// The functions are pure, like the steps. Both rules must be valid and of
// the same store (TAT, Window or Log); a state that was dead at `at`
// under the old rule converts to a fresh key.

// ConvertTAT carries a token_bucket, gcra or leaky_bucket state made under
// rule from over to rule to at the instant at.
func ConvertTAT(s TAT, from, to *Rule, at int64) TAT {
	ahead := int64(s) - at // debt at the change, in from's nanoseconds
	if ahead <= 0 {
		return 0
	}
	ti, tf := to.interval(), from.interval()
	tau := to.Capacity() * ti // ≤ MaxTolerance
	// The debt in units of cost is ahead/tf; in to's nanoseconds it is
	// ahead × ti / tf, rounded up (the carried state never admits more),
	// saturated.
	q := divUp128(mul128(ahead, ti), tf)
	var out int64
	if to.Algorithm == LeakyBucket {
		out = int64(min(q, uint64(tau))) // the queue, capped at the new burst
	} else {
		// tokens' = min(capFrom − debt, capTo): debt' = capTo − tokens'
		// = max(debt + capTo − capFrom, 0), at most capTo. The debt is
		// capped after the capacities' difference is taken off: capped
		// before, a debt larger than the new capacity came out smaller
		// than it is, and a spent bucket refilled as its rule tightened.
		cf, ct := from.Capacity(), to.Capacity()
		if ct >= cf {
			out = min(int64(min(q, uint64(tau)))+(ct-cf)*ti, tau)
		} else if d := mul128(cf-ct, ti); d.hi == 0 && d.lo < q {
			out = int64(min(q-d.lo, uint64(tau)))
		}
	}
	if out <= 0 {
		return 0
	}
	return TAT(at + out)
}

// AdoptTAT carries a rate state whose rule is unknown (made before rules
// had versions, or imported from a node that did not say) over to rule
// to at the instant at: its debt is kept, capped at what to allows.
func AdoptTAT(s TAT, to *Rule, at int64) TAT {
	ahead := int64(s) - at
	if ahead <= 0 {
		return 0
	}
	return TAT(at + min(ahead, to.Capacity()*to.interval()))
}

// admissions is what a window state says of its admissions: at most two
// groups, each a count placed at the latest time it may have happened.
type admissions [2]struct{ at, n int64 }

// windowAdmissions reads a state of rule from at the instant at: the
// groups of admissions that still count at at (none when it is dead).
func windowAdmissions(s Window, from *Rule, at int64) admissions {
	var g admissions
	p := int64(from.Period)
	end, last := s.split(p)
	if s.Counts == 0 || end <= at {
		return g
	}
	if from.Algorithm == FixedWindow {
		g[0].at, g[0].n = end-p+last, int64(s.Counts)
		return g
	}
	start := end - 2*p // of the current window
	prev, cur := int64(s.Counts>>32), int64(s.Counts&math.MaxUint32)
	if cur > 0 {
		g[0].at, g[0].n = start-1, prev // at most the last instant of its window
		g[1].at, g[1].n = start+last, cur
	} else {
		g[0].at, g[0].n = start-p+last, prev
	}
	// At at the current window may have turned: what is two windows
	// back no longer weighs.
	horizon := alignDown(at, p) - p
	for i := range g {
		if g[i].at < horizon {
			g[i].n = 0
		}
	}
	return g
}

// ConvertWindow carries a fixed_window or sliding_window state made under
// rule from over to rule to at the instant at.
func ConvertWindow(s Window, from, to *Rule, at int64) Window {
	return placeWindow(windowAdmissions(s, from, at), to, at)
}

// AdoptWindow carries a window state whose rule is unknown over to rule
// to at the instant at: all its counts are placed at at.
func AdoptWindow(s Window, to *Rule, at int64) Window {
	if s.Counts == 0 || s.DeadAt <= at {
		return Window{}
	}
	var g admissions
	g[0].at, g[0].n = at, int64(s.Counts>>32)+int64(s.Counts&math.MaxUint32)
	return placeWindow(g, to, at)
}

// placeWindow builds the state of rule to at the instant at that holds
// the admissions g. A group later than at (a clock that went back) is
// placed at at.
func placeWindow(g admissions, to *Rule, at int64) Window {
	p := int64(to.Period)
	start := alignDown(at, p)
	var prev, cur, lastPrev, lastCur int64 = 0, 0, -1, -1
	for _, e := range g {
		if e.n <= 0 {
			continue
		}
		t := min(e.at, at)
		switch {
		case t >= start:
			cur += e.n
			lastCur = max(lastCur, t-start)
		case t >= start-p && to.Algorithm == SlidingWindow:
			prev += e.n
			lastPrev = max(lastPrev, t-(start-p))
		}
	}
	prev, cur = min(prev, MaxLimit), min(cur, MaxLimit) // a tightened limit is met anyway
	switch {
	case to.Algorithm == FixedWindow && cur > 0:
		return Window{DeadAt: packDeadAt(start+p, lastCur, p), Counts: uint64(cur)}
	case to.Algorithm == SlidingWindow && cur > 0:
		return Window{DeadAt: packDeadAt(start+2*p, lastCur, p), Counts: uint64(prev)<<32 | uint64(cur)}
	case to.Algorithm == SlidingWindow && prev > 0:
		return Window{DeadAt: packDeadAt(start+2*p, lastPrev, p), Counts: uint64(prev) << 32}
	}
	return Window{}
}

// Convert carries a sliding_log made under rule from over to rule to at
// the instant at, in place: the entries that had expired at at are
// dropped, the others expire one period of to after they were admitted,
// and those that have then expired at at are dropped too.
func (l *Log) Convert(from, to *Rule, at int64) {
	l.expire(at)
	if shift := int64(to.Period) - int64(from.Period); shift != 0 {
		for i := range int(l.n) {
			l.exps[l.slot(i)] += shift
		}
	}
	l.expire(at)
}

// Adopt carries a log whose rule is unknown over to rule to at the
// instant at: no entry expires later than one period of to after at.
func (l *Log) Adopt(to *Rule, at int64) {
	l.expire(at)
	hi := at + int64(to.Period)
	for i := range int(l.n) {
		k := l.slot(i)
		l.exps[k] = min(l.exps[k], hi)
	}
}

// divUp128 returns ⌈a / d⌉ for d > 0, saturated at the largest uint64.
func divUp128(a u128, d int64) uint64 {
	if a.hi >= uint64(d) {
		return math.MaxUint64
	}
	q, r := bits.Div64(a.hi, a.lo, uint64(d))
	if r != 0 && q < math.MaxUint64 {
		q++
	}
	return q
}
