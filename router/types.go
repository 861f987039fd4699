package router

import (
	"errors"
	"fmt"

	"github.com/ringlimit/ringlimit/limiter"
)

// Request is one check as the front doors hand it to the router.
type Request struct {
	Rule string
	Key  string
	Cost int64 // 0 is a query that spends nothing
}

// Result is the decision for one Request. Degraded means the owner could
// not be reached in time and the rule's failure mode answered.
type Result struct {
	limiter.Decision
	Degraded bool
}

// ErrUnknownRule: a check names a rule that does not exist.
var ErrUnknownRule = errors.New("unknown rule")

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
