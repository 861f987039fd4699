package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/limiter"
	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// periodSyntax says what a period must look like: time.ParseDuration has
// no unit above the hour, so days are written in hours.
const periodSyntax = `must be a Go duration such as "1s", "1m" or "24h" (no unit above h: 366 days is "8784h")`

// The fields of a rule, in the order they are checked and written.
var ruleFields = []string{"name", "algorithm", "limit", "period", "burst", "failure_mode"}

// algorithmList is the list of algorithm names for messages.
var algorithmList = func() string {
	var names []string
	for a := limiter.TokenBucket; a <= limiter.SlidingLog; a++ {
		names = append(names, a.String())
	}
	return strings.Join(names, ", ")
}()

// Parse reads a rules document, YAML or JSON, and returns the written rules
// in the order written, each validated, with no two of the same name. An
// empty document, "rules:" or "rules: []" gives no rules (the built-in
// default alone is then in force). A field left out keeps its zero value:
// burst 0 means "equal to limit", failure_mode "" means open.
//
// Any problem is an *Error (wrapping ErrInvalid) that names the rule, by
// name or as "rules[i]", and the field: unknown fields (matched exactly,
// case-sensitively), values of the wrong type, duplicate YAML keys,
// duplicate rule names and everything limiter's Rule.Validate rejects. A
// document over MaxDocumentSize bytes or MaxRules rules is refused.
func Parse(data []byte) ([]limiter.Rule, error) { return parse(data, false, true) }

// parse is Parse; needList refuses a document that names no rules list
// (ParseFile), and !routes one with a "routes" list (ParseBody).
func parse(data []byte, needList, routes bool) ([]limiter.Rule, error) {
	if len(data) > MaxDocumentSize {
		return nil, &Error{Index: -1, Msg: fmt.Sprintf("%d bytes, over the limit of %d", len(data), MaxDocumentSize)}
	}
	js, err := yamlToJSON(data)
	if err != nil {
		// One line: yaml's errors may span several.
		msg := strings.Join(strings.Fields(err.Error()), " ")
		return nil, &Error{Index: -1, Msg: "not valid YAML or JSON: " + msg}
	}
	items, named, err := ruleList(js, routes)
	if err != nil {
		return nil, err
	}
	if needList && !named {
		return nil, &Error{Index: -1, Msg: `names no rules list (an empty file, only comments, or no "rules:" entries; a write in progress?): write "rules: []" (JSON: {"rules": []}) to remove every rule`}
	}
	rs := make([]limiter.Rule, len(items))
	for i, raw := range items {
		if err := parseRule(i, raw, &rs[i]); err != nil {
			return nil, err
		}
	}
	if err := checkDuplicates(rs); err != nil {
		return nil, err
	}
	if n := len(rs) - countDefault(rs); n > MaxRules {
		return nil, tooMany(n)
	}
	return rs, nil
}

// yamlToJSON converts with duplicate keys rejected. A panic in the YAML
// parser on hostile input becomes an error: a rules PUT must not crash a
// node. The document must be one: sigs.k8s.io/yaml reads the first of
// several and drops the rest unread, so a file with rules added below a
// "---" lost them, and a JSON body of two objects was read as the first
// (`{"rules": []} {...}` removed every written rule). Empty documents
// (a "---" at the end, comments) are allowed.
func yamlToJSON(data []byte) (js []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			js, err = nil, fmt.Errorf("parser failed: %v", p)
		}
	}()
	if js, ok := plainJSON(data); ok {
		return js, nil
	}
	if err := singleDocument(data); err != nil {
		return nil, err
	}
	return yaml.YAMLToJSONStrict(data)
}

// plainJSON returns data, compacted, when it is one JSON object in valid
// UTF-8 that names no key twice in any object and writes every number as
// an integer that fits an int64 (a PUT's body, a follower's forwarded
// write, a file written by a program): what YAMLToJSONStrict returns for
// it, but for the order of keys, which the readers of the result (maps)
// do not see. Anything else (YAML, a repeated key, 1e3, 1.5, bytes that
// are not UTF-8, JSON that does not parse) is not plain: the YAML path
// reads it, and says what is wrong. Was: every document went through the
// YAML parser, 60 % of the parse of a 1 MiB JSON body, and under the race
// detector (10 times slower there) a follower's forwarded 1 MiB PUT went
// past its write budget (TestFollowerForwardsARulesDocumentNearTheBodyLimit).
func plainJSON(data []byte) ([]byte, bool) {
	const maxJSONDepth = 1000 // deeper: the YAML reading, which refuses it
	t := bytes.TrimSpace(data)
	if len(t) == 0 || t[0] != '{' || !utf8.Valid(t) || bytes.ContainsAny(t, "\u0085\u2028\u2029") {
		// YAML 1.1 reads NEL and the Unicode line and paragraph
		// separators as line breaks, folding them in strings: the YAML
		// reading says what it makes of them (FuzzPlainJSON found one).
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	// One frame per open object or array; an object's keys so far (a
	// map once there are many: a hostile object of 100k keys).
	type frame struct {
		object, wantKey bool
		keys            []string
		many            map[string]bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF && len(stack) == 0 {
			break
		}
		if err != nil {
			return nil, false
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			f := &stack[n-1]
			if k, ok := tok.(string); ok {
				switch {
				case f.many != nil && f.many[k], f.many == nil && slices.Contains(f.keys, k):
					return nil, false
				case f.many != nil:
					f.many[k] = true
				case len(f.keys) < 16:
					f.keys = append(f.keys, k)
				default:
					f.many = map[string]bool{k: true}
					for _, k := range f.keys {
						f.many[k] = true
					}
				}
				f.wantKey = false
				continue
			}
			// Not a key: the object's '}'.
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if len(stack) == 0 && tok != '{' || len(stack) >= maxJSONDepth {
					return nil, false
				}
				stack = append(stack, frame{object: tok == '{', wantKey: tok == '{'})
				continue
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if _, err := tok.Int64(); err != nil {
				return nil, false // 1e3, 1.5, -0.0, past int64: YAML's reading
			}
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true // a value ended: a key or '}' next
		} else if n == 0 && dec.More() {
			return nil, false // a second value after the object
		}
	}
	var out bytes.Buffer
	if json.Compact(&out, t) != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// singleDocument reports an error when data holds more than one
// non-empty YAML document, or anything that does not parse after the
// first.
func singleDocument(data []byte) error {
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' && json.Valid(t) {
		// One JSON object, and nothing after it (json.Valid reads one
		// value): one document. A PUT's body and a follower's forwarded
		// write are such; decoding them as YAML here too made a parse
		// of a 1 MiB document take a third longer.
		return nil
	}
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	for n := 0; ; {
		var v any
		err := dec.Decode(&v)
		switch {
		case err == io.EOF:
			return nil
		case err != nil && jsonValues(data):
			// Two JSON objects back to back: YAML's decoder fails on the
			// second with "did not find expected <document start>",
			// which says nothing of the cause.
			return errMultiDoc
		case err != nil:
			return err
		case v != nil:
			if n++; n > 1 {
				return errMultiDoc
			}
		}
	}
}

// jsonValues reports whether data begins with a JSON object followed by
// another JSON value.
func jsonValues(data []byte) bool {
	t := bytes.TrimSpace(data)
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	jd := json.NewDecoder(bytes.NewReader(t))
	var v json.RawMessage
	if jd.Decode(&v) != nil {
		return false
	}
	rest := bytes.TrimSpace(t[jd.InputOffset():])
	return len(rest) > 0 && (rest[0] == '{' || rest[0] == '[')
}

var errMultiDoc = errors.New(`more than one document (a "---" between two, or two JSON values one after the other): write the rules as one`)

// ParseFile is Parse for a rules file (serve --rules) or a PUT's body,
// which must name its rules list: a document that is empty, holds only comments, or has no
// "rules" list ("rules:" alone included) is refused, where Parse reads it
// as no rules. A file is read while it may be being written (truncated,
// then filled: a shell's ">" redirection, most editors); read as no rules,
// that instant removed every written rule of the cluster. "rules: []"
// removes them all on purpose.
func ParseFile(data []byte) ([]limiter.Rule, error) { return parse(data, true, true) }

// ParseBody is ParseFile for the body of a PUT /v1/rules, which writes
// the cluster's rules only: a "routes" list (a gateway's --config, which
// a file shared with serve --rules may hold) is refused rather than
// dropped unread, so a caller never believes it changed a gateway's
// routes through a member.
func ParseBody(data []byte) ([]limiter.Rule, error) { return parse(data, true, false) }

// ruleList returns the elements of the document's "rules" list; named
// is false when the document names none (it is empty, or its "rules" is
// missing or null). A "routes" field is allowed (and skipped) with
// routes.
func ruleList(js []byte, routes bool) (items []json.RawMessage, named bool, err error) {
	js = bytes.TrimSpace(js)
	if isNull(js) {
		return nil, false, nil
	}
	var top map[string]json.RawMessage
	if js[0] != '{' || json.Unmarshal(js, &top) != nil {
		return nil, false, &Error{Index: -1, Msg: "must be a mapping with a \"rules\" list, got " + rawText(js)}
	}
	for _, k := range sortedKeys(top) {
		switch {
		case k == "routes" && !routes:
			return nil, false, &Error{Index: -1, Field: "routes", Msg: "not written through the rules API: routes are a gateway's (its --config); send the rules list alone"}
		case k != "rules" && k != "routes": // routes: read by ParseRoutes
			want := "rules, routes"
			if !routes {
				want = "rules" // a body may not hold routes
			}
			return nil, false, &Error{Index: -1, Field: truncate(k), Msg: "unknown field (want " + want + ")"}
		}
	}
	raw := bytes.TrimSpace(top["rules"])
	if len(raw) == 0 || isNull(raw) {
		return nil, false, nil
	}
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, true, &Error{Index: -1, Field: "rules", Msg: "must be a list of rules, got " + rawText(raw)}
	}
	if len(items) > MaxRules+1 { // one may be default; Validate counts exactly
		return nil, true, tooMany(len(items))
	}
	return items, true, nil
}

// parseRule decodes and validates the i-th rule of a document into r.
func parseRule(i int, raw json.RawMessage, r *limiter.Rule) error {
	raw = bytes.TrimSpace(raw)
	var fields map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &fields) != nil {
		return &Error{Index: i, Msg: "must be a mapping of " + strings.Join(ruleFields, ", ") + ", got " + rawText(raw)}
	}
	// The name first, so that every later message can use it.
	e := &Error{Index: i}
	fail := func(field, format string, args ...any) error {
		e.Field, e.Msg = field, fmt.Sprintf(format, args...)
		return e
	}
	if _, ok := fields["name"]; !ok {
		// No name, but "Name" or "NAME": say that, not "name: missing".
		for _, k := range sortedKeys(fields) {
			if strings.EqualFold(k, "name") {
				return fail(truncate(k), "unknown field: field names are lower case (want name)")
			}
		}
	}
	if v, ok := present(fields, "name"); ok {
		if json.Unmarshal(v, &r.Name) != nil {
			return fail("name", "must be a string, got %s%s", rawText(v), quoteHint(v))
		}
		e.Rule = ruleName(r.Name)
	}
	if !limiter.ValidName(r.Name) {
		return validateRule(i, r) // Validate checks the name first
	}
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(ruleFields, k) {
			return fail(truncate(k), "unknown field (want %s)", strings.Join(ruleFields, ", "))
		}
	}
	if v, ok := present(fields, "algorithm"); ok {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return fail("algorithm", "must be a string, one of %s; got %s", algorithmList, rawText(v))
		}
		a, err := limiter.ParseAlgorithm(s)
		if err != nil {
			return fail("algorithm", "unknown algorithm %s (want one of %s)", quoteTrunc(s), algorithmList)
		}
		r.Algorithm = a
	} else {
		return fail("algorithm", "missing (want one of %s)", algorithmList)
	}
	if v, ok := present(fields, "limit"); ok {
		if json.Unmarshal(v, &r.Limit) != nil {
			return fail("limit", "must be an integer, got %s", rawText(v))
		}
	}
	if v, ok := present(fields, "period"); ok {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return fail("period", "%s, got %s", periodSyntax, rawText(v))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fail("period", "%s, got %s", periodSyntax, quoteTrunc(s))
		}
		r.Period = d
	}
	if v, ok := present(fields, "burst"); ok {
		if json.Unmarshal(v, &r.Burst) != nil {
			return fail("burst", "must be an integer, got %s", rawText(v))
		}
	}
	if v, ok := present(fields, "failure_mode"); ok {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return fail("failure_mode", "must be open or closed, got %s", rawText(v))
		}
		m, err := limiter.ParseFailureMode(s)
		if err != nil {
			return fail("failure_mode", "must be open or closed, got %s", quoteTrunc(s))
		}
		r.FailureMode = m
	}
	return validateRule(i, r)
}

// quoteHint is what to add to a "must be a string" message for v, a
// YAML scalar read as a bool or a number: YAML 1.1 reads y, yes, on,
// off, no, true, 123 and the like as such unless quoted.
func quoteHint(v json.RawMessage) string {
	if t := bytes.TrimSpace(v); len(t) > 0 && (t[0] == 't' || t[0] == 'f' || t[0] == '-' || '0' <= t[0] && t[0] <= '9') {
		return ` (YAML reads an unquoted yes, no, on, off, y, n or number as such: quote it, "…")`
	}
	return ""
}

// present returns fields[k] unless it is missing or null: a key written
// without a value ("burst:") is as good as left out.
func present(fields map[string]json.RawMessage, k string) (json.RawMessage, bool) {
	v, ok := fields[k]
	if !ok || isNull(bytes.TrimSpace(v)) {
		return nil, false
	}
	return v, true
}

func isNull(js []byte) bool { return string(js) == "null" }

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// rawText shows a JSON value in a message, cut to maxQuoted bytes.
func rawText(js []byte) string { return truncate(string(js)) }

// truncate cuts s to about maxQuoted bytes, at a character boundary.
func truncate(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	n := maxQuoted
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
