package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// RuleView is a rule as the HTTP API shows it (GET and PUT /v1/rules) and as
// Marshal writes it.
type RuleView struct {
	Name        string `json:"name"`
	Algorithm   string `json:"algorithm"`
	Limit       int64  `json:"limit"`
	Period      string `json:"period"` // a Go duration: "1s", "1m", "1h30m", "250ms"
	Burst       int64  `json:"burst"`  // the rule's Capacity: limit for window algorithms
	FailureMode string `json:"failure_mode"`
}

// ViewOf returns the view of r. Burst is r.Capacity(), so an omitted burst
// shows as the limit; Period is FormatPeriod(r.Period).
func ViewOf(r limiter.Rule) RuleView {
	return RuleView{
		Name:        r.Name,
		Algorithm:   r.Algorithm.String(),
		Limit:       r.Limit,
		Period:      FormatPeriod(r.Period),
		Burst:       r.Capacity(),
		FailureMode: r.FailureMode.String(),
	}
}

// FormatPeriod writes d as time.Duration.String does, without its zero
// trailing units: "1m" rather than "1m0s", "2h" rather than "2h0m0s".
// time.ParseDuration reads the result back to d.
func FormatPeriod(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// document is the JSON form of a rules document.
type document struct {
	Rules []RuleView `json:"rules"`
}

// Marshal returns rs as the JSON document {"rules": [...]}, one View per
// rule in order, which Parse reads back to rules with the same views. It
// refuses (with an *Error) a set that does not pass Validate, so what it
// writes always parses.
func Marshal(rs []limiter.Rule) ([]byte, error) {
	if err := Validate(rs); err != nil {
		return nil, err
	}
	return marshal(rs), nil
}

func marshal(rs []limiter.Rule) []byte {
	doc := document{Rules: make([]RuleView, len(rs))}
	for i, r := range rs {
		doc.Rules[i] = ViewOf(r)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		// Views hold strings and integers only.
		panic("rules: marshal: " + err.Error())
	}
	return b
}

// MarshalCompact is Marshal without what a rules document may leave out:
// a burst equal to the limit, and failure_mode open. Parse reads it back
// to the same rules. A member forwards rules writes to the leader in it:
// in Marshal's form, a document that came in near MaxDocumentSize
// without those fields grew past it, and the leader refused a valid
// write (413) that it takes when sent to it directly.
func MarshalCompact(rs []limiter.Rule) ([]byte, error) {
	if err := Validate(rs); err != nil {
		return nil, err
	}
	type compact struct {
		Name        string `json:"name"`
		Algorithm   string `json:"algorithm"`
		Limit       int64  `json:"limit"`
		Period      string `json:"period"`
		Burst       int64  `json:"burst,omitempty"`
		FailureMode string `json:"failure_mode,omitempty"`
	}
	doc := struct {
		Rules []compact `json:"rules"`
	}{Rules: make([]compact, len(rs))}
	for i, r := range rs {
		v := ViewOf(r)
		c := compact{Name: v.Name, Algorithm: v.Algorithm, Limit: v.Limit, Period: v.Period}
		if v.Burst != v.Limit {
			c.Burst = v.Burst
		}
		if r.FailureMode != limiter.FailOpen {
			c.FailureMode = v.FailureMode
		}
		doc.Rules[i] = c
	}
	return json.Marshal(doc)
}

// Fingerprint returns a stable hash of a written rule set: the hex SHA-256
// of its Marshal form. Two sets with the same views in the same order have
// the same fingerprint (an omitted burst and a burst equal to the limit
// look the same); any change to a view or to the order changes it. It
// accepts invalid sets too.
func Fingerprint(written []limiter.Rule) string {
	sum := sha256.Sum256(marshal(written))
	return hex.EncodeToString(sum[:])
}
