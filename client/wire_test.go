package client

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// The bodies the Client writes decode, with encoding/json, to the checks
// it was given, for strings of every kind JSON escapes.
func TestAppendBodiesDecodeToTheirChecks(t *testing.T) {
	strs := []string{"", "k", "tenant-42", `q"uote`, `back\slash`, "tab\tnl\ncr\r", "\x00\x01\x1f\x7f", "<html>&amp;", "\u2028\u2029", "ünïcödé 🙂", strings.Repeat("x", 300)}
	for _, rule := range strs {
		for _, key := range strs {
			for _, cost := range []int64{0, 1, -1, 1 << 62, -1 << 63} {
				body := appendCheck(nil, rule, key, cost)
				var got api.CheckRequest
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatalf("appendCheck(%q, %q, %d) = %s: %v", rule, key, cost, body, err)
				}
				if got.Rule != rule || got.Key != key || got.Cost == nil || *got.Cost != cost {
					t.Fatalf("appendCheck(%q, %q, %d) decodes to %+v", rule, key, cost, got)
				}
			}
		}
	}
	one := int64(1)
	batch := []api.CheckRequest{{Rule: "r", Key: `a"b`, Cost: &one}, {Rule: "ü", Key: "\n"}, {Rule: "r", Key: ""}}
	body := appendBatch(make([]byte, 0, bodySize(batch)), batch)
	var got api.BatchRequest
	if err := json.Unmarshal(body, &got); err != nil || !reflect.DeepEqual(got.Checks, batch) {
		t.Fatalf("appendBatch = %s, decodes to %+v (%v), want %+v", body, got.Checks, err, batch)
	}
	if want, _ := json.Marshal(api.BatchRequest{Checks: batch[:1]}); string(appendBatch(nil, batch[:1])) != string(want) {
		t.Errorf("appendBatch = %s, json.Marshal = %s", appendBatch(nil, batch[:1]), want)
	}
	if len(body) > bodySize(batch) {
		t.Errorf("bodySize = %d for a body of %d bytes: the buffer grew", bodySize(batch), len(body))
	}
	if got := string(appendBatch(nil, nil)); got != `{"checks":[]}` {
		t.Errorf("appendBatch(nil) = %s", got)
	}
}

// A string that is not UTF-8 is sent as it is, for the node to refuse:
// json.Marshal turns every such string into one and the same U+FFFD.
func TestAppendStringKeepsBytesThatAreNotUTF8(t *testing.T) {
	for _, s := range []string{"\xff", "\xfe", "a\xc3", "\xed\xa0\x80"} {
		got := appendString(nil, s)
		if want := `"` + s + `"`; string(got) != want {
			t.Errorf("appendString(%q) = %q, want %q", s, got, want)
		}
		if !json.Valid(appendCheck(nil, "r", s, 1)) {
			t.Errorf("appendCheck with key %q is not JSON", s)
		}
	}
	a, _ := json.Marshal("\xff")
	b, _ := json.Marshal("\xfe")
	if string(a) != string(b) {
		t.Skip("encoding/json keeps invalid UTF-8 now; the reason for appendString is gone")
	}
}

// The node's layout is read by the fast path; anything else is left to
// encoding/json (parse reports false), never read differently.
func TestParseAnswers(t *testing.T) {
	node := `{"allowed":true,"limit":1000,"remaining":999,"reset_after_ms":1,"retry_after_ms":0,"delay_ms":0,"degraded":false}`
	want := api.Decision{Allowed: true, Limit: 1000, Remaining: 999, ResetAfterMs: 1}
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{node, true},
		{node + "\n", true},
		{node + " \r\n\t", true},
		{strings.Replace(node, "true", "false", 1), true},
		{strings.Replace(node, `"degraded":false`, `"degraded":true`, 1), true},
		{strings.Replace(node, "999", "-0", 1), true},
		{strings.Replace(node, "999", "-9223372036854775808", 1), true},
		{strings.Replace(node, "999", "9223372036854775807", 1), true},
		{strings.Replace(node, "999", "9223372036854775808", 1), false}, // overflows: encoding/json's error
		{strings.Replace(node, "999", "99999999999999999999", 1), false},
		{strings.Replace(node, "999", "0999", 1), false},
		{strings.Replace(node, "999", "999.0", 1), false},
		{strings.Replace(node, "999", "9e2", 1), false},
		{strings.Replace(node, "999", "-", 1), false},
		{strings.Replace(node, "999", `"999"`, 1), false},
		{strings.Replace(node, `,"limit"`, ` ,"limit"`, 1), false},
		{strings.Replace(node, `"delay_ms":0,`, ``, 1), false},
		{strings.Replace(node, `{`, `{"extra":1,`, 1), false},
		{node + "x", false},
		{node + "{}", false},
		{node[:len(node)-1], false},
		{"", false},
	} {
		var d api.Decision
		ok := parseDecision([]byte(tc.body), &d)
		if ok != tc.ok {
			t.Errorf("parseDecision(%s) ok = %v, want %v", tc.body, ok, tc.ok)
		}
		if !ok && d != (api.Decision{}) {
			t.Errorf("parseDecision(%s) failed and wrote %+v", tc.body, d)
		}
		if tc.body == node && d != want {
			t.Errorf("parseDecision(%s) = %+v, want %+v", tc.body, d, want)
		}
	}
	for _, tc := range []struct {
		body string
		n    int
	}{
		{`{"results":[]}`, 0},
		{`{"results":[` + node + `]}` + "\n", 1},
		{`{"results":[` + node + `,` + node + `,` + node + `]}`, 3},
	} {
		ds, ok := parseResults([]byte(tc.body), tc.n)
		if !ok || len(ds) != tc.n {
			t.Errorf("parseResults(%s) = %d results, %v; want %d", tc.body, len(ds), ok, tc.n)
		}
		for _, d := range ds {
			if d != want {
				t.Errorf("parseResults(%s): %+v, want %+v", tc.body, d, want)
			}
		}
	}
	for _, body := range []string{`{"results":[` + node + `,]}`, `{"results":[` + node + `]`, `{"results":[` + node + node + `]}`, `{"results": []}`, `{"results":null}`} {
		if _, ok := parseResults([]byte(body), 1); ok {
			t.Errorf("parseResults(%s) ok, want false", body)
		}
	}
}

// Answers in another layout still decode, through encoding/json.
func TestCheckReadsOtherLayouts(t *testing.T) {
	srv, _ := fake(t, 200, "{\n  \"remaining\": 4, \"allowed\": true, \"limit\": 5, \"future_field\": [1]\n}")
	d, err := New(srv.URL).Check(t.Context(), "r", "k", 1)
	if err != nil || d != (api.Decision{Allowed: true, Limit: 5, Remaining: 4}) {
		t.Errorf("Check = %+v, %v", d, err)
	}
	srv, _ = fake(t, 200, `{"results":[{"limit":5,"allowed":true}], "took_ms": 1}`)
	ds, err := New(srv.URL).CheckBatch(t.Context(), []api.CheckRequest{{Rule: "r", Key: "k"}})
	if err != nil || len(ds) != 1 || ds[0] != (api.Decision{Allowed: true, Limit: 5}) {
		t.Errorf("CheckBatch = %+v, %v", ds, err)
	}
}

// readBody reads everything up to the limit, whatever the reads' sizes
// and the length announced.
func TestReadBody(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	for _, hint := range []int64{-1, 0, 10, int64(len(data)), int64(len(data)) + 5, 1 << 40} {
		for _, r := range []func() io.Reader{
			func() io.Reader { return bytes.NewReader(data) },
			func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
			func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
		} {
			buf := new([]byte)
			got, err := readBody(r(), buf, hint, 1<<20)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("readBody(hint %d) = %d bytes, %v", hint, len(got), err)
			}
			if got, err := readBody(r(), buf, hint, 99); err != nil || len(got) <= 99 || !bytes.Equal(got, data[:len(got)]) {
				t.Fatalf("readBody(hint %d, limit 99) = %d bytes, %v; want more than the limit", hint, len(got), err)
			}
		}
	}
	if _, err := readBody(iotest.ErrReader(io.ErrUnexpectedEOF), new([]byte), -1, 10); err != io.ErrUnexpectedEOF {
		t.Errorf("readBody of a failing reader: %v", err)
	}
}

// FuzzParseAnswer holds the fast readers to encoding/json: whatever they
// accept, encoding/json reads the same.
func FuzzParseAnswer(f *testing.F) {
	node := `{"allowed":false,"limit":10,"remaining":0,"reset_after_ms":6000,"retry_after_ms":600,"delay_ms":0,"degraded":true}`
	for _, s := range []string{node, node + "\n", `{"results":[` + node + `,` + node + "]}\n", `{"results":[]}`, `{"allowed":true,"limit":-0,"remaining":01}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d api.Decision
		if parseDecision(b, &d) {
			var want api.Decision
			if err := json.Unmarshal(b, &want); err != nil || d != want {
				t.Fatalf("parseDecision(%q) = %+v; encoding/json: %+v, %v", b, d, want, err)
			}
		}
		if ds, ok := parseResults(b, 0); ok {
			var want api.BatchResponse
			if err := json.Unmarshal(b, &want); err != nil || len(ds) != len(want.Results) || (len(ds) > 0 && !reflect.DeepEqual(ds, want.Results)) {
				t.Fatalf("parseResults(%q) = %+v; encoding/json: %+v, %v", b, ds, want.Results, err)
			}
		}
	})
}

// FuzzAppendCheck: a body is JSON for any rule and key, and decodes to
// them when they are UTF-8.
func FuzzAppendCheck(f *testing.F) {
	f.Add("rule", "key", int64(1))
	f.Add(`"\`, "\x00\xff", int64(-1))
	f.Fuzz(func(t *testing.T, rule, key string, cost int64) {
		body := appendCheck(nil, rule, key, cost)
		if !json.Valid(body) {
			t.Fatalf("appendCheck(%q, %q, %d) = %q: not JSON", rule, key, cost, body)
		}
		if !utf8.ValidString(rule) || !utf8.ValidString(key) {
			return
		}
		var got api.CheckRequest
		if err := json.Unmarshal(body, &got); err != nil || got.Rule != rule || got.Key != key || *got.Cost != cost {
			t.Fatalf("appendCheck(%q, %q, %d) = %q decodes to %+v, %v", rule, key, cost, body, got, err)
		}
	})
}

// BenchmarkCheckBodies is what a Client spends on the bodies of one call
// (writing the request, reading the answer) with the fast path against
// encoding/json, for a single check and a batch of 100.
//
//	go test -run=^$ -bench=CheckBodies -benchmem ./client/
func BenchmarkCheckBodies(b *testing.B) {
	node := []byte(`{"allowed":true,"limit":1000,"remaining":999,"reset_after_ms":1,"retry_after_ms":0,"delay_ms":0,"degraded":false}`)
	batch := make([]api.CheckRequest, 100)
	for i := range batch {
		batch[i] = api.CheckRequest{Rule: "bench", Key: "user-" + strings.Repeat("7", i%6+1)}
	}
	answer := append([]byte(`{"results":[`), node...)
	for range 99 {
		answer = append(append(answer, ','), node...)
	}
	answer = append(answer, "]}\n"...)
	b.Run("single/fast", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendCheck(buf[:0], "bench", "user-777", 1)
			var d api.Decision
			if !parseDecision(node, &d) {
				b.Fatal("not parsed")
			}
		}
	})
	b.Run("single/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		cost := int64(1)
		for b.Loop() {
			if _, err := json.Marshal(api.CheckRequest{Rule: "bench", Key: "user-777", Cost: &cost}); err != nil {
				b.Fatal(err)
			}
			var d api.Decision
			if err := json.Unmarshal(node, &d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("batch=100/fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = appendBatch(make([]byte, 0, bodySize(batch)), batch)
			if _, ok := parseResults(answer, len(batch)); !ok {
				b.Fatal("not parsed")
			}
		}
	})
	b.Run("batch=100/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(api.BatchRequest{Checks: batch}); err != nil {
				b.Fatal(err)
			}
			var resp api.BatchResponse
			if err := json.Unmarshal(answer, &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
