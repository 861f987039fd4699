// Package api holds the wire types of ringlimit's HTTP API, shared by the
// server (router/httpapi), the CLI and the Go client, and the sentinel
// errors that lower layers return so that the HTTP layer can answer with
// the contract's status codes. The contract is README.md's "HTTP API"
// section.
//
// The package has no behaviour beyond (un)marshalling; its values are
// plain data.
package api

import (
	"context"
	"errors"
	"fmt"
)

// Limits of the contract.
const (
	MaxKeyLen   = 1024    // bytes in a check's key
	MaxBatch    = 1000    // checks in one batch
	MaxBodySize = 1 << 20 // bytes in any request body
)

// CheckRequest is one check. Cost nil means 1.
type CheckRequest struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	Cost *int64 `json:"cost,omitempty"`
}

// CostValue is the check's cost: *Cost, or 1 when it is nil.
func (c CheckRequest) CostValue() int64 {
	if c.Cost != nil {
		return *c.Cost
	}
	return 1
}

// BatchRequest is a batch of checks, decided one by one.
type BatchRequest struct {
	Checks []CheckRequest `json:"checks"`
}

// Decision is the answer to one check; all durations are whole
// milliseconds, rounded up.
type Decision struct {
	Allowed      bool  `json:"allowed"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
	RetryAfterMs int64 `json:"retry_after_ms"`
	DelayMs      int64 `json:"delay_ms"`
	Degraded     bool  `json:"degraded"`
}

// BatchResponse answers a BatchRequest, in the same order.
type BatchResponse struct {
	Results []Decision `json:"results"`
}

// Rule is a rule as GET /v1/rules shows it.
type Rule struct {
	Name        string `json:"name"`
	Algorithm   string `json:"algorithm"`
	Limit       int64  `json:"limit"`
	Period      string `json:"period"`
	Burst       int64  `json:"burst"`
	FailureMode string `json:"failure_mode"`
}

// Rules is the body of GET and PUT /v1/rules.
type Rules struct {
	Rules []Rule `json:"rules"`
	// RulesVersion, in PUT's answer only, is the rules version in force
	// on the answering member once the write is (the write's Raft index,
	// or a later write's): a member that forwarded the write waits for
	// it. 0 (absent) from a member of an earlier release.
	RulesVersion uint64 `json:"rules_version,omitempty"`
}

// Member is one cluster member as GET /v1/cluster shows it.
type Member struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	HTTP       string `json:"http"`
	Raft       string `json:"raft"`
	Peer       string `json:"peer"`
	Partitions int    `json:"partitions"`
	// Voter says whether the member votes in Raft, as the answering
	// node's latest Raft configuration has it. A member joins as a
	// non-voter and is promoted once it has caught up; members beyond
	// the fifth voter stay non-voters. GET /v1/cluster always sets it;
	// nil (omitted) where it is not reported: GET /v1/cluster/view.
	Voter *bool `json:"voter,omitempty"`
	// SilentMS is, in the leader's answer only, how long its failure
	// detector has not heard from the member, in milliseconds: a crashed
	// member stays active, with its partitions, until that reaches
	// --dead-after and it is marked dead. Omitted by followers, for the
	// leader itself, for down and dead members, and for a member the
	// detector has not counted yet.
	SilentMS *int64 `json:"silent_ms,omitempty"`
}

// Cluster is the body of GET /v1/cluster.
type Cluster struct {
	Leader     string `json:"leader"`
	Epoch      uint64 `json:"epoch"`
	Partitions int    `json:"partitions"`
	// RulesVersion is the Raft index of the rules write in force on the
	// node that answers (0: the built-in rules only); members that agree
	// show the same number.
	RulesVersion uint64   `json:"rules_version"`
	Members      []Member `json:"members"`
	// RaftOnly lists the servers of the answering node's latest Raft
	// configuration that are no member: a leave whose second half (the
	// Raft removal) is pending, a join cut short before it was listed.
	// Omitted when there are none.
	RaftOnly []string `json:"raft_only,omitempty"`
}

// ClusterView is what a router that is not a member needs to send checks to
// their owners itself over the data plane: the ring at its epoch, the
// rules, and the cluster's secret key-hash seed. GET /v1/cluster/view is
// an admin endpoint for that reason.
type ClusterView struct {
	Epoch      uint64 `json:"epoch"`
	Partitions int    `json:"partitions"`
	// ReplicationFactor and Load are the consistent-hash ring's settings
	// (buraksezer/consistent: virtual points per member, and the bound
	// on a member's partitions relative to the mean), which a router needs
	// to build the same ring; not copies of data. Each partition has one
	// owner and one backup whatever they are.
	ReplicationFactor int      `json:"replication_factor"`
	Load              float64  `json:"load"`
	Seed              string   `json:"seed"`    // 16 hex digits: JSON numbers lose uint64 precision
	Members           []Member `json:"members"` // the active members: they own the partitions
	Rules             []Rule   `json:"rules"`   // as GET /v1/rules
	// RulesVersion is the Raft index of the rules write in force; routers
	// send it with their checks so an owner that is behind waits for it.
	RulesVersion uint64 `json:"rules_version"`
}

// JoinRequest is the body of POST /v1/cluster/join.
type JoinRequest struct {
	ID   string `json:"id"`
	HTTP string `json:"http"`
	Raft string `json:"raft"`
	Peer string `json:"peer"`
	// Incarnation names the process that asks (random, per start;
	// optional). A member listed active that joins from another process
	// than the one the leader last added lost its data dir (it crashed
	// and came back empty): the leader marks it down before listing it
	// active again, so that its partitions' backups serve what it held
	// and hand it back. The same process asking again (a join whose
	// answer was lost) changes nothing.
	Incarnation string `json:"incarnation,omitempty"`
	// Listed is, for a process restarted over a data dir, the log index
	// (epoch) of the last change to this member's record that its Raft
	// log held at the start (0: none, or no Raft state), and ListedTerm
	// that entry's term (0: in the snapshot, so committed). A join of an
	// id the cluster no longer lists, whose log listed it at an epoch the
	// cluster has reached, is refused as having left (ErrLeft, 409 with
	// code "left"): a leave removed it after that log ends, and its
	// restart must not undo the leave. Both optional.
	Listed     uint64 `json:"listed,omitempty"`
	ListedTerm uint64 `json:"listed_term,omitempty"`
}

// SeedStatus is the answer of GET /v1/cluster/seed: what a member with
// no Raft state that heads its --join list (the seed) asks every other
// member of the list before it bootstraps a cluster. InCluster is true
// when the member answering holds Raft state (it bootstrapped a cluster,
// received a leader's log, or restarted with a data dir): the seed then
// joins through it. False means it holds none: it is itself waiting to
// join, or is a seed deciding. A member holding state answers true even
// with no leader or no view yet (a restart replaying its log), where
// GET /v1/cluster answers 503.
type SeedStatus struct {
	ID        string `json:"id"`
	InCluster bool   `json:"in_cluster"`
}

// JoinResponse is the answer of POST /v1/cluster/join.
type JoinResponse struct {
	Status string `json:"status"` // "ok"
	// Epoch is the ring epoch (Raft index) from which the cluster lists
	// the member as the request asked: its join, or the last change to
	// it since. A member that joins with no Raft state replays the log
	// from its start, where a member that held its id before (and left)
	// shows too; it acts on no state of the log before Epoch. 0 (absent)
	// in the answer of a member older than the field.
	Epoch uint64 `json:"epoch,omitempty"`
}

// LeaveRequest is the body of POST /v1/cluster/leave.
type LeaveRequest struct {
	ID string `json:"id"`
}

// StateRequest is the body of POST /v1/cluster/state: a member that stops
// gracefully marks itself "down" (it stays a member and owns nothing
// until it returns); a returning member is made "active" again.
type StateRequest struct {
	ID    string `json:"id"`
	State string `json:"state"` // "down" or "active"
}

// Error codes of the contract.
const (
	CodeBadRequest   = "bad_request"
	CodeInvalidRules = "invalid_rules"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeUnknownRule  = "unknown_rule"
	CodeNotFound     = "not_found"
	CodeTooLarge     = "body_too_large"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
	CodeMethod       = "method_not_allowed"
	CodeConflict     = "conflict"
	CodeLeft         = "left"
)

// Error is the body of every error answer. It is also what the client
// returns for one, with the HTTP status.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"error"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message)
	}
	return e.Code + ": " + e.Message
}

// HeaderForwarded marks an admin request that a node forwarded to the
// node it believes leads. The receiver must not forward it again: two
// nodes that disagree about the leader would otherwise bounce it.
const HeaderForwarded = "X-Ringlimit-Forwarded"

type forwardedKey struct{}

// WithForwarded returns ctx marked as carrying a forwarded request.
func WithForwarded(ctx context.Context) context.Context {
	return context.WithValue(ctx, forwardedKey{}, true)
}

// Forwarded reports whether ctx carries a request forwarded by another node.
func Forwarded(ctx context.Context) bool {
	v, _ := ctx.Value(forwardedKey{}).(bool)
	return v
}

// Sentinel errors that lower layers wrap so the HTTP layer can map them.
var (
	// ErrUnavailable: no leader for a write, or the node is not ready (503).
	ErrUnavailable = errors.New("unavailable")
	// ErrNotFound: an unknown member in a leave request (404).
	ErrNotFound = errors.New("not found")
	// ErrBadRequest: a request that can never succeed as written (400).
	ErrBadRequest = errors.New("bad request")
	// ErrConflict: a join for an id a live member holds at other
	// addresses, marking the last active member down, or a leave after
	// which too few answering Raft voters would be left for a quorum
	// (409).
	ErrConflict = errors.New("conflict")
	// ErrLeft: a join of a member that left the cluster, from a process
	// whose data dir predates its removal (409, code "left"; see
	// JoinRequest.Listed).
	ErrLeft = errors.New("left")
)
