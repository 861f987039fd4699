package rules

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

const apiExample = `
rules:
  - name: public-api
    algorithm: token_bucket   # token_bucket | gcra | leaky_bucket | fixed_window | sliding_window | sliding_log
    limit: 100                # requests (or cost units) per period
    period: 1s                # Go duration
    burst: 200                # token_bucket/gcra: capacity; leaky_bucket: how many may wait; default = limit
    failure_mode: open        # open (default) | closed: the answer when the owner cannot be reached
  - name: login
    algorithm: sliding_log
    limit: 5
    period: 1m
    failure_mode: closed
`

var apiExampleRules = []limiter.Rule{
	{Name: "public-api", Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second, Burst: 200, FailureMode: limiter.FailOpen},
	{Name: "login", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Minute, FailureMode: limiter.FailClosed},
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []limiter.Rule
	}{
		{"api example", apiExample, apiExampleRules},
		{"json", `{"rules":[{"name":"public-api","algorithm":"token_bucket","limit":100,"period":"1s","burst":200,"failure_mode":"open"},
			{"name":"login","algorithm":"sliding_log","limit":5,"period":"1m","failure_mode":"closed"}]}`, apiExampleRules},
		{"empty", "", nil},
		{"blank", " \n\n  \n", nil},
		{"comment only", "# nothing yet\n", nil},
		{"null", "null", nil},
		{"rules without value", "rules:\n", nil},
		{"rules null", `{"rules": null}`, nil},
		{"rules empty yaml", "rules: []\n", []limiter.Rule{}},
		{"rules empty json", `{"rules":[]}`, []limiter.Rule{}},
		{"null fields are absent", "rules:\n- name: a\n  algorithm: gcra\n  limit: 3\n  period: 2s\n  burst:\n  failure_mode: null\n",
			[]limiter.Rule{{Name: "a", Algorithm: limiter.GCRA, Limit: 3, Period: 2 * time.Second}}},
		{"window burst equal to limit", "rules: [{name: w, algorithm: fixed_window, limit: 10, period: 1m, burst: 10}]",
			[]limiter.Rule{{Name: "w", Algorithm: limiter.FixedWindow, Limit: 10, Period: time.Minute, Burst: 10}}},
		{"written default", "rules: [{name: default, algorithm: gcra, limit: 1, period: 1h}]",
			[]limiter.Rule{{Name: "default", Algorithm: limiter.GCRA, Limit: 1, Period: time.Hour}}},
		{"compound period", "rules: [{name: x, algorithm: leaky_bucket, limit: 7, period: 1h30m, burst: 3}]",
			[]limiter.Rule{{Name: "x", Algorithm: limiter.LeakyBucket, Limit: 7, Period: 90 * time.Minute, Burst: 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(got) != len(tt.want) || (len(got) > 0 && !reflect.DeepEqual(got, tt.want)) {
				t.Errorf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// rule builds a one-rule YAML document from "key: value" lines.
func rule(lines ...string) string {
	return "rules:\n  - " + strings.Join(lines, "\n    ") + "\n"
}

// base is a valid rule's fields, for the error cases to vary.
func base(name string, except string, extra ...string) string {
	lines := []string{"name: " + name}
	for _, l := range []string{"algorithm: token_bucket", "limit: 10", "period: 1s", "burst: 20", "failure_mode: open"} {
		if !strings.HasPrefix(l, except+":") {
			lines = append(lines, l)
		}
	}
	return rule(append(lines, extra...)...)
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		index int    // Error.Index
		rule  string // Error.Rule
		field string // Error.Field
		msg   string // the whole message
	}{
		// The cases API.md lists.
		{"unknown algorithm", base("login", "algorithm", "algorithm: leaky"), 0, "login", "algorithm",
			`rule "login": algorithm: unknown algorithm "leaky" (want one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window, sliding_log)`},
		{"limit zero", base("login", "limit", "limit: 0"), 0, "login", "limit", `rule "login": limit: must be > 0, got 0`},
		{"limit negative", base("login", "limit", "limit: -5"), 0, "login", "limit", `rule "login": limit: must be > 0, got -5`},
		{"limit missing", base("login", "limit"), 0, "login", "limit", `rule "login": limit: must be > 0, got 0`},
		{"period zero", base("login", "period", "period: 0s"), 0, "login", "period", `rule "login": period: must be > 0, got 0s`},
		{"period missing", base("login", "period"), 0, "login", "period", `rule "login": period: must be > 0, got 0s`},
		{"period negative", base("login", "period", "period: -1m"), 0, "login", "period", `rule "login": period: must be > 0, got -1m0s`},
		{"burst negative", base("login", "burst", "burst: -1"), 0, "login", "burst", `rule "login": burst: must be >= 0, got -1`},
		{"duplicate name", rule("name: a", "algorithm: gcra", "limit: 1", "period: 1s") +
			"  - {name: b, algorithm: gcra, limit: 1, period: 1s}\n  - {name: a, algorithm: gcra, limit: 2, period: 1s}\n",
			2, "a", "name", `rule "a": name: duplicate name: rules[0] and rules[2]`},
		{"unknown field", base("login", "", "limt: 5"), 0, "login", "limt",
			`rule "login": limt: unknown field (want name, algorithm, limit, period, burst, failure_mode)`},
		{"unknown field wrong case", base("login", "", "Limit: 5"), 0, "login", "Limit",
			`rule "login": Limit: unknown field (want name, algorithm, limit, period, burst, failure_mode)`},
		{"unknown field json", `{"rules":[{"name":"x","algorithm":"gcra","limit":1,"period":"1s","extra":true}]}`, 0, "x", "extra",
			`rule "x": extra: unknown field (want name, algorithm, limit, period, burst, failure_mode)`},
		// Type errors.
		{"limit not a number", base("login", "limit", "limit: abc"), 0, "login", "limit", `rule "login": limit: must be an integer, got "abc"`},
		{"limit fractional", base("login", "limit", "limit: 1.5"), 0, "login", "limit", `rule "login": limit: must be an integer, got 1.5`},
		{"limit overflow", base("login", "limit", "limit: 99999999999999999999"), 0, "login", "limit",
			`rule "login": limit: must be an integer, got 100000000000000000000`},
		{"burst a string", base("login", "burst", `burst: "x"`), 0, "login", "burst", `rule "login": burst: must be an integer, got "x"`},
		{"period not a duration", base("login", "period", "period: soon"), 0, "login", "period",
			`rule "login": period: must be a Go duration such as "1s", "1m" or "24h" (no unit above h: 366 days is "8784h"), got "soon"`},
		{"period in days", base("login", "period", "period: 1d"), 0, "login", "period",
			`rule "login": period: must be a Go duration such as "1s", "1m" or "24h" (no unit above h: 366 days is "8784h"), got "1d"`},
		{"period a number", base("login", "period", "period: 60"), 0, "login", "period",
			`rule "login": period: must be a Go duration such as "1s", "1m" or "24h" (no unit above h: 366 days is "8784h"), got 60`},
		{"failure mode", base("login", "failure_mode", "failure_mode: maybe"), 0, "login", "failure_mode",
			`rule "login": failure_mode: must be open or closed, got "maybe"`},
		{"algorithm a list", base("login", "algorithm", "algorithm: [gcra]"), 0, "login", "algorithm",
			`rule "login": algorithm: must be a string, one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window, sliding_log; got ["gcra"]`},
		{"algorithm missing", base("login", "algorithm"), 0, "login", "algorithm",
			`rule "login": algorithm: missing (want one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window, sliding_log)`},
		// Rules without a usable name are named by index.
		{"name missing", "rules:\n- {name: ok, algorithm: gcra, limit: 1, period: 1s}\n- {algorithm: gcra, limit: 1, period: 1s}\n",
			1, "", "name", `rules[1]: name: missing; every rule needs a name`},
		{"name invalid", "rules:\n- {name: 'a b', algorithm: gcra, limit: 1, period: 1s}\n", 0, "", "name",
			`rules[0]: name: must be 1 to 128 printable ASCII characters without spaces, quotes, '\', ';', ',' or '=', got "a b"`},
		{"name yaml bool", "rules:\n- {name: yes, algorithm: gcra, limit: 1, period: 1s}\n", 0, "", "name",
			`rules[0]: name: must be a string, got true (YAML reads an unquoted yes, no, on, off, y, n or number as such: quote it, "…")`},
		{"name first", "rules:\n- {algorithm: gcra, limit: x, bogus: 1}\n", 0, "", "name", `rules[0]: name: missing; every rule needs a name`},
		// A name in the wrong case is named, not taken for a missing one.
		{"name in capitals", `{"rules":[{"Name":"a","algorithm":"gcra","limit":5,"period":"1s"}]}`, 0, "", "Name", `rules[0]: Name: unknown field: field names are lower case (want name)`},
		{"rule not a mapping", "rules: [1]\n", 0, "", "", `rules[0]: must be a mapping of name, algorithm, limit, period, burst, failure_mode, got 1`},
		// Limits from limiter.Rule.Validate.
		{"window burst", "rules: [{name: w, algorithm: sliding_window, limit: 10, period: 1s, burst: 5}]", 0, "w", "burst",
			`rule "w": burst: sliding_window has no burst; omit it or set it equal to limit`},
		{"sliding log limit", "rules: [{name: l, algorithm: sliding_log, limit: 10001, period: 1s}]", 0, "l", "limit",
			`rule "l": limit: sliding_log keeps one entry per request and allows at most 10000; use sliding_window for larger limits`},
		// The document.
		{"not a mapping", "- a\n- b\n", -1, "", "", `rules document: must be a mapping with a "rules" list, got ["a","b"]`},
		{"rules not a list", "rules: 3\n", -1, "", "rules", `rules document: rules: must be a list of rules, got 3`},
		{"top-level unknown field", "rules: []\nroute: []\n", -1, "", "route", `rules document: route: unknown field (want rules, routes)`},
		{"duplicate yaml key", base("login", "", "limit: 11"), -1, "", "", ""},
		// JSON that the fast path (plainJSON) leaves to the YAML reading.
		{"duplicate json key", `{"rules":[{"name":"a","algorithm":"gcra","limit":1,"limit":2,"period":"1s"}]}`, -1, "", "", ""},
		{"duplicate json key escaped", `{"rules":[{"name":"a","algorithm":"gcra","limit":1,"\u006cimit":2,"period":"1s"}]}`, -1, "", "", ""},
		{"duplicate json top key", `{"rules":[],"rules":[{"name":"a","algorithm":"gcra","limit":1,"period":"1s"}]}`, -1, "", "", ""},
		{"json limit fractional", `{"rules":[{"name":"a","algorithm":"gcra","limit":1.5,"period":"1s"}]}`, 0, "a", "limit", `rule "a": limit: must be an integer, got 1.5`},
		{"json two objects", `{"rules":[]} {"rules":[]}`, -1, "", "", ""},
		{"bad yaml", "rules: [\n", -1, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			checkError(t, err, tt.index, tt.rule, tt.field, tt.msg)
		})
	}
}

func checkError(t *testing.T, err error, index int, rule, field, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %q", msg)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %T %v, want *Error", err, err)
	}
	if e.Index != index || e.Rule != rule || e.Field != field {
		t.Errorf("err = {Index %d, Rule %q, Field %q}, want {%d, %q, %q}", e.Index, e.Rule, e.Field, index, rule, field)
	}
	if msg != "" && err.Error() != msg {
		t.Errorf("err = %s\n          want %s", err, msg)
	}
	// The message names the rule and the field.
	switch {
	case rule != "" && !strings.Contains(err.Error(), fmt.Sprintf("rule %q", rule)):
		t.Errorf("message %q does not name rule %q", err, rule)
	case rule == "" && index >= 0 && !strings.Contains(err.Error(), fmt.Sprintf("rules[%d]", index)):
		t.Errorf("message %q does not name rules[%d]", err, index)
	case field != "" && !strings.Contains(err.Error(), field+": "):
		t.Errorf("message %q does not name field %q", err, field)
	}
}

func TestParseTooLarge(t *testing.T) {
	doc := "rules: []\n" + strings.Repeat("#", MaxDocumentSize)
	_, err := Parse([]byte(doc))
	checkError(t, err, -1, "", "", fmt.Sprintf("rules document: %d bytes, over the limit of %d", len(doc), MaxDocumentSize))
	if _, err := Parse([]byte(doc[:MaxDocumentSize])); err != nil {
		t.Errorf("Parse(%d bytes) = %v, want nil", MaxDocumentSize, err)
	}
}

func TestParseTooManyRules(t *testing.T) {
	doc := func(n int) []byte {
		var b strings.Builder
		b.WriteString(`{"rules":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"r%d","algorithm":"gcra","limit":1,"period":"1s"}`, i)
		}
		b.WriteString("]}")
		return []byte(b.String())
	}
	rs, err := Parse(doc(MaxRules))
	if err != nil || len(rs) != MaxRules {
		t.Fatalf("Parse(%d rules) = %d rules, %v", MaxRules, len(rs), err)
	}
	_, err = Parse(doc(MaxRules + 1))
	checkError(t, err, -1, "", "rules", "rules document: rules: 10001 rules besides default, over the limit of 10000")
	_, err = Parse(doc(MaxRules + 2))
	checkError(t, err, -1, "", "rules", "rules document: rules: 10002 rules besides default, over the limit of 10000")
	// What GET lists for a full set, default included, is taken back.
	withDefault := append(doc(MaxRules)[:len(doc(MaxRules))-2], []byte(`,{"name":"default","algorithm":"gcra","limit":1,"period":"1s"}]}`)...)
	if rs, err := Parse(withDefault); err != nil || len(rs) != MaxRules+1 {
		t.Fatalf("Parse(%d rules and default) = %d rules, %v", MaxRules, len(rs), err)
	}
}

func TestValidate(t *testing.T) {
	ok := limiter.Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
	bad := ok
	bad.Name, bad.Period = "b", 0
	tests := []struct {
		name  string
		rs    []limiter.Rule
		index int
		rule  string
		field string
		msg   string
	}{
		{"invalid rule", []limiter.Rule{ok, bad}, 1, "b", "period", `rule "b": period: must be > 0, got 0s`},
		{"unknown algorithm", []limiter.Rule{{Name: "c", Limit: 1, Period: time.Second}}, 0, "c", "algorithm",
			`rule "c": algorithm: unknown algorithm (want one of token_bucket, gcra, leaky_bucket, fixed_window, sliding_window, sliding_log)`},
		{"duplicate", []limiter.Rule{ok, ok}, 1, "a", "name", `rule "a": name: duplicate name: rules[0] and rules[1]`},
		{"no name", []limiter.Rule{ok, {Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}}, 1, "", "name",
			`rules[1]: name: missing; every rule needs a name`},
		{"reserved prefix", []limiter.Rule{ok, {Name: "rls:d.k#0", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}}, 1, "rls:d.k#0", "name",
			`rule "rls:d.k#0": name: names starting with "rls:" are reserved for Envoy RLS descriptor limits`},
		{"too many", make([]limiter.Rule, MaxRules+1), -1, "", "rules", `rules document: rules: 10001 rules besides default, over the limit of 10000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkError(t, Validate(tt.rs), tt.index, tt.rule, tt.field, tt.msg)
		})
	}
	if err := Validate(nil); err != nil {
		t.Errorf("Validate(nil) = %v", err)
	}
	if err := Validate(apiExampleRules); err != nil {
		t.Errorf("Validate(api example) = %v", err)
	}
}

func TestDefault(t *testing.T) {
	d := Default()
	want := limiter.Rule{Name: "default", Algorithm: limiter.TokenBucket, Limit: 100, Period: time.Second, Burst: 200, FailureMode: limiter.FailOpen}
	if d != want {
		t.Errorf("Default() = %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestEffective(t *testing.T) {
	a := limiter.Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
	b := limiter.Rule{Name: "b", Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}
	mine := limiter.Rule{Name: "default", Algorithm: limiter.SlidingWindow, Limit: 3, Period: time.Hour}
	tests := []struct {
		name    string
		written []limiter.Rule
		want    []limiter.Rule
	}{
		{"none", nil, []limiter.Rule{Default()}},
		{"no default", []limiter.Rule{b, a}, []limiter.Rule{Default(), b, a}},
		{"written default first", []limiter.Rule{mine, a}, []limiter.Rule{mine, a}},
		{"written default last", []limiter.Rule{b, a, mine}, []limiter.Rule{mine, b, a}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]limiter.Rule(nil), tt.written...)
			if got := Effective(tt.written); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Effective = %+v, want %+v", got, tt.want)
			}
			if !reflect.DeepEqual(before, tt.written) {
				t.Errorf("Effective modified its argument")
			}
		})
	}
}

// A rules file must name its rules list: an empty file (one caught between
// its truncation and its write), comments alone or no "rules" entries are
// refused, not read as "remove every rule"; "rules: []" is that, on
// purpose. Anything else reads as Parse reads it.
func TestParseFile(t *testing.T) {
	for _, doc := range []string{"", "  \n", "# only a comment\n", "rules:\n", "rules: null\n", "routes: []\n", "{}"} {
		if _, err := ParseFile([]byte(doc)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"rules: []"`) {
			t.Errorf("ParseFile(%q) = %v, want a refusal naming rules: []", doc, err)
		}
	}
	if rs, err := ParseFile([]byte("rules: []\n")); err != nil || len(rs) != 0 {
		t.Errorf(`ParseFile("rules: []") = %v, %v, want no rules`, rs, err)
	}
	rs, err := ParseFile([]byte("rules:\n  - {name: a, algorithm: token_bucket, limit: 1, period: 1s}\n"))
	if err != nil || len(rs) != 1 || rs[0].Name != "a" {
		t.Errorf("ParseFile of one rule = %v, %v", rs, err)
	}
	if _, err := ParseFile([]byte("rules: [1]\n")); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseFile of a bad rule = %v, want Parse's refusal", err)
	}
}

// A PUT body writes rules only: routes in it are refused, not dropped,
// while a rules file (ParseFile) may share its document with a gateway.
func TestParseBodyRefusesRoutes(t *testing.T) {
	doc := []byte("rules:\n  - {name: a, algorithm: token_bucket, limit: 1, period: 1s}\nroutes: []\n")
	if rs, err := ParseFile(doc); err != nil || len(rs) != 1 {
		t.Fatalf("ParseFile with routes = %v, %v, want the rule", rs, err)
	}
	var e *Error
	if _, err := ParseBody(doc); !errors.As(err, &e) || e.Field != "routes" {
		t.Fatalf("ParseBody with routes = %v, want a refusal naming routes", err)
	}
	if rs, err := ParseBody(doc[:len(doc)-len("routes: []\n")]); err != nil || len(rs) != 1 {
		t.Fatalf("ParseBody without routes = %v, %v", rs, err)
	}
	// An unknown top-level field of a body is told the one it may hold.
	if _, err := ParseBody([]byte(`{"Rules": []}`)); err == nil || !strings.HasSuffix(err.Error(), "unknown field (want rules)") {
		t.Errorf(`ParseBody({"Rules": []}) = %v; want "unknown field (want rules)"`, err)
	}
}

// A document is one: rules below a "---", or a second JSON value, are
// refused rather than dropped unread. Was: Parse read the first document
// only, so `{"rules": []} {...}` removed every written rule (200), and
// rules added below a "---" in a --rules file were lost without a word.
// Empty documents before or after are allowed.
func TestParseRefusesSeveralDocuments(t *testing.T) {
	one := "rules:\n  - {name: a, algorithm: token_bucket, limit: 5, period: 1s}\n"
	for _, doc := range []string{
		one + "---\nrules:\n  - {name: b, algorithm: gcra, limit: 1, period: 1s}\n",
		one + "---\nrules:\n  - {name: b, algorithm: bogus, limit: -5, period: 1s}\n",
		one + "---\n: : :garbage [\n",
		one + "...\nnot yaml: [\n",
		`{"rules": []} {"rules": [{"name": "a", "algorithm": "gcra", "limit": 1, "period": "1s"}]}`,
	} {
		if rs, err := Parse([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrInvalid", doc, rs, err)
		}
		if rs, err := ParseFile([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseFile(%q) = %+v, %v; want ErrInvalid", doc, rs, err)
		}
		if rs, err := ParseRoutes([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRoutes(%q) = %+v, %v; want ErrInvalid", doc, rs, err)
		}
	}
	// Said so for two JSON objects too, with or without space between.
	// Was: "yaml: did not find expected <document start>".
	for _, doc := range []string{one + "---\nrules: []\n", `{"rules":[]}{"rules":[]}`, "{\"rules\":[]}\n {\"rules\":[]}\n"} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "more than one document") {
			t.Errorf("two documents %q: %v; want a message saying more than one document", doc, err)
		}
	}
	// A JSON-looking mapping followed by a YAML comment is one document.
	if rs, err := Parse([]byte(`{"rules": [{"name": "a", "algorithm": "gcra", "limit": 1, "period": "1s"}]} # one`)); err != nil || len(rs) != 1 {
		t.Errorf("a flow mapping and a comment: %v, %v; want rule a", rs, err)
	}
	for _, doc := range []string{"---\n" + one, one + "---\n", "# head\n---\n" + one + "---\n# tail\n"} {
		if rs, err := ParseFile([]byte(doc)); err != nil || len(rs) != 1 {
			t.Errorf("ParseFile(%q) = %+v, %v; want rule a (empty documents around it)", doc, rs, err)
		}
	}
}
