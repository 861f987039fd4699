package rules

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		apiExample,
		"",
		"rules: []",
		`{"rules":[{"name":"a","algorithm":"gcra","limit":1,"period":"1s","burst":0,"failure_mode":"closed"}]}`,
		"rules:\n- {name: w, algorithm: fixed_window, limit: 10, period: 1m}\n- {name: w, algorithm: gcra, limit: 1, period: 1s}\n",
		"rules:\n- {name: x, algorithm: nope, limit: abc, period: soon, burst: -1, failure_mode: maybe, extra: 1}\n",
		"rules:\n- name: a\n  limit: 1\n  limit: 2\n",
		"rules: &a [*a]\n",
		"a: &a [*a, *a, *a]\nb: &b [*a, *a, *a]\n",
		"rules: [1, null, \"x\", [], {}]\n",
		"- 1\n",
		"rules: {name: a}\n",
		"rules:\n- {name: \"\\u00e9\", algorithm: gcra, limit: 1e3, period: 1h30m}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := Parse(data)
		if err != nil {
			var e *Error
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) {
				t.Fatalf("Parse error %T %v is not an *Error wrapping ErrInvalid", err, err)
			}
			if rs != nil {
				t.Fatalf("Parse returned rules and an error")
			}
			return
		}
		// Whatever parses is valid, marshals, and reads back the same.
		if err := Validate(rs); err != nil {
			t.Fatalf("Parse accepted an invalid set: %v", err)
		}
		b, err := Marshal(rs)
		if err != nil {
			t.Fatalf("Marshal(Parse) = %v", err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("Parse(Marshal(Parse)) = %v\n%s", err, b)
		}
		if len(back) != len(rs) {
			t.Fatalf("round trip: %d rules, want %d", len(back), len(rs))
		}
		for i := range rs {
			if back[i] != normal(rs[i]) {
				t.Fatalf("round trip: rule %d = %+v, want %+v", i, back[i], normal(rs[i]))
			}
		}
		_ = Effective(rs)
		_ = Fingerprint(rs)
	})
}

// FuzzPlainJSON checks the JSON fast path (plainJSON) against the YAML
// reading it stands in for: whatever it takes, the YAML parser reads as
// the same value (or refuses, where YAML 1.1 is narrower than JSON: a
// key over 1,024 bytes); a repeated key is never taken.
func FuzzPlainJSON(f *testing.F) {
	for _, seed := range []string{
		`{"rules":[{"name":"a","algorithm":"gcra","limit":1,"period":"1s","burst":0,"failure_mode":"closed"}]}`,
		`{"rules":[{"name":"a","limit":1,"limit":2}]}`,
		`{"rules":[{"name":"a","limit":1e3}]}`,
		`{"a":{"b":[1,{"c":null,"d":true}]},"e":"\u00e9\u0000"}`,
		`{"a":1} {"b":2}`,
		`{"a":"\u0061","\u0061":1}`,
		`{"rules":[]}`,
		`{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		js, ok := plainJSON(data)
		if !ok {
			return
		}
		var fast any
		if err := json.Unmarshal(js, &fast); err != nil {
			t.Fatalf("plainJSON(%q) = %q, not JSON: %v", data, js, err)
		}
		slow, err := yaml.YAMLToJSONStrict(data)
		if err != nil {
			return // refused by YAML 1.1, taken as JSON
		}
		var want any
		if err := json.Unmarshal(slow, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("plainJSON(%q) reads %v; YAML reads %v", data, fast, want)
		}
	})
}
