// Package limiter holds ringlimit's decisions: the six algorithms as pure
// step functions of (state, rule, now, cost) → (state, Decision), the rule
// model they read, and the partitioned bucket table that keeps the compact
// states of many keys.
//
// The package does no I/O, starts no goroutines and never reads a clock:
// time is always an argument, an int64 count of nanoseconds on the caller's
// clock. Window algorithms align their windows to multiples of the period
// on that clock, so callers pass Unix nanoseconds. A clock that runs
// backwards is clamped: no algorithm admits more because time went back.
//
// A rule change never re-reads a key's state under the new rule: the
// Table remembers which rule set (Rule.Version, Table.SetRules) each state
// was made under and carries it over first (ConvertTAT, ConvertWindow,
// Log.Convert), also for states that crossed machines (Export, Import).
//
// Rule and the step functions are plain values, safe to share read-only.
// Table is safe for concurrent use; see its documentation.
package limiter

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"
)

// Algorithm names one of the six limiting algorithms.
type Algorithm uint8

// The algorithms. The zero value is not an algorithm.
const (
	// TokenBucket: capacity Burst, refilled at Limit per Period, lazily,
	// with fractional tokens. A new key starts full.
	TokenBucket Algorithm = iota + 1
	// GCRA: the generic cell rate algorithm; the same admission as a
	// token bucket of the same rate and burst, kept as one timestamp.
	GCRA
	// LeakyBucket drains at Limit per Period; Burst requests may be in
	// the bucket. Decisions carry the Delay that shapes the request.
	LeakyBucket
	// FixedWindow counts per window of Period aligned to the clock's zero.
	FixedWindow
	// SlidingWindow estimates previous × (1 − elapsed/period) + current.
	SlidingWindow
	// SlidingLog keeps the admitted requests of the last Period: exact.
	SlidingLog
)

var algorithmNames = [...]string{
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	LeakyBucket:   "leaky_bucket",
	FixedWindow:   "fixed_window",
	SlidingWindow: "sliding_window",
	SlidingLog:    "sliding_log",
}

// String returns the algorithm's name as written in rules files.
func (a Algorithm) String() string {
	if a == 0 || int(a) >= len(algorithmNames) {
		return fmt.Sprintf("algorithm(%d)", uint8(a))
	}
	return algorithmNames[a]
}

// ParseAlgorithm returns the algorithm with the given rules-file name.
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, name := range algorithmNames {
		if a != 0 && name == s {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[1:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a == 0 || int(a) >= len(algorithmNames) {
		return nil, fmt.Errorf("limiter: invalid algorithm %d", uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := ParseAlgorithm(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// tat reports whether the algorithm keeps a theoretical arrival time.
func (a Algorithm) tat() bool { return a == TokenBucket || a == GCRA || a == LeakyBucket }

// window reports whether the algorithm keeps window counters.
func (a Algorithm) window() bool { return a == FixedWindow || a == SlidingWindow }

// FailureMode is a rule's answer when its owner cannot be reached.
type FailureMode uint8

const (
	// FailOpen allows the request (and says the answer is degraded).
	FailOpen FailureMode = iota
	// FailClosed denies it.
	FailClosed
)

// String returns "open" or "closed".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return fmt.Sprintf("failure_mode(%d)", uint8(m))
}

// ParseFailureMode parses "open", "closed" or "" (open).
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "", "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("unknown failure_mode %q (want open or closed)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (m FailureMode) MarshalText() ([]byte, error) {
	if m > FailClosed {
		return nil, fmt.Errorf("limiter: invalid failure mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *FailureMode) UnmarshalText(b []byte) error {
	v, err := ParseFailureMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Bounds on rules. They keep every state in 64-bit integers and every
// per-key memory cost bounded; each is checked by Rule.Validate.
const (
	// MaxLimit is the largest Limit and Burst.
	MaxLimit = 1_000_000_000
	// MinPeriod and MaxPeriod bound Period.
	MinPeriod = time.Millisecond
	MaxPeriod = 366 * 24 * time.Hour
	// MinInterval is the shortest emission interval (Period/Limit) of the
	// rate-based algorithms: at most one million units per second per key.
	// The interval is kept in whole nanoseconds, so the rate is quantised
	// by less than 0.1% (rounded down: the limiter never admits more).
	MinInterval = time.Microsecond
	// MaxTolerance bounds Burst × Period/Limit, how far ahead of now a
	// rate-based state may run.
	MaxTolerance = 10 * 366 * 24 * time.Hour
	// MaxLogLimit is the largest Limit of a sliding_log rule: its state
	// keeps one entry per admitted request of the last Period, so memory
	// per key grows with Limit. Above it use sliding_window, which keeps
	// two counters whatever the limit.
	MaxLogLimit = 10_000
	// MaxNameLen is the longest rule name.
	MaxNameLen = 128
)

// Rule is one limit as the algorithms read it. The zero value is invalid;
// build one from a rules file (package rules) or by hand and Validate it.
//
// Version names the rule set the rule belongs to, for Table: the caller
// registers each set with Table.SetRules under its version (ringlimit
// uses the Raft index at which the set was written) and checks with rules
// carrying it, so that a key's state made under an older rule is carried
// over to the new one instead of being re-read under it. 0 means
// unversioned. Validate and the step functions ignore it.
type Rule struct {
	Name        string
	Algorithm   Algorithm
	Limit       int64         // requests or cost units per Period
	Period      time.Duration // > 0
	Burst       int64         // rate algorithms: capacity (0 = Limit); windows: 0 or Limit
	FailureMode FailureMode
	Version     uint64 // the rule set's version; see Table.SetRules
}

// FieldError says which field of which rule is invalid.
type FieldError struct {
	Rule  string // the rule's name (package rules names unnamed rules by index)
	Field string // the field as written in rules files: "limit", "period"…
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("rule %q: %s: %s", e.Rule, e.Field, e.Msg)
}

// Errors returned by checks.
var (
	// ErrCost: a cost below zero or above the rule's Capacity.
	ErrCost = errors.New("limiter: cost out of range")
	// ErrRule: a rule that does not pass Validate.
	ErrRule = errors.New("limiter: invalid rule")
)

// ValidName reports whether s may name a rule: 1 to MaxNameLen bytes of
// printable ASCII without spaces, quotes, backslashes, ';', ',' or '='
// (names appear in headers and metric labels).
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"'\\;,=", c) >= 0 {
			return false
		}
	}
	return true
}

// Validate checks the rule without changing it. Its error is a *FieldError.
func (r *Rule) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Rule: r.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case !ValidName(r.Name):
		return bad("name", "must be 1 to %d printable ASCII characters without spaces, quotes, '\\', ';', ',' or '='", MaxNameLen)
	case r.Algorithm == 0 || int(r.Algorithm) >= len(algorithmNames):
		return bad("algorithm", "unknown algorithm (want one of %s)", strings.Join(algorithmNames[1:], ", "))
	case r.Limit <= 0:
		return bad("limit", "must be > 0, got %d", r.Limit)
	case r.Limit > MaxLimit:
		return bad("limit", "must be <= %d, got %d", MaxLimit, r.Limit)
	case r.Period <= 0:
		return bad("period", "must be > 0, got %v", r.Period)
	case r.Period < MinPeriod || r.Period > MaxPeriod:
		return bad("period", "must be between %v and %v, got %v", MinPeriod, MaxPeriod, r.Period)
	case r.Burst < 0:
		return bad("burst", "must be >= 0, got %d", r.Burst)
	case r.Burst > MaxLimit:
		return bad("burst", "must be <= %d, got %d", MaxLimit, r.Burst)
	case r.FailureMode > FailClosed:
		return bad("failure_mode", "must be open or closed")
	}
	switch {
	case r.Algorithm.tat():
		if iv := r.Period / time.Duration(r.Limit); iv < MinInterval {
			return bad("limit", "%d per %v is over 1,000,000 per second per key, the most %s supports", r.Limit, r.Period, r.Algorithm)
		}
		if hi, lo := bits.Mul64(uint64(r.Capacity()), uint64(r.interval())); hi != 0 || lo > uint64(MaxTolerance) {
			return bad("burst", "burst * period/limit must be <= %v", MaxTolerance)
		}
	case r.Burst != 0 && r.Burst != r.Limit:
		return bad("burst", "%s has no burst; omit it or set it equal to limit", r.Algorithm)
	case r.Algorithm == SlidingLog && r.Limit > MaxLogLimit:
		return bad("limit", "sliding_log keeps one entry per request and allows at most %d; use sliding_window for larger limits", MaxLogLimit)
	}
	return nil
}

// Capacity is the most that can pass at once from a fresh key: Burst (or
// Limit when Burst is 0) for the rate algorithms, Limit for the windows.
// It is the Limit of every Decision and the largest valid cost.
func (r *Rule) Capacity() int64 {
	if r.Algorithm.tat() && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// CheckCost returns an error wrapping ErrCost unless 0 ≤ cost ≤ Capacity.
func (r *Rule) CheckCost(cost int64) error {
	if cost < 0 || cost > r.Capacity() {
		return fmt.Errorf("%w: cost %d, rule %q allows 0 to %d", ErrCost, cost, r.Name, r.Capacity())
	}
	return nil
}

// interval is the emission interval of the rate algorithms: the time one
// unit of cost takes to refill, Period/Limit rounded up to a nanosecond.
func (r *Rule) interval() int64 {
	p, l := int64(r.Period), r.Limit
	return (p + l - 1) / l
}
