package transport

import (
	"context"
	"fmt"
	"time"
)

// Check is one rate-limit check inside a batch.
type Check struct {
	Rule      string // rule name
	KeyHash   uint64 // seeded hash of the client key
	Partition uint32
	// Joined says the check is decided all-or-nothing with the check
	// before it: a run of checks whose first has Joined false and the
	// others true is one group, which the owner either spends on every
	// check of or on none (see the owner's handler). The first check of
	// a batch is never Joined. (It sits in Partition's padding: a Check
	// stays 72 bytes.)
	Joined bool
	Cost   uint64
	// Inline, when its Algorithm is not 0, is the rule itself, carried
	// with the check because it exists only in the sender's own
	// configuration (Envoy RLS descriptors), not in the cluster's rules.
	// The owner then decides under it instead of looking Rule up, after
	// validating it: the sender is not trusted to send a sane rule.
	Inline InlineRule
}

// InlineRule is a rule definition carried with a check. This package does
// not interpret it beyond the wire; the owner maps Algorithm and
// FailureMode to its own enums and validates every field. The zero value
// means "no inline rule".
type InlineRule struct {
	Algorithm   uint8 // 0 = none; else the owner's algorithm number
	FailureMode uint8
	Limit       int64
	Period      time.Duration
	Burst       int64
}

// Status is the outcome class of one check.
type Status uint8

// Statuses. Only StatusOK results carry a decision; the others say why there
// is none.
const (
	StatusOK           Status = iota // decided: see Allowed and the figures
	StatusNotOwner                   // the node does not own the partition at its epoch
	StatusUnknownRule                // the node has no rule of that name
	StatusBadRequest                 // the check is invalid (e.g. cost above the limit)
	StatusUnavailable                // not decided in time (deadline spent, node busy or stopping)
	StatusInternal                   // the node failed to decide
	StatusOverCapacity               // the owner tracks as many keys as it may and this one is new

	maxStatus = StatusOverCapacity
)

var statusNames = [...]string{"OK", "NOT_OWNER", "UNKNOWN_RULE", "BAD_REQUEST", "UNAVAILABLE", "INTERNAL", "OVER_CAPACITY"}

func (s Status) String() string {
	if s <= maxStatus {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Result is the answer to one check.
type Result struct {
	Status     Status
	Allowed    bool
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	Delay      time.Duration
}

// BatchRequest is a batch of checks sent to one owner.
//
// A BatchRequest can be decoded into again and again: DecodeBatchRequest
// reuses the capacity of Checks and keeps the rule names of the previous
// frame to avoid allocating them again. Its zero value is an empty batch.
type BatchRequest struct {
	Epoch uint64 // the sender's ring epoch
	// RulesVersion is the version (Raft index) of the rule set the sender
	// decided with; 0 = unknown. An owner that is behind waits for it.
	RulesVersion uint64
	Checks       []Check

	// names is the decoder's intern table: the rule names of the last
	// decoded frame, reused when the next frame repeats them; inlines
	// holds each name entry's inline rule (zero in version-1 frames).
	names   []string
	inlines []InlineRule
}

// BatchResponse answers a BatchRequest.
type BatchResponse struct {
	Epoch   uint64   // the owner's ring epoch (so a NOT_OWNER answer tells the router how stale it is); 0 when the transport answered without the handler
	Results []Result // same order and length as the request's Checks
}

// Handler decides batches of checks on the owner node.
//
// HandleBatch is called concurrently. When it is called, resp.Results has
// len(req.Checks) entries, each preset to Result{Status: StatusInternal},
// and resp.Epoch is 0; the handler overwrites every entry (whole Result
// values) and sets Epoch. A result slice of any other length after the call
// is answered as StatusInternal for every check. ctx carries the frame's
// deadline and is canceled when the server closes. req and resp (and their
// slices) belong to the server and must not be retained after HandleBatch
// returns; the Rule strings themselves are ordinary strings and may be kept. A panic in HandleBatch is recovered
// and answered as StatusInternal.
type Handler interface {
	HandleBatch(ctx context.Context, req *BatchRequest, resp *BatchResponse)
}

// A PromptHandler is a Handler that can tell whether it would decide a
// batch at once. The server decides such a batch on the connection's read
// goroutine, when no other frame is waiting behind it, instead of handing
// it to a worker goroutine: one goroutine hand-off (and often one thread
// wake-up) less per frame. Any other batch, and every batch of a plain
// Handler, goes to a worker, so that a batch that waits never holds up the
// frames behind it.
//
// Prompt must be cheap, must not block and must not change anything; it
// may be wrong in a race (HandleBatch then waits on the read goroutine,
// which holds up that connection's next frames as long as it waits).
type PromptHandler interface {
	Handler
	// Prompt reports whether HandleBatch(ctx, req, resp) would, as far
	// as the handler can tell now, decide without waiting for anything.
	Prompt(req *BatchRequest) bool
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, req *BatchRequest, resp *BatchResponse)

// HandleBatch calls f(ctx, req, resp).
func (f HandlerFunc) HandleBatch(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
	f(ctx, req, resp)
}
