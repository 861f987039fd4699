package limiter

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// Decision is the answer to one check.
type Decision struct {
	Allowed bool
	// Limit is the rule's Capacity: the most that can pass at once.
	Limit int64
	// Remaining is what could still pass right after this decision.
	Remaining int64
	// ResetAfter is how long until Remaining is back at Limit with no
	// further traffic.
	ResetAfter time.Duration
	// RetryAfter is how long until this same check would pass; 0 when
	// allowed.
	RetryAfter time.Duration
	// Delay (leaky_bucket only) is how long an allowed request must wait
	// to be released in order.
	Delay time.Duration
}

// The steps below share one contract: the caller has validated the rule
// (Rule.Validate) and the cost (Rule.CheckCost). A cost of 0 spends
// nothing and answers whether a cost-1 check would pass now. Denied
// checks never change the state.

// TAT is the state of token_bucket, gcra and leaky_bucket: the
// theoretical arrival time, the instant the bucket will be full again
// (nanoseconds on the caller's clock). A TAT at or before now is the same
// as a fresh, full bucket; the zero value is one.
//
// A token bucket of capacity b refilled one token every T is exactly GCRA
// with tolerance b·T: tokens(now) = b − (TAT − now)/T. Keeping the TAT
// instead of (tokens, last) fits the whole state in one int64 and keeps
// all arithmetic in integer nanoseconds.
type TAT int64

// Dead reports whether the state is equivalent to a fresh key at now.
func (s TAT) Dead(now int64) bool { return int64(s) <= now }

// StepTAT decides a check for token_bucket, gcra and leaky_bucket.
// For leaky_bucket the decision's Delay is how long after now this
// request leaves the bucket: consecutive admissions are released one
// interval apart, and never more than Burst intervals ahead.
func StepTAT(s TAT, r *Rule, now, cost int64) (TAT, Decision) {
	var d Decision
	s = stepTAT(s, r, now, cost, &d)
	return s, d
}

// stepTAT is StepTAT writing its decision into *d: the table's hot path
// passes one Decision down instead of returning it, since a returned
// Decision (six words, too many to stay in registers) is copied through
// the stack at every level, and each such copy stalls on store
// forwarding (~20% of Table.Check in a profile).
func stepTAT(s TAT, r *Rule, now, cost int64, d *Decision) TAT {
	t := r.interval()
	tau := r.Capacity() * t // ≤ MaxTolerance, see Validate
	start := max(int64(s), now)
	*d = Decision{Allowed: true, Limit: r.Capacity()}
	want := cost
	if cost == 0 {
		want = 1
	}
	ahead := start - now // debt already in the bucket
	if ahead+want*t > tau {
		d.Allowed = false
		d.RetryAfter = time.Duration(ahead + want*t - tau)
	}
	if d.Allowed && cost > 0 {
		if r.Algorithm == LeakyBucket {
			d.Delay = time.Duration(ahead)
		}
		ahead += cost * t
		s = TAT(now + ahead)
	}
	d.Remaining = max(tau-ahead, 0) / t // ahead > tau only after the rule shrank
	d.ResetAfter = time.Duration(ahead)
	return s
}

// Window is the state of fixed_window and sliding_window.
//
// Counts is the count of the current window (fixed), or previous<<32 |
// current (sliding). DeadAt is the instant the state stops mattering —
// the end of the current window for fixed_window, the end of the window
// after it for sliding_window (when the current count stops weighing as
// "previous") — plus an offset in [Period/4, 3·Period/4] that holds
// Last, the offset in [0, Period) of the latest admission from the start
// of the window that holds it (the current window, or the previous one
// while the current count is 0); see packDeadAt. Windows are aligned to
// multiples of Period, so the rule's Period splits DeadAt back into the
// two (see split); Last is what lets a rule change place the admissions
// in the windows of a new period (ConvertWindow). Read without a rule,
// DeadAt is at most 3·Period/4 too late, so Dead never drops a state
// early. The zero value, and any state whose Counts is 0, is a
// fresh key.
type Window struct {
	DeadAt int64
	Counts uint64
}

// Dead reports whether the state is equivalent to a fresh key at now.
func (s Window) Dead(now int64) bool { return s.DeadAt <= now }

// split returns the end DeadAt stands for (the window end for fixed,
// the end of the next window for sliding) and Last, for period p (see
// packDeadAt). A state packed by an older version, as end + Last, reads
// as its end and a Last clamped into [0, p).
func (s Window) split(p int64) (end, last int64) {
	end = alignDown(s.DeadAt, p)
	return end, min(max(2*(s.DeadAt-end-p/4), 0), p-1)
}

// packDeadAt is the DeadAt of a state whose window ends at end (a
// multiple of p) with its latest admission at last ∈ [0, p) from the
// window's start: end + p/4 + ⌈last/2⌉, an offset in [p/4, 3p/4]. A
// state crosses machines as times relative to its exporter's clock, and
// the importer adds its own: the two clocks' difference and the time the
// stream took shift DeadAt. Kept a quarter period clear of the window's
// edges, a shift smaller than that still splits into the same window
// (Last moves by twice the shift). Packed as end + last, as it was, an
// admission made just after a window turned was read as one of the
// window before, already over, by an importer 1 ns behind, and one made
// just before it turned as one of the next window by an importer 1 ns
// ahead: counts lost, or a whole window of denials.
func packDeadAt(end, last, p int64) int64 { return end + p/4 + (last+1)/2 }

// StepWindow decides a check for fixed_window and sliding_window.
func StepWindow(s Window, r *Rule, now, cost int64) (Window, Decision) {
	if r.Algorithm == SlidingWindow {
		return stepSliding(s, r, now, cost)
	}
	p := int64(r.Period)
	end, last := s.split(p)
	count := int64(s.Counts)
	if count == 0 || end <= now {
		end, last, count = alignDown(now, p)+p, 0, 0
	}
	want := max(cost, 1)
	d := Decision{Allowed: count+want <= r.Limit, Limit: r.Limit}
	if !d.Allowed {
		// cost ≤ Limit, so it passes as soon as the window turns.
		d.RetryAfter = time.Duration(end - now)
	} else if cost > 0 {
		last = max(last, min(now-(end-p), p-1)) // a clock that went back keeps Last
		count += cost
	}
	d.Remaining = max(r.Limit-count, 0) // count > Limit only after the rule shrank
	if count == 0 {
		return Window{}, d // a query on a fresh window stores nothing
	}
	d.ResetAfter = time.Duration(end - now)
	return Window{DeadAt: packDeadAt(end, last, p), Counts: uint64(count)}, d
}

// stepSliding: estimate = prev × (P − elapsed)/P + cur; admit when
// estimate + cost ≤ limit. All comparisons are exact in 128-bit integers:
// prev × (P − elapsed) + (cur + cost) × P ≤ limit × P.
func stepSliding(s Window, r *Rule, now, cost int64) (Window, Decision) {
	p := int64(r.Period)
	var start, last int64 // start of the current window; see Window
	var prev, cur int64
	end, l := int64(math.MinInt64), int64(0)
	if s.Counts != 0 {
		end, l = s.split(p)
	}
	if end <= now {
		start = alignDown(now, p)
	} else {
		start, last = end-2*p, l
		prev, cur = int64(s.Counts>>32), int64(s.Counts&0xffffffff)
		if now >= start+p { // the current window has turned: it becomes previous
			start += p // once: the state is not dead, so now < start + 2p
			if cur == 0 {
				last = 0 // prev was the window before: nothing weighs now
			}
			prev, cur = cur, 0
		}
	}
	elapsed := max(now-start, 0) // a clock that went back stays in this window
	want := max(cost, 1)
	limitP := mul128(r.Limit, p)
	used := add128(mul128(prev, p-elapsed), mul128(cur, p))
	d := Decision{Limit: r.Limit, Allowed: !less128(limitP, add128(used, mul128(want, p)))}
	if d.Allowed && cost > 0 {
		if cur == 0 {
			last = 0
		}
		last = max(last, min(elapsed, p-1))
		cur += cost
		used = add128(used, mul128(cost, p))
	}
	if !d.Allowed {
		// From elapsed, and a clock that went back waits to the window's
		// start first.
		d.RetryAfter = time.Duration(slidingRetry(prev, cur, want, r.Limit, p, elapsed) + max(start-now, 0))
	}
	if !less128(limitP, used) { // used > limit×P only after the rule shrank
		d.Remaining = int64(div128(sub128(limitP, used), p))
	}
	switch {
	case cur > 0:
		d.ResetAfter = time.Duration(start + 2*p - now)
	case prev > 0:
		d.ResetAfter = time.Duration(start + p - now)
	}
	if prev == 0 && cur == 0 {
		return Window{}, d
	}
	return Window{DeadAt: packDeadAt(start+2*p, last, p), Counts: uint64(prev)<<32 | uint64(cur)}, d
}

// slidingRetry is the exact wait until prev×(P−e)/P + cur + want ≤ limit,
// for a window state observed at elapsed e.
func slidingRetry(prev, cur, want, limit, p, e int64) int64 {
	// wait returns the least e' with n × (P − e') ≤ room × P:
	// e' = P − ⌊room·P/n⌋, or 0 when that is negative.
	wait := func(n, room int64) int64 {
		q := div128(mul128(room, p), n)
		if q >= uint64(p) {
			return 0
		}
		return p - int64(q)
	}
	if room := limit - cur - want; room >= 0 && prev > 0 {
		if e2 := wait(prev, room); e2 < p {
			return max(e2-e, 0)
		}
	}
	// In the next window previous = cur and current = 0; room ≥ 0 since
	// want ≤ Limit.
	e2 := int64(0)
	if cur > 0 {
		e2 = wait(cur, limit-want)
	}
	return p - e + e2
}

// alignDown returns the largest multiple of p > 0 at most now.
func alignDown(now, p int64) int64 {
	if now >= 0 {
		return now - int64(uint64(now)%uint64(p)) // unsigned: a cheaper division
	}
	q := now / p
	if now%p != 0 {
		q--
	}
	return q * p
}

// Log is the state of sliding_log: the admitted requests of the last
// Period as (expiry, cost) entries in arrival order. The sum of their
// costs never exceeds Limit and no entry has cost 0, so a Log holds at
// most Limit ≤ MaxLogLimit entries. Entries cost 8 bytes while every
// cost is 1 (the usual case: request counting); the costs array appears
// with the first heavier entry and goes when the log empties. Buffers grow
// by half, so a log uses at most ~1.5× the slots it needs. The zero value
// is a fresh key. A Log is not safe for concurrent use.
type Log struct {
	exps  []int64  // ring buffer of expiries; admitted at exp − Period
	costs []uint16 // parallel to exps; nil while every cost is 1
	head  int32    // index of the oldest entry
	n     int32    // live entries
	sum   int32    // cost of the live entries, ≤ MaxLogLimit
	tag   uint8    // the rule set it was made under (Table only)
}

type logEntry struct {
	exp  int64
	cost int64
}

// Dead reports whether the state is equivalent to a fresh key at now.
// Unlike the other states' Dead it writes: it first drops the entries
// that have left the window.
func (l *Log) Dead(now int64) bool { l.expire(now); return l.n == 0 }

// reset empties l, keeping its tag and its buffer.
func (l *Log) reset() { l.costs, l.head, l.n, l.sum = nil, 0, 0, 0 }

// clone returns a copy of l that shares nothing with it.
func (l *Log) clone() *Log {
	c := *l
	c.exps, c.costs = slices.Clone(l.exps), slices.Clone(l.costs)
	return &c
}

// Len is the number of entries held.
func (l *Log) Len() int { return int(l.n) }

func (l *Log) slot(i int) int { return (int(l.head) + i) % len(l.exps) }

func (l *Log) costAt(slot int) int64 {
	if l.costs == nil {
		return 1
	}
	return int64(l.costs[slot])
}

// at returns the i-th oldest entry.
func (l *Log) at(i int) logEntry {
	k := l.slot(i)
	return logEntry{exp: l.exps[k], cost: l.costAt(k)}
}

func (l *Log) expire(now int64) {
	for l.n > 0 && l.exps[l.head] <= now {
		l.sum -= int32(l.costAt(int(l.head)))
		l.head = int32((int(l.head) + 1) % len(l.exps))
		l.n--
	}
	if l.n == 0 {
		l.head, l.costs = 0, nil
		if len(l.exps) > 8 {
			l.exps = nil // memory tracks active keys
		}
	}
}

func (l *Log) push(e logEntry, limit int) {
	n := int(l.n)
	if n == len(l.exps) {
		size := min(n+max(n/2, 2), limit)
		if size <= n {
			size = n + 1 // unreachable with valid input
		}
		exps := make([]int64, size)
		var costs []uint16
		if l.costs != nil {
			costs = make([]uint16, size)
		}
		for i := range n {
			k := l.slot(i)
			exps[i] = l.exps[k]
			if costs != nil {
				costs[i] = l.costs[k]
			}
		}
		l.exps, l.costs, l.head = exps, costs, 0
	}
	if e.cost != 1 && l.costs == nil {
		l.costs = make([]uint16, len(l.exps))
		for i := range l.costs {
			l.costs[i] = 1
		}
	}
	k := l.slot(n)
	l.exps[k] = e.exp
	if l.costs != nil {
		l.costs[k] = uint16(e.cost) // ≤ Limit ≤ MaxLogLimit
	}
	l.n++
	l.sum += int32(e.cost)
}

// Step decides a sliding_log check and updates the log in place.
func (l *Log) Step(r *Rule, now, cost int64) Decision {
	d := l.decide(r, now, cost)
	if d.Allowed && cost > 0 {
		d = l.admit(r, now, cost, d)
	}
	return d
}

// decide is Step without its admission: it expires the entries that have
// left the window (which changes no decision) and decides, as if nothing
// were admitted (Remaining and ResetAfter as a query would see them).
func (l *Log) decide(r *Rule, now, cost int64) Decision {
	l.expire(now)
	want := max(cost, 1)
	sum := int64(l.sum)
	d := Decision{Allowed: sum+want <= r.Limit, Limit: r.Limit}
	if !d.Allowed {
		// Wait until enough of the oldest entries have left the window.
		freed := int64(0)
		for i := range int(l.n) {
			e := l.at(i)
			freed += e.cost
			if sum-freed+want <= r.Limit {
				d.RetryAfter = time.Duration(e.exp - now)
				break
			}
		}
	}
	l.figures(r, now, &d)
	return d
}

// admit records the admission of cost > 0 that decide allowed as d, and
// returns d with the figures after it.
func (l *Log) admit(r *Rule, now, cost int64, d Decision) Decision {
	exp := now + int64(r.Period)
	if l.n > 0 {
		exp = max(exp, l.at(int(l.n)-1).exp) // keep arrival order if time went back
	}
	l.push(logEntry{exp: exp, cost: cost}, int(r.Limit))
	l.figures(r, now, &d)
	return d
}

// figures sets d's Remaining and ResetAfter from the log as it is.
func (l *Log) figures(r *Rule, now int64, d *Decision) {
	d.Remaining = max(r.Limit-int64(l.sum), 0) // sum > Limit only after the rule shrank
	d.ResetAfter = 0
	if l.n > 0 {
		d.ResetAfter = time.Duration(l.at(int(l.n)-1).exp - now)
	}
}

// 128-bit helpers for the sliding window's exact comparisons.
type u128 struct{ hi, lo uint64 }

func mul128(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func add128(a, b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	return u128{a.hi + b.hi + c, lo}
}

func sub128(a, b u128) u128 {
	lo, br := bits.Sub64(a.lo, b.lo, 0)
	return u128{a.hi - b.hi - br, lo}
}

func less128(a, b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

// div128 returns a / d for d > 0, saturated at the largest uint64.
func div128(a u128, d int64) uint64 {
	if a.hi >= uint64(d) {
		return math.MaxUint64
	}
	q, _ := bits.Div64(a.hi, a.lo, uint64(d))
	return q
}
