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
//   - to another kind of state (a bucket, a window, a log: convertAny):
//     the admissions the old state implies, each at the latest instant the
//     state allows, replayed into the new rule as a key of it that saw
//     them would hold them (see convertAny).
//
// What the new rule then answers is bounded by the new rule alone:
// ResetAfter and RetryAfter never exceed what a key of the new rule can
// be told, waiting RetryAfter lets the same check pass, and a tightened
// rule still counts what was admitted before the change.
//
// The functions are pure, like the steps. Both rules must be valid; a
// state that was dead at `at` under the old rule converts to a fresh key.
// ConvertTAT, ConvertWindow and Log.Convert take rules of the same store
// (TAT, Window or Log).

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

// admission is n units of cost admitted at the instant at: for a
// converted state, the latest instant they may have been admitted at.
type admission struct{ at, n int64 }

// admissions is what a window or rate state says of its admissions: at
// most two groups, the earlier first.
type admissions [2]admission

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
	g := windowAdmissions(s, from, at)
	return placeWindow(g[:], to, at)
}

// AdoptWindow carries a window state whose rule is unknown over to rule
// to at the instant at: all its counts are placed at at.
func AdoptWindow(s Window, to *Rule, at int64) Window {
	if s.Counts == 0 || s.DeadAt <= at {
		return Window{}
	}
	g := []admission{{at, int64(s.Counts>>32) + int64(s.Counts&math.MaxUint32)}}
	return placeWindow(g, to, at)
}

// placeWindow builds the state of rule to at the instant at that holds
// the admissions g (in any order). A group later than at (a clock that
// went back) is placed at at.
func placeWindow(g []admission, to *Rule, at int64) Window {
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

// anyState is a key's state of any kind (kind: lifeTAT, lifeWindow or
// lifeLog), as a rule whose algorithm changes to another kind carries
// it. For a log state log is the log; for another kind it is the Log a
// conversion to a log fills (nil: a new one), so that a log carried
// through a bucket and back keeps its buffer.
type anyState struct {
	kind int
	tat  TAT
	win  Window
	log  *Log
}

// convertAny carries x, made under rule from, over to rule to at the
// instant at, whatever the kinds of the two rules; from nil (or of
// another kind than x) is an unknown rule, and x is adopted (adoptAny).
// Within a kind it is ConvertTAT, ConvertWindow or Log.Convert (a log in
// place).
//
// Across kinds, x is read as the admissions it implies, each placed at
// the latest instant the state allows (never earlier than it may have
// happened, so never counted for less time than it would have been),
// and the new state is that of a key of to that saw exactly those
// admissions:
//
//   - from a log: its entries live at at, each admitted one period of
//     from before it expires. Exact.
//   - from a window: windowAdmissions, the count of a window at the
//     instant of its latest admission (the last instant of an earlier
//     window). Conservative by at most a period of from.
//   - from a bucket (or leaky_bucket's queue): a debt D at at is
//     u = ⌈D/T⌉ units (T: from's interval, ns), the latest instants of
//     which are one at at − (u·T − D) and u − 1 at at (tatAdmissions).
//     Conservative by less than one interval of from for the one, and
//     rounded up to a whole unit: a bucket 0.2 of a token short counts
//     one admission.
//   - into a bucket: the admissions forced through to in time order from
//     a full bucket (one of cost n adds n intervals of to to the debt),
//     the debt then capped at to's capacity: the most a key of to can
//     owe (an empty bucket), which bounds RetryAfter and ResetAfter.
//   - into a window: placeWindow. Exact for what it is given.
//   - into a log: one entry per group, expiring one period of to after
//     it; the latest MaxLogLimit units are kept (trimLog), which changes
//     no decision of any log rule (limit ≤ MaxLogLimit).
//
// So after the change a key is told no more than a key of to can be
// told, and to admits no more than it would admit to a key that saw
// those admissions: the admissions the old state implies, which for a
// bucket are its debt, not its history (a bucket does not keep it).
func convertAny(x anyState, from, to *Rule, at int64) anyState {
	if from == nil || lifeKind(from.Algorithm) != x.kind {
		return adoptAny(x, to, at)
	}
	k := lifeKind(to.Algorithm)
	if x.kind == k {
		switch k {
		case lifeTAT:
			x.tat = ConvertTAT(x.tat, from, to, at)
		case lifeWindow:
			x.win = ConvertWindow(x.win, from, to, at)
		default:
			x.log.Convert(from, to, at)
		}
		return x
	}
	var g admissions
	switch x.kind {
	case lifeLog:
		if k == lifeTAT {
			return anyState{kind: k, tat: x.log.asTAT(from, to, at), log: x.log}
		}
		return anyState{kind: k, win: x.log.asWindow(from, to, at), log: x.log}
	case lifeTAT:
		g = tatAdmissions(x.tat, from.interval(), at)
	default:
		g = windowAdmissions(x.win, from, at)
	}
	return buildAny(k, g[:], x.log, to, at)
}

// adoptAny carries x, made under a rule that is not known, over to rule
// to at the instant at: within a kind as AdoptTAT, AdoptWindow and
// Log.Adopt; across kinds all it counts at at is placed at at, the
// latest instant it may have been admitted (a bucket's debt read in
// intervals of to).
func adoptAny(x anyState, to *Rule, at int64) anyState {
	k := lifeKind(to.Algorithm)
	if x.kind == k {
		switch k {
		case lifeTAT:
			x.tat = AdoptTAT(x.tat, to, at)
		case lifeWindow:
			x.win = AdoptWindow(x.win, to, at)
		default:
			x.log.Adopt(to, at)
		}
		return x
	}
	var n int64
	switch x.kind {
	case lifeTAT:
		if d := int64(x.tat) - at; d > 0 {
			t := to.interval()
			n = d/t + min(d%t, 1)
		}
	case lifeWindow:
		if !x.win.idle(at) {
			n = int64(x.win.Counts>>32) + int64(x.win.Counts&math.MaxUint32)
		}
	default:
		for i := range int(x.log.n) {
			if e := x.log.at(i); e.exp > at {
				n += e.cost
			}
		}
	}
	return buildAny(k, []admission{{at, n}}, x.log, to, at)
}

// buildAny is the state of kind k of rule to at the instant at of a key
// that saw the admissions g (in time order); buf is the Log to fill for
// a log (nil: a new one).
func buildAny(k int, g []admission, buf *Log, to *Rule, at int64) anyState {
	out := anyState{kind: k, log: buf}
	switch k {
	case lifeTAT:
		out.tat = replayTAT(g, to, at)
	case lifeWindow:
		out.win = placeWindow(g, to, at)
	default:
		out.log = fillLog(buf, g, to, at)
	}
	return out
}

// tatAdmissions reads a rate state whose rule has interval t (ns a unit
// of cost) at the instant at as the admissions its debt implies, at the
// latest instants it allows: a debt D is u = ⌈D/t⌉ units; u − 1 of them
// admitted at at leave D − (u−1)·t ∈ (0, t] to the oldest, which was
// admitted t − that before at at the latest (its debt has been draining
// since). Any history of the state has its latest u units admitted no
// later: each adds t to a debt that only drains in between.
func tatAdmissions(s TAT, t, at int64) admissions {
	var g admissions
	d := int64(s) - at
	if d <= 0 {
		return g
	}
	u := d/t + min(d%t, 1)
	g[0] = admission{at - (u*t - d), 1}
	g[1] = admission{at, u - 1}
	return g
}

// replayTAT is the state of rule to at the instant at of a full bucket
// through which the admissions g (in time order) were forced, whether or
// not they would have passed (forceTAT), its debt then capped at to's
// capacity: what a key of to may owe at most.
func replayTAT(g []admission, to *Rule, at int64) TAT {
	t := to.interval()
	hi := at + to.Capacity()*t // capacity × interval ≤ MaxTolerance
	tat := int64(math.MinInt64)
	for _, a := range g {
		tat = forceTAT(tat, a.at, a.n, t, at, hi)
	}
	if tat <= at {
		return 0
	}
	return TAT(tat)
}

// forceTAT is the TAT tat after n units admitted at the instant a (at
// most at) were forced through a bucket of interval t: each adds t to the
// debt, from a on. It never exceeds hi (≥ at): capping at every step is
// the same as capping at the end (a debt past hi stays past it), and
// keeps n·t from overflowing.
func forceTAT(tat, a, n, t, at, hi int64) int64 {
	if n <= 0 {
		return tat
	}
	base := max(tat, min(a, at))
	if room := hi - base; n > room/t {
		return hi
	}
	return base + n*t
}

// fillLog empties l (nil: a new Log) and fills it as the log of rule to
// at the instant at of a key that saw the admissions g (in time order):
// one entry per group, expiring one period of to after it, the ones
// expired at at left out, and the latest MaxLogLimit units kept (trimLog).
func fillLog(l *Log, g []admission, to *Rule, at int64) *Log {
	if l == nil {
		l = new(Log)
	}
	l.reset()
	p := int64(to.Period)
	for _, a := range g {
		exp := min(a.at, at) + p
		if a.n <= 0 || exp <= at {
			continue
		}
		l.push(logEntry{exp: exp, cost: min(a.n, MaxLogLimit)}, int(to.Limit))
	}
	l.trimLog()
	return l
}

// trimLog drops the oldest units of the log until it holds at most
// MaxLogLimit (what a stream carries; see decoder.log). That changes no
// decision of a rule of limit L ≤ MaxLogLimit: the units live at any
// instant are the latest ones, so the live cost of the trimmed log is
// min(MaxLogLimit, the live cost of the whole), and a check (of cost ≥ 1)
// that passes one passes the other.
func (l *Log) trimLog() {
	for l.sum > MaxLogLimit {
		k := int(l.head)
		c, over := l.costAt(k), int64(l.sum)-MaxLogLimit
		if c > over { // c > 1: costs is there
			l.costs[k] -= uint16(over)
			l.sum -= int32(over)
			return
		}
		l.sum -= int32(c)
		l.head = int32((k + 1) % len(l.exps))
		l.n--
	}
}

// asTAT is the rate state of rule to at the instant at of a key that saw
// the entries of l (made under rule from) that are live at at, each
// admitted one period of from before it expires (see replayTAT). l is
// only read.
func (l *Log) asTAT(from, to *Rule, at int64) TAT {
	t := to.interval()
	hi := at + to.Capacity()*t
	tat := int64(math.MinInt64)
	for i := range int(l.n) {
		if e := l.at(i); e.exp > at {
			tat = forceTAT(tat, e.exp-int64(from.Period), e.cost, t, at, hi)
		}
	}
	if tat <= at {
		return 0
	}
	return TAT(tat)
}

// asWindow is the window state of rule to at the instant at of a key
// that saw the entries of l (made under rule from) that are live at at,
// each admitted one period of from before it expires: the entries of
// each window of to are one group at the latest of them (placeWindow
// keeps a window's count and latest admission, nothing else). l is only
// read.
func (l *Log) asWindow(from, to *Rule, at int64) Window {
	p := int64(to.Period)
	start := alignDown(at, p)
	var g admissions // g[0]: to's window before start's, g[1]: start's
	for i := range int(l.n) {
		e := l.at(i)
		if e.exp <= at {
			continue
		}
		t := min(e.exp-int64(from.Period), at)
		w := &g[1]
		if t < start {
			if t < start-p {
				continue // weighs in no window of to at at
			}
			w = &g[0]
		}
		w.at, w.n = t, w.n+e.cost // entries come in time order
	}
	return placeWindow(g[:], to, at)
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
