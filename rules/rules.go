// Package rules reads, checks and writes ringlimit's rules documents.
//
// A rules document is YAML or JSON (JSON is YAML):
//
//	rules:
//	  - name: login
//	    algorithm: sliding_log   # token_bucket | gcra | leaky_bucket | fixed_window | sliding_window | sliding_log
//	    limit: 5
//	    period: 1m               # a Go duration
//	    burst: 0                 # optional; default = limit
//	    failure_mode: closed     # optional; open (default) | closed
//
// Parse turns a document into the written rules, or into an *Error naming
// the rule and the field at fault; every error this package returns for bad
// input wraps ErrInvalid. The rule set in force is the built-in Default plus
// the written rules (Effective): a written rule named "default" replaces the
// built-in one. View, ViewOf and Marshal give the JSON form the HTTP API
// answers with, which Parse reads back; Fingerprint tells two written sets
// apart.
//
// The package has no state: every function is safe for concurrent use and
// never modifies its arguments.
package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// Bounds on a rules document.
const (
	// MaxDocumentSize is the largest document Parse reads, in bytes (1 MiB,
	// the API's body limit).
	MaxDocumentSize = 1 << 20
	// MaxRules is the most rules one document or rule set may hold
	// besides the one named default, which every rule set has (GET
	// /v1/rules and the cluster view list it): a set of MaxRules written
	// rules is listed with MaxRules+1, and that list is accepted back.
	MaxRules = 10_000
)

// DefaultName is the name of the built-in rule.
const DefaultName = "default"

// InlinePrefix begins the name of every rule that travels inline with its
// checks instead of living in the cluster's rule set (the Envoy RLS
// descriptor limits of router/rls). Written rules may not use it, so an
// inline rule never shares a name, and so buckets, with a written one;
// owners refuse an inline rule whose name lacks it.
const InlinePrefix = "rls:"

// ErrInvalid is wrapped by every error about an invalid document or rule
// set; test with errors.Is. The HTTP API maps it to 400 invalid_rules.
var ErrInvalid = errors.New("rules: invalid rules")

// Error says what is wrong with a rules document or rule set, and where.
// It wraps ErrInvalid. Its message reads
//
//	rule "login": period: must be > 0, got 0s
//	rules[3]: name: missing; every rule needs a name
//	rules document: 2000000 bytes, over the limit of 1048576
type Error struct {
	// Index is the rule's position in the document (0-based), or -1 when
	// the error is about the document as a whole.
	Index int
	// Rule is the rule's name, or "" when it has no valid name; the
	// message then names the rule by Index, as "rules[3]".
	Rule string
	// Field is the field as written in documents ("limit", "period", or the
	// name of an unknown field), or "" when no single field is at fault.
	Field string
	// Msg says what is wrong.
	Msg string
}

func (e *Error) Error() string {
	var s string
	switch {
	case e.Rule != "":
		s = "rule " + strconv.Quote(e.Rule) + ": "
	case e.Index >= 0:
		s = "rules[" + strconv.Itoa(e.Index) + "]: "
	default:
		s = "rules document: "
	}
	if e.Field != "" {
		s += fieldText(e.Field) + ": "
	}
	return s + e.Msg
}

// Unwrap returns ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

// fieldText returns f as it appears in a message: as is when it looks like
// a field name, quoted otherwise (an unknown field may be anything).
func fieldText(f string) string {
	for i := 0; i < len(f); i++ {
		c := f[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return strconv.Quote(f)
		}
	}
	return f
}

// Default returns the built-in rule "default": a token bucket of 100 per
// second with a burst of 200, failing open.
func Default() limiter.Rule {
	return limiter.Rule{
		Name:        DefaultName,
		Algorithm:   limiter.TokenBucket,
		Limit:       100,
		Period:      time.Second,
		Burst:       200,
		FailureMode: limiter.FailOpen,
	}
}

// Effective returns the rule set in force given the written rules: the
// written rule named "default" if there is one, else Default(), followed by
// the other written rules in the order written. It returns a new slice.
func Effective(written []limiter.Rule) []limiter.Rule {
	out := make([]limiter.Rule, 0, len(written)+1)
	out = append(out, Default())
	for _, r := range written {
		if r.Name == DefaultName {
			out[0] = r
			break
		}
	}
	for _, r := range written {
		if r.Name != DefaultName {
			out = append(out, r)
		}
	}
	return out
}

// Validate checks a written rule set as a whole: at most MaxRules rules
// besides default,
// each passing limiter's Rule.Validate, no two with the same name. It
// returns the first problem in order as an *Error, or nil. It does not
// modify rs.
func Validate(rs []limiter.Rule) error {
	if n := len(rs) - countDefault(rs); n > MaxRules {
		return tooMany(n)
	}
	for i := range rs {
		if err := validateRule(i, &rs[i]); err != nil {
			return err
		}
	}
	return checkDuplicates(rs)
}

// countDefault counts the rules of rs named default.
func countDefault(rs []limiter.Rule) int {
	n := 0
	for i := range rs {
		if rs[i].Name == DefaultName {
			n++
		}
	}
	return n
}

// tooMany is the error for a set of n rules besides default, over
// MaxRules.
func tooMany(n int) *Error {
	return &Error{Index: -1, Field: "rules", Msg: fmt.Sprintf("%d rules besides %s, over the limit of %d", n, DefaultName, MaxRules)}
}

// validateRule runs r.Validate and names the rule in its error.
func validateRule(i int, r *limiter.Rule) error {
	err := r.Validate()
	if err == nil && strings.HasPrefix(r.Name, InlinePrefix) {
		return &Error{Index: i, Rule: r.Name, Field: "name",
			Msg: fmt.Sprintf("names starting with %q are reserved for Envoy RLS descriptor limits", InlinePrefix)}
	}
	if err == nil {
		return nil
	}
	e := &Error{Index: i, Rule: ruleName(r.Name), Msg: err.Error()}
	var fe *limiter.FieldError
	if errors.As(err, &fe) {
		e.Field, e.Msg = fe.Field, fe.Msg
		if fe.Field == "name" {
			if r.Name == "" {
				e.Msg = "missing; every rule needs a name"
			} else {
				e.Msg += ", got " + quoteTrunc(r.Name)
			}
		}
	}
	return e
}

// checkDuplicates reports the first rule whose name an earlier rule has.
func checkDuplicates(rs []limiter.Rule) error {
	seen := make(map[string]int, len(rs))
	for i, r := range rs {
		if j, dup := seen[r.Name]; dup {
			return &Error{Index: i, Rule: ruleName(r.Name), Field: "name",
				Msg: fmt.Sprintf("duplicate name: rules[%d] and rules[%d]", j, i)}
		}
		seen[r.Name] = i
	}
	return nil
}

// ruleName returns name when it may name a rule in a message, else "".
func ruleName(name string) string {
	if limiter.ValidName(name) {
		return name
	}
	return ""
}

// maxQuoted bounds how much of an offending value a message repeats.
const maxQuoted = 64

// quoteTrunc quotes s, cut to maxQuoted bytes.
func quoteTrunc(s string) string {
	if t := truncate(s); t != s {
		return strconv.Quote(strings.TrimSuffix(t, "…")) + "…"
	}
	return strconv.Quote(s)
}
