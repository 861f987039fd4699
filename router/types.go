package router

import (
	"errors"
	"fmt"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
)

// Request is one check as the front doors hand it to the router.
type Request struct {
	Rule string
	Key  string
	Cost int64 // 0 is a query that spends nothing
	// Inline, when set, is the rule itself, named Rule: a limit that
	// exists only in this process's configuration (Envoy RLS descriptor
	// limits), not in the cluster's rules. It is not looked up; it
	// travels with the check to the owner, which validates it and
	// refuses one whose name lacks rules.InlinePrefix. The caller
	// validates it first (a check of an invalid rule is answered by its
	// failure mode) and must not modify it while Check runs.
	Inline *limiter.Rule
	// Joined says the request is decided all-or-nothing with the one
	// before it: a run of requests whose first has Joined false and the
	// others true is one group, which either spends on every request or
	// on none (a request denied by one limit is counted by no other).
	// The group passes when every request in it would pass alone; when
	// one denies, every result has Allowed false, the denying ones with
	// their own RetryAfter, the others answering as a cost-0 query with
	// RetryAfter 0. A group whose keys are owned by one member is decided
	// there atomically; see Router.Check for the others. The first
	// request of a call must not be Joined.
	Joined bool
	// KeyValid says the caller has checked that Key is valid UTF-8 (the
	// HTTP API checks the bytes it decodes a key from), so that the
	// router does not read the key again to check it. Without it, the
	// router refuses a key that is not.
	KeyValid bool
}

// InlineOf returns the wire form of an inline rule; nil gives the zero
// value, "no inline rule".
func InlineOf(r *limiter.Rule) transport.InlineRule {
	if r == nil {
		return transport.InlineRule{}
	}
	return transport.InlineRule{Algorithm: uint8(r.Algorithm), FailureMode: uint8(r.FailureMode), Limit: r.Limit, Period: r.Period, Burst: r.Burst}
}

// Result is the decision for one Request. Degraded means the owner could
// not be reached in time and the rule's failure mode answered.
type Result struct {
	limiter.Decision
	Degraded bool
}

// ErrUnknownRule: a check names a rule that does not exist.
var ErrUnknownRule = errors.New("unknown rule")

// ErrClosed is wrapped, with api.ErrUnavailable, by the error of every
// check made once the router is closed, or cut short by its Close.
var ErrClosed = errors.New("router: closed")

// ItemError says which entry of a batch is invalid. A batch with one is
// refused whole: nothing in it was spent. Err wraps ErrUnknownRule,
// api.ErrBadRequest (empty or oversized key, cost out of range) or
// api.ErrUnavailable (the node knows no ring yet).
type ItemError struct {
	Index int
	Err   error
}

func (e *ItemError) Error() string { return fmt.Sprintf("checks[%d]: %v", e.Index, e.Err) }

func (e *ItemError) Unwrap() error { return e.Err }
