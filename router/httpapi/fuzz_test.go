package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/router"
)

// FuzzCheckHandler sends arbitrary bodies to POST /v1/check. The handler
// must never panic and must always answer valid JSON with 200 (a decision
// or a batch of them, one per check), 400, 404 or 413 (an api.Error); a
// body with a field given twice in one object is never answered 200.
func FuzzCheckHandler(f *testing.F) {
	for _, seed := range []string{
		``,
		`{}`,
		`null`,
		`[]`,
		`{"rule":"default","key":"k"}`,
		`{"rule":"default","key":"k","cost":0}`,
		`{"rule":"small","key":"k","cost":6}`,
		`{"rule":"nope","key":"k","cost":1}`,
		`{"rule":"default","key":"k","cost":-1}`,
		`{"rule":"default","key":"k","cost":1.5}`,
		`{"rule":"default","key":"\u00e9\"\\","cost":null}`,
		`{"rule":"default","key":"k"} {}`,
		`{"checks":[]}`,
		`{"checks":null}`,
		`{"checks":[{"rule":"default","key":"a"},{"rule":"small","key":"b","cost":2}]}`,
		`{"checks":[{"rule":"default","key":"a"},{"rule":"nope","key":"b"}]}`,
		`{"checks":[{"rule":"default","key":""}],"rule":"x"}`,
		`{"checks":[1,"x",null,{}]}`,
		`{"checks":[{"rule":"default","key":"a","extra":true}]}`,
		`{"RULE":"default","Key":"k"}`,
		`{"rule":"default","key":"k","rule":"small"}`,
		`{"checks":[{"rule":"default","key":"a"}],"checks":[{"rule":"small","key":"b"},{"rule":"small","key":"c"}]}`,
		`{"rule":"default","key":"A","key":"B","cost":5}`,
		`{"rule":"default","key":"A","k\u0065y":"B"}`,
		`{"checks":[{"rule":"default","key":"a"},{"rule":"default","key":"A","key":"B"}]}`,
		`{"checks":[{"rule":"default","key":"a","cost":1,"cost":null}]}`,
		"{\"rule\":\"default\",\"key\":\"\xff\xfe\"}",
		batchBody(3, 1, `{"rule":"default","key":"k","cost":99999999999999999999}`),
	} {
		f.Add([]byte(seed))
	}
	e := newEnv(f, "")
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/v1/check", bytes.NewReader(body))
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, req)
		out := w.Body.Bytes()
		if !json.Valid(out) {
			t.Fatalf("body %q: answer is not JSON: %q", body, out)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("body %q: Content-Type %q", body, ct)
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.DisallowUnknownFields()
		switch w.Code {
		case 200:
			if name, ok := repeatedName(body); ok {
				t.Fatalf("body %q: field %q given twice, answered 200: %s", body, name, out)
			}
			if strings.HasPrefix(string(out), `{"results":`) {
				var b api.BatchResponse
				if err := dec.Decode(&b); err != nil || b.Results == nil {
					t.Fatalf("body %q: batch answer %q: %v", body, out, err)
				}
				// One result per check, as encoding/json counts them.
				var in struct{ Checks []json.RawMessage }
				if err := json.Unmarshal(body, &in); err != nil || len(in.Checks) != len(b.Results) {
					t.Fatalf("body %q: %d results, %d checks (%v)", body, len(b.Results), len(in.Checks), err)
				}
				return
			}
			var d api.Decision
			if err := dec.Decode(&d); err != nil {
				t.Fatalf("body %q: decision %q: %v", body, out, err)
			}
		case 400, 404, 413:
			var ae api.Error
			if err := dec.Decode(&ae); err != nil || ae.Code == "" || ae.Message == "" {
				t.Fatalf("body %q: error answer %q: %v", body, out, err)
			}
			want := map[int]string{400: api.CodeBadRequest, 404: api.CodeUnknownRule, 413: api.CodeTooLarge}[w.Code]
			if ae.Code != want {
				t.Fatalf("body %q: status %d with code %q", body, w.Code, ae.Code)
			}
		default:
			t.Fatalf("body %q: status %d: %s", body, w.Code, out)
		}
	})
}

// repeatedName is a naive oracle: the first object key of the JSON in
// body that its object holds twice (every key, not only the contract's
// names), and true; or false.
func repeatedName(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var objects []map[string]bool // nil for an array
	var atKey []bool
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		n := len(objects)
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			objects, atKey = objects[:n-1], atKey[:n-1]
			continue
		}
		if n > 0 && objects[n-1] != nil {
			if atKey[n-1] {
				atKey[n-1] = false
				k := tok.(string)
				if objects[n-1][k] {
					return k, true
				}
				objects[n-1][k] = true
				continue
			}
			atKey[n-1] = true
		}
		if d, ok := tok.(json.Delim); ok {
			var m map[string]bool
			if d == '{' {
				m = map[string]bool{}
			}
			objects, atKey = append(objects, m), append(atKey, d == '{')
		}
	}
}

// FuzzCheckFastPath holds the fast decoder of check bodies to
// encoding/json's: on every body the fast path takes, encoding/json must
// decode the same checks (and no error).
func FuzzCheckFastPath(f *testing.F) {
	for _, seed := range []string{
		`{"rule":"default","key":"k"}`,
		` { "rule" : "default" , "key" : "k" , "cost" : -0 } `,
		`{"rule":"default","key":"k","cost":123456789012345678}`,
		`{"key":"é","rule":"r"}`,
		`{"checks":[]}`,
		`{"checks":[{}]}`,
		`{"checks":[{"rule":"a","key":"b","cost":2},{"key":"c","rule":"a"}]}`,
		`{"checks":[{"rule":"a","key":"b"}],"rule":"x"}`,
		`{"rule":"a","key":"b","cost":1.0}`,
		`{"rule":"a","key":"b","cost":01}`,
		`{"rule":"a\u0041","key":"b"}`,
		"{\"rule\":\"a\",\"key\":\"\xff\"}",
		`{"rule":"a","key":"b"}x`,
		`{"checks":[{"rule":"a"},{"key":"é","rule":"a"},{"key":"","rule":"a","cost":0},{"rule":"a","key":"xyz"}]}`,
		`{"checks":[{"rule":"a","key":"k1","cost":3},{"rule":"a","key":"k2"},{"rule":"","key":""},{"rule":"b","key":"k3","cost": -7}]}`,
		`{"checks":[{"rule":"a","key":"k1","cost":01},{"rule":"a","key":"k2","cost":1 },{"rule":"a","key":"é"},{"rule":"a","key":"k","cost":1,"cost":2}]}`,
		`{"checks":[{"rule":"a","key":"k\"x"},{"rule":"a\u0041","key":"k"},{"rule":"a","key":"k","rule":"b"},{"rule":"a","key":"k","cost":null}]}`,
		`{"rule":"api","key":"A","key":"B","cost":5}`,
		`{"checks":[{"rule":"a","key":"A","key":"B"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast, slow checkScratch
		fast.reset()
		p := fastParser{b: body, rules: &fast.rules}
		if !p.parse(&fast.body, api.MaxBatch) {
			return
		}
		slow.reset()
		if e := slow.decodeJSON(body, nil); e != nil {
			// encoding/json's path validates each check as it decodes
			// it; the fast path's are validated by shape: same answer.
			fast.reqs = p.reqs
			if _, fe := fast.shape(); fe == nil || fe.Message != e.Message {
				t.Fatalf("body %q: the fast path took it (shape: %v), encoding/json says %s", body, fe, e.Message)
			}
			return
		}
		a, b := &fast.body, &slow.body
		same := a.Rule.present == b.Rule.present && a.Rule.v == b.Rule.v &&
			a.Key.present == b.Key.present && a.Key.v == b.Key.v && a.Cost == b.Cost &&
			a.Checks.present == b.Checks.present && len(p.reqs) == len(b.Checks.items) &&
			len(a.Checks.items) == 0 // the fast path reads a batch into p.reqs
		for i := 0; same && i < len(p.reqs); i++ {
			same = p.reqs[i] == b.Checks.items[i].request()
		}
		if !same {
			t.Fatalf("body %q: fast %+v %+v, encoding/json %+v", body, *a, p.reqs, *b)
		}
	})
}

// compact takes the shape clients send and leaves anything else, as it
// found it, to item.
func TestCompactItem(t *testing.T) {
	tests := []struct {
		in   string // after the item's '{'
		ok   bool
		rule string
		key  string
		cost int64
	}{
		{`"rule":"r","key":"k"}`, true, "r", "k", 1},
		{`"rule":"r","key":"k","cost":12}`, true, "r", "k", 12},
		{`"rule":"","key":"","cost":-3}`, true, "", "", -3},
		{`"rule":"r","key":"k","cost":0}`, true, "r", "k", 0},
		{`"rule":"r","key":"k","cost":1 }`, false, "", "", 1},
		{`"rule":"r","key":"k","cost":01}`, false, "", "", 1},
		{`"rule":"r","key":"k","cost":null}`, false, "", "", 1},
		{`"rule":"r","key":"é"}`, false, "", "", 1},
		{`"rule":"r","key":"k\""}`, false, "", "", 1},
		{`"key":"k","rule":"r"}`, false, "", "", 1},
		{` "rule":"r","key":"k"}`, false, "", "", 1},
		{`"rule":"r","key":"k"`, false, "", "", 1},
	}
	for _, tt := range tests {
		p := fastParser{b: []byte(tt.in), keys: []int{0, 0}}
		q := router.Request{Cost: 1} // as items starts it
		ok := p.compact(&q)
		if ok != tt.ok {
			t.Errorf("compact(%s) = %v, want %v", tt.in, ok, tt.ok)
			continue
		}
		if !ok {
			if p.i != 0 || q != (router.Request{Cost: 1}) || p.keys[0] != 0 || p.keys[1] != 0 {
				t.Errorf("compact(%s) failed but moved to %d, request %+v, key at %v", tt.in, p.i, q, p.keys)
			}
			continue
		}
		if key := tt.in[p.keys[0]:p.keys[1]]; q.Rule != tt.rule || key != tt.key || q.Cost != tt.cost || p.i != len(tt.in) {
			t.Errorf("compact(%s) = rule %q key %q cost %d at %d, want %q %q %d at the end", tt.in, q.Rule, key, q.Cost, p.i, tt.rule, tt.key, tt.cost)
		}
	}
}
