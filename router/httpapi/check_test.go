package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
)

func TestCheckSingle(t *testing.T) {
	e := newEnv(t, "")
	w := e.do("POST", "/v1/check", `{"rule": "default", "key": "tenant-42", "cost": 1}`)
	var d api.Decision
	decodeOK(t, w, &d)
	want := api.Decision{Allowed: true, Limit: 200, Remaining: 199}
	if d != want {
		t.Errorf("decision = %+v, want %+v", d, want)
	}
	if got := e.c.Calls(); len(got) != 1 || !reflect.DeepEqual(got[0], []router.Request{{Rule: "default", Key: "tenant-42", Cost: 1, KeyValid: true}}) {
		t.Errorf("checker calls = %+v", got)
	}
}

func TestCheckDenied(t *testing.T) {
	e := newEnv(t, "")
	e.c.decide = func(q router.Request) router.Result {
		return router.Result{Decision: limiter.Decision{Allowed: false, Limit: 5, RetryAfter: 2 * time.Second, ResetAfter: 3 * time.Second}}
	}
	var d api.Decision
	decodeOK(t, e.do("POST", "/v1/check", `{"rule":"small","key":"k"}`), &d)
	want := api.Decision{Allowed: false, Limit: 5, ResetAfterMs: 3000, RetryAfterMs: 2000}
	if d != want {
		t.Errorf("decision = %+v, want %+v", d, want)
	}
}

// Durations become whole milliseconds, rounded up; 0 stays 0.
func TestCheckMillisRoundUp(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{0, 0},
		{-time.Second, 0}, // never negative
		{1, 1},
		{time.Millisecond - 1, 1},
		{time.Millisecond, 1},
		{time.Millisecond + 1, 2},
		{1500 * time.Microsecond, 2},
		{time.Second, 1000},
		{time.Second + 1, 1001},
		{time.Duration(1<<63 - 1), (1<<63-1)/1_000_000 + 1},
	}
	e := newEnv(t, "")
	for _, tt := range tests {
		e.c.decide = func(router.Request) router.Result {
			return router.Result{Decision: limiter.Decision{ResetAfter: tt.d, RetryAfter: tt.d, Delay: tt.d}, Degraded: true}
		}
		var d api.Decision
		decodeOK(t, e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`), &d)
		if d.ResetAfterMs != tt.want || d.RetryAfterMs != tt.want || d.DelayMs != tt.want || !d.Degraded {
			t.Errorf("duration %v → %+v, want %d ms in each", tt.d, d, tt.want)
		}
	}
}

// appendDecision writes what json.Marshal writes for the api.Decision.
func TestAppendDecisionMatchesMarshal(t *testing.T) {
	for _, res := range []router.Result{
		{},
		{Decision: limiter.Decision{Allowed: true, Limit: 1 << 40, Remaining: -3, ResetAfter: 7, RetryAfter: time.Hour, Delay: 3 * time.Millisecond}, Degraded: true},
		{Decision: limiter.Decision{Allowed: true, Limit: 1000, Remaining: 999, ResetAfter: time.Millisecond}},
		{Decision: limiter.Decision{Limit: math.MaxInt64, Remaining: math.MinInt64, RetryAfter: math.MaxInt64, Delay: 10 * time.Millisecond}},
	} {
		want, err := json.Marshal(api.Decision{
			Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining,
			ResetAfterMs: millis(res.ResetAfter), RetryAfterMs: millis(res.RetryAfter), DelayMs: millis(res.Delay), Degraded: res.Degraded,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendDecision(nil, &res); string(got) != string(want) {
			t.Errorf("appendDecision = %s, want %s", got, want)
		}
	}
}

// appendResults writes what json.Marshal writes for the
// api.BatchResponse, and a newline, whether results repeat or not.
func TestAppendResultsMatchesMarshal(t *testing.T) {
	a := router.Result{Decision: limiter.Decision{Allowed: true, Limit: 1000, Remaining: 999, ResetAfter: time.Millisecond}}
	b := router.Result{Decision: limiter.Decision{Limit: 1000, RetryAfter: 3 * time.Millisecond}}
	c := router.Result{Decision: a.Decision, Degraded: true}
	for _, out := range [][]router.Result{
		{},
		{a},
		{a, a},
		{a, a, a, b, b, a, c, c, a},
		{b, a, a, c},
	} {
		var want api.BatchResponse
		want.Results = []api.Decision{}
		for _, r := range out {
			want.Results = append(want.Results, api.Decision{
				Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
				ResetAfterMs: millis(r.ResetAfter), RetryAfterMs: millis(r.RetryAfter), DelayMs: millis(r.Delay), Degraded: r.Degraded,
			})
		}
		w, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendResults([]byte("x"), out); string(got) != "x"+string(w)+"\n" {
			t.Errorf("appendResults(%v) = %s, want x%s", out, got, w)
		}
	}
}

// appendInt writes what strconv.AppendInt writes, at every digit count
// and sign.
func TestAppendInt(t *testing.T) {
	check := func(n int64) {
		t.Helper()
		if got, want := string(appendInt([]byte("x"), n)), "x"+strconv.FormatInt(n, 10); got != want {
			t.Errorf("appendInt(%d) = %s, want %s", n, got, want)
		}
	}
	for _, n := range []int64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1001, -1, -10, math.MaxInt64, math.MinInt64, math.MaxInt64 - 1} {
		check(n)
	}
	for p := int64(1); p > 0 && p <= math.MaxInt64/10; p *= 10 {
		check(p - 1)
		check(p)
		check(p + 1)
		check(-p)
	}
	for n := int64(0); n < 100_000; n += 7 {
		check(n)
	}
}

func TestCheckCost(t *testing.T) {
	tests := []struct {
		body string
		want int64
	}{
		{`{"rule":"small","key":"k"}`, 1},
		{`{"rule":"small","key":"k","cost":null}`, 1},
		{`{"rule":"small","key":"k","cost":0}`, 0},
		{`{"rule":"small","key":"k","cost":5}`, 5}, // = capacity
		{`{"checks":[{"rule":"small","key":"k"}]}`, 1},
		{`{"checks":[{"rule":"small","key":"k","cost":0}]}`, 0},
	}
	for _, tt := range tests {
		e := newEnv(t, "")
		w := e.do("POST", "/v1/check", tt.body)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tt.body, w.Code, w.Body)
		}
		calls := e.c.Calls()
		if len(calls) != 1 || len(calls[0]) != 1 || calls[0][0].Cost != tt.want {
			t.Errorf("%s: checker got %+v, want cost %d", tt.body, calls, tt.want)
		}
	}
}

// Every 400/404/413 of POST /v1/check (the Errors table's check rows).
func TestCheckErrors(t *testing.T) {
	long := strings.Repeat("k", api.MaxKeyLen+1)
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		msg    string // a prefix of the message
	}{
		{"empty body", ``, 400, api.CodeBadRequest, "empty body"},
		{"malformed", `{"rule":`, 400, api.CodeBadRequest, "malformed JSON"},
		{"not json", `rule=a`, 400, api.CodeBadRequest, "malformed JSON"},
		{"trailing object", `{"rule":"default","key":"k"} {}`, 400, api.CodeBadRequest, "malformed JSON: data after"},
		{"trailing brace", `{"rule":"default","key":"k"}}`, 400, api.CodeBadRequest, "malformed JSON: data after"},
		{"array body", `[{"rule":"default","key":"k"}]`, 400, api.CodeBadRequest, "body must be a JSON object, got array"},
		{"string body", `"x"`, 400, api.CodeBadRequest, "body must be a JSON object"},
		{"unknown field", `{"rule":"default","key":"k","tenant":1}`, 400, api.CodeBadRequest, `unknown field "tenant"`},
		// encoding/json matches names case-insensitively; the contract
		// does not (a proxy reading "key" saw "a" where the member read "b").
		{"field in another case", `{"rule":"default","Key":"k"}`, 400, api.CodeBadRequest, `unknown field "Key": field names are matched exactly (want "key")`},
		{"field twice, cases differ", `{"rule":"default","key":"a","KEY":"b"}`, 400, api.CodeBadRequest, `unknown field "KEY"`},
		{"entry field in another case", `{"checks":[{"rule":"default","key":"k","Cost":2}]}`, 400, api.CodeBadRequest, `checks[0]: unknown field "Cost"`},
		{"neither", `{}`, 400, api.CodeBadRequest, "body is neither"},
		{"null", `null`, 400, api.CodeBadRequest, "body is neither"},
		{"both", `{"rule":"default","key":"k","checks":[]}`, 400, api.CodeBadRequest, "body has both"},
		{"both by cost", `{"cost":1,"checks":[{"rule":"default","key":"k"}]}`, 400, api.CodeBadRequest, "body has both"},
		{"rule not string", `{"rule":1,"key":"k"}`, 400, api.CodeBadRequest, "rule: must be a string"},
		{"key not string", `{"rule":"default","key":{}}`, 400, api.CodeBadRequest, "key: must be a string"},
		{"empty rule", `{"rule":"","key":"k"}`, 400, api.CodeBadRequest, "rule is empty"},
		{"empty key", `{"rule":"default","key":""}`, 400, api.CodeBadRequest, "key is empty"},
		{"missing key", `{"rule":"default"}`, 400, api.CodeBadRequest, "key is empty"},
		{"null key", `{"rule":"default","key":null}`, 400, api.CodeBadRequest, "key is empty"},
		{"long key", `{"rule":"default","key":"` + long + `"}`, 400, api.CodeBadRequest, "key is 1025 bytes, at most 1024"},
		{"negative cost", `{"rule":"default","key":"k","cost":-1}`, 400, api.CodeBadRequest, "cost must be ≥ 0, got -1"},
		{"fractional cost", `{"rule":"default","key":"k","cost":1.5}`, 400, api.CodeBadRequest, "cost: must be an integer"},
		{"exponent cost", `{"rule":"default","key":"k","cost":1e2}`, 400, api.CodeBadRequest, "cost: must be an integer"},
		{"string cost", `{"rule":"default","key":"k","cost":"1"}`, 400, api.CodeBadRequest, "cost: must be an integer"},
		{"huge cost", `{"rule":"default","key":"k","cost":99999999999999999999}`, 400, api.CodeBadRequest, "cost: must be an integer"},
		{"cost over capacity", `{"rule":"small","key":"k","cost":6}`, 400, api.CodeBadRequest, "limiter: cost out of range"},
		{"unknown rule", `{"rule":"nope","key":"k"}`, 404, api.CodeUnknownRule, `unknown rule "nope"`},
		{"checks not array", `{"checks":{}}`, 400, api.CodeBadRequest, "checks: must be an array"},
		{"checks null", `{"checks":null}`, 400, api.CodeBadRequest, "checks: must be an array"},
		{"entry not object", `{"checks":[{"rule":"default","key":"k"},3]}`, 400, api.CodeBadRequest, "checks[1]: must be an object"},
		{"entry unknown field", `{"checks":[{"rule":"default","key":"k","x":1}]}`, 400, api.CodeBadRequest, `checks[0]: unknown field "x"`},
		{"first bad entry named", `{"checks":[{"rule":"default","key":""},{"rule":"default","key":7}]}`, 400, api.CodeBadRequest, "checks[0]: key is empty"},
		{"entry bad type", `{"checks":[{"rule":"default","key":"k"},{"rule":"default","key":7}]}`, 400, api.CodeBadRequest, "checks[1]: key: must be a string, got number"},
		{"entry bad cost", `{"checks":[{"rule":"default","key":"k","cost":0.5}]}`, 400, api.CodeBadRequest, "checks[0]: cost: must be an integer"},
		{"batch over 1000", batchBody(api.MaxBatch+1, -1, ""), 400, api.CodeBadRequest, "checks: more than 1000 checks"},
		{"body over 1 MiB", `{"rule":"default","key":"` + strings.Repeat("k", api.MaxBodySize) + `"}`, 413, api.CodeTooLarge, "request body over 1048576 bytes"},
		{"trailing over 1 MiB", `{"rule":"default","key":"k"}` + strings.Repeat(" ", api.MaxBodySize), 413, api.CodeTooLarge, "request body over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "")
			got := apiError(t, e.do("POST", "/v1/check", tt.body), tt.status, tt.code)
			if !strings.HasPrefix(got.Message, tt.msg) {
				t.Errorf("message = %q, want prefix %q", got.Message, tt.msg)
			}
			if calls := e.c.Calls(); len(calls) != 0 {
				t.Errorf("something was decided: %+v", calls)
			}
		})
	}
}

func TestCheckKeyAtLimit(t *testing.T) {
	e := newEnv(t, "")
	key := strings.Repeat("é", api.MaxKeyLen/2) // 1024 bytes
	var d api.Decision
	decodeOK(t, e.do("POST", "/v1/check", `{"rule":"default","key":"`+key+`"}`), &d)
	if calls := e.c.Calls(); len(calls) != 1 || calls[0][0].Key != key {
		t.Errorf("checker got %+v", calls)
	}
	// An escaped key is decoded before it is measured.
	decodeOK(t, e.do("POST", "/v1/check", `{"rule":"default","key":"a\"b\u00e9"}`), &d)
	if calls := e.c.Calls(); calls[1][0].Key != `a"bé` {
		t.Errorf("escaped key = %q", calls[1][0].Key)
	}
}

// batchBody is a batch of n checks of rule "default"; the entry at bad
// (if ≥ 0) is replaced by badEntry.
func batchBody(n, bad int, badEntry string) string {
	var b strings.Builder
	b.WriteString(`{"checks":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		if i == bad {
			b.WriteString(badEntry)
			continue
		}
		fmt.Fprintf(&b, `{"rule":"default","key":"k%d","cost":%d}`, i, i%3)
	}
	b.WriteString(`]}`)
	return b.String()
}

func TestCheckBatch(t *testing.T) {
	e := newEnv(t, "")
	var resp api.BatchResponse
	decodeOK(t, e.do("POST", "/v1/check", `{"checks":[
		{"rule":"default","key":"a","cost":3},
		{"rule":"small","key":"b"},
		{"rule":"small","key":"c","cost":0}]}`), &resp)
	want := []api.Decision{
		{Allowed: true, Limit: 200, Remaining: 197},
		{Allowed: true, Limit: 5, Remaining: 4},
		{Allowed: true, Limit: 5, Remaining: 5},
	}
	if !reflect.DeepEqual(resp.Results, want) {
		t.Errorf("results = %+v, want %+v", resp.Results, want)
	}
}

func TestCheckBatchSizes(t *testing.T) {
	e := newEnv(t, "")
	var resp api.BatchResponse
	decodeOK(t, e.do("POST", "/v1/check", `{"checks":[]}`), &resp)
	if resp.Results == nil || len(resp.Results) != 0 || len(e.c.Calls()) != 0 {
		t.Errorf("empty batch: results %#v, calls %d", resp.Results, len(e.c.Calls()))
	}
	decodeOK(t, e.do("POST", "/v1/check", batchBody(api.MaxBatch, -1, "")), &resp)
	if len(resp.Results) != api.MaxBatch {
		t.Fatalf("%d results for %d checks", len(resp.Results), api.MaxBatch)
	}
	for i, d := range resp.Results {
		if d.Remaining != 200-int64(i%3) {
			t.Fatalf("results[%d] = %+v: out of order", i, d)
		}
	}
	apiError(t, e.do("POST", "/v1/check", batchBody(api.MaxBatch+1, -1, "")), 400, api.CodeBadRequest)
	if n := len(e.c.Calls()); n != 1 {
		t.Errorf("%d checker calls, want 1", n)
	}
}

// A batch with an invalid entry is refused whole, naming the entry, with
// the status it would get alone; nothing is decided.
func TestCheckBatchAllOrNothing(t *testing.T) {
	tests := []struct {
		entry  string
		status int
		code   string
		msg    string
	}{
		{`{"rule":"nope","key":"k"}`, 404, api.CodeUnknownRule, `checks[3]: unknown rule "nope"`},
		{`{"rule":"small","key":"k","cost":6}`, 400, api.CodeBadRequest, `checks[3]: limiter: cost out of range`},
		{`{"rule":"default","key":""}`, 400, api.CodeBadRequest, `checks[3]: key is empty`},
		{`{"rule":"default","key":"` + strings.Repeat("x", 1025) + `"}`, 400, api.CodeBadRequest, `checks[3]: key is 1025 bytes`},
		{`{"rule":"default","key":"k","cost":-2}`, 400, api.CodeBadRequest, `checks[3]: cost must be ≥ 0`},
		{`{"rule":"","key":"k"}`, 400, api.CodeBadRequest, `checks[3]: rule is empty`},
		{`{"rule":"default","key":"k","weight":2}`, 400, api.CodeBadRequest, `checks[3]: unknown field "weight"`},
	}
	for _, tt := range tests {
		e := newEnv(t, "")
		got := apiError(t, e.do("POST", "/v1/check", batchBody(6, 3, tt.entry)), tt.status, tt.code)
		if !strings.HasPrefix(got.Message, tt.msg) {
			t.Errorf("%s: message = %q, want prefix %q", tt.entry, got.Message, tt.msg)
		}
		if calls := e.c.Calls(); len(calls) != 0 {
			t.Errorf("%s: something was decided: %+v", tt.entry, calls)
		}
	}
}

// A single check's error names no index.
func TestCheckSingleItemErrorHasNoIndex(t *testing.T) {
	e := newEnv(t, "")
	got := apiError(t, e.do("POST", "/v1/check", `{"rule":"nope","key":"k"}`), 404, api.CodeUnknownRule)
	if got.Message != `unknown rule "nope"` {
		t.Errorf("message = %q", got.Message)
	}
}

func TestCheckCheckerErrors(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("%w: no cluster view yet", api.ErrUnavailable), 503, api.CodeUnavailable},
		{&router.ItemError{Index: 0, Err: fmt.Errorf("%w: no ring", api.ErrUnavailable)}, 503, api.CodeUnavailable},
		{context.DeadlineExceeded, 503, api.CodeUnavailable},
		{errors.New("disk on fire"), 500, api.CodeInternal},
	}
	for _, tt := range tests {
		e := newEnv(t, "")
		e.c.err = tt.err
		got := apiError(t, e.do("POST", "/v1/check", `{"rule":"default","key":"k"}`), tt.status, tt.code)
		if tt.status == 500 {
			if strings.Contains(got.Message, "fire") {
				t.Errorf("500 leaks the error: %q", got.Message)
			}
			if !strings.Contains(e.logs.String(), "disk on fire") {
				t.Errorf("unexpected error not logged: %s", e.logs)
			}
		}
	}
}

func TestCheckPassesRequestContext(t *testing.T) {
	type key struct{}
	e := newEnv(t, "")
	e.c.ctxKey = key{}
	req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"rule":"default","key":"k"}`))
	req = req.WithContext(context.WithValue(req.Context(), key{}, 1))
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	if w.Code != 200 {
		t.Errorf("status %d: %s", w.Code, w.Body)
	}
}

// Pooled scratch memory never leaks one request's data into another's.
func TestCheckConcurrent(t *testing.T) {
	e := newEnv(t, "")
	e.c.decide = func(q router.Request) router.Result {
		return router.Result{Decision: limiter.Decision{Allowed: true, Remaining: int64(len(q.Key)), Limit: q.Cost}}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				n := 1 + (g*7+i)%20
				var b strings.Builder
				b.WriteString(`{"checks":[`)
				for j := range n {
					if j > 0 {
						b.WriteByte(',')
					}
					if j%2 == 0 {
						fmt.Fprintf(&b, `{"rule":"default","key":%q}`, strings.Repeat("x", j+g+1))
					} else {
						fmt.Fprintf(&b, `{"rule":"default","key":%q,"cost":%d}`, strings.Repeat("x", j+g+1), j)
					}
				}
				b.WriteString(`]}`)
				w := e.do("POST", "/v1/check", b.String())
				var resp api.BatchResponse
				if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || len(resp.Results) != n {
					t.Errorf("batch of %d: %d %s", n, w.Code, w.Body)
					return
				}
				for j, d := range resp.Results {
					cost := int64(1)
					if j%2 == 1 {
						cost = int64(j)
					}
					if d.Remaining != int64(j+g+1) || d.Limit != cost {
						t.Errorf("results[%d] = %+v, want remaining %d, limit %d", j, d, j+g+1, cost)
						return
					}
				}
				var d api.Decision
				w = e.do("POST", "/v1/check", fmt.Sprintf(`{"rule":"default","key":%q}`, strings.Repeat("y", n)))
				if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil || d.Remaining != int64(n) || d.Limit != 1 {
					t.Errorf("single after batch: %s", w.Body)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkCheckBatch is a batch of 100 through the handler (fake
// checker): the HTTP layer's own cost and allocations per batch.
func BenchmarkCheckBatch(b *testing.B) {
	e := newEnv(b, "")
	var sb strings.Builder
	sb.WriteString(`{"checks":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"rule":"default","key":"tenant-%d","cost":1}`, i)
	}
	sb.WriteString(`]}`)
	body := sb.String()
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Body)
		}
	}
}

func BenchmarkCheckSingle(b *testing.B) {
	e := newEnv(b, "")
	body := `{"rule":"default","key":"tenant-42","cost":1}`
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Body)
		}
	}
}

// A body declared over the limit is refused without reading it; one with
// no declared length is cut at the limit; a hand-built Request without a
// body is an empty body.
func TestCheckBodyLimit(t *testing.T) {
	e := newEnv(t, "")
	req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"rule":"default","key":"k"}`))
	req.ContentLength = api.MaxBodySize + 1
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	apiError(t, w, 413, api.CodeTooLarge)

	big := `{"rule":"default","key":"k"}` + strings.Repeat("\n", api.MaxBodySize-28)
	req = httptest.NewRequest("POST", "/v1/check", strings.NewReader(big))
	req.ContentLength = -1
	w = httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	if w.Code != 200 {
		t.Errorf("body of exactly %d bytes: %d %s", len(big), w.Code, w.Body)
	}
	req = httptest.NewRequest("POST", "/v1/check", strings.NewReader(big+" "))
	req.ContentLength = -1
	w = httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	apiError(t, w, 413, api.CodeTooLarge)

	req = httptest.NewRequest("POST", "/v1/check", nil)
	req.Body = nil
	w = httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	apiError(t, w, 400, api.CodeBadRequest)
}

// Answers carry their length, batches included (net/http would send an
// answer over 2 KiB chunked without it), and the keys of a batch reach
// the checker intact.
func TestCheckAnswerLength(t *testing.T) {
	e := newEnv(t, "")
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	for _, n := range []int{1, 100} {
		var sb strings.Builder
		sb.WriteString(`{"checks":[`)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"rule":"default","key":"tenant-%d-%s"}`, i, strings.Repeat("k", i))
		}
		sb.WriteString(`]}`)
		resp, err := srv.Client().Post(srv.URL+"/v1/check", "application/json", strings.NewReader(sb.String()))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("batch of %d: %d %s %v", n, resp.StatusCode, body, err)
		}
		if resp.ContentLength != int64(len(body)) || len(resp.TransferEncoding) > 0 {
			t.Errorf("batch of %d: Content-Length %d, Transfer-Encoding %q, body of %d bytes", n, resp.ContentLength, resp.TransferEncoding, len(body))
		}
		var got api.BatchResponse
		if err := json.Unmarshal(body, &got); err != nil || len(got.Results) != n {
			t.Fatalf("batch of %d: %s", n, body)
		}
	}
	calls := e.c.Calls()
	if len(calls) != 2 || len(calls[1]) != 100 {
		t.Fatalf("%d calls", len(calls))
	}
	for i, q := range calls[1] {
		if want := fmt.Sprintf("tenant-%d-%s", i, strings.Repeat("k", i)); q.Key != want || q.Rule != "default" || q.Cost != 1 || !q.KeyValid {
			t.Errorf("check %d = %+v, want key %q", i, q, want)
		}
	}
}

// BenchmarkDecodeBatch is the decoding of a batch of 100 checks alone
// (fast path, into router requests): its cost per check, without the
// handler around it.
func BenchmarkDecodeBatch(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"checks":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"rule":"bench","key":"key-%d","cost":1}`, 10_000+i)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	var s checkScratch
	var rd bytes.Reader
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		s.reset()
		rd.Reset(body)
		in, err := readBody(s.in, &rd)
		s.in = in
		if _, e := s.decode(in, err); e != nil || len(s.reqs) != 100 {
			b.Fatal(e)
		}
	}
}

// A pooled scratch keeps no more of an earlier request's strings than
// the last request wrote over: decode drops the rest.
func TestCheckScratchDropsOldRequests(t *testing.T) {
	var s checkScratch
	for _, tt := range []struct {
		body string
		n    int
	}{
		{batchBody(5, -1, ""), 5},
		{`{"checks":[{"rule":"default","key":"a"},{"rule":"default","key":"b"}]}`, 2},
		{`{"rule":"default","key":"k"}`, 1},
		{batchBody(3, 1, `{"rule":"default","key":"é\u0041"}`), 3}, // the fast path gives up half-way
		{`{"checks":[{"rule":"default","key":""}]}`, 1},            // invalid: refused
		{`{`, 0},
	} {
		s.reset()
		_, _ = s.decode([]byte(tt.body), nil)
		if len(s.reqs) != tt.n {
			t.Errorf("%s: %d requests, want %d", tt.body, len(s.reqs), tt.n)
		}
		for i, q := range s.reqs[len(s.reqs):cap(s.reqs)] {
			if q != (router.Request{}) {
				t.Errorf("%s: after the %d requests, element %d of the array still holds %+v", tt.body, len(s.reqs), len(s.reqs)+i, q)
			}
		}
	}
}

// A field given twice in one object is refused, naming it, in a single
// check, in each entry of a batch and at the top of a batch: a proxy or
// log reading the first "key" would see another key than the one
// limited. Was: answered 200, the last value limited ("key":"B" charged
// where a reader of the first saw "A"), and a trailing null read as null.
func TestRepeatedFieldIsRefused(t *testing.T) {
	for _, tc := range []struct{ body, msg string }{
		{`{"rule":"default","key":"A","key":"B","cost":5}`, `repeated field "key"`},
		{`{"rule":"default","key":"k","cost":5,"cost":null}`, `repeated field "cost"`},
		{`{"rule":"default","key":"k","cost":1,"cost":1}`, `repeated field "cost"`},
		{`{"rule":"default","rule":null,"key":"k"}`, `repeated field "rule"`},
		{`{"rule":"default","key":"A","k\u0065y":"B"}`, `repeated field "key"`}, // an escape names the same field
		{`{"rule":"default","key":"A","key":""}`, `repeated field "key"`},       // named as such, not as an empty key
		{`{"checks":[{"rule":"default","key":"A","key":"B"}]}`, `checks[0]: repeated field "key"`},
		{`{"checks":[{"rule":"default","key":"a"},{"rule":"default","key":"b"},{"rule":"default","key":"c","cost":5,"cost":null}]}`, `checks[2]: repeated field "cost"`},
		{`{"checks":[{"rule":"default","key":"k","key":null}]}`, `checks[0]: repeated field "key"`},
		{`{"checks":[{"rule":"default","key":"a"}],"checks":[{"rule":"default","key":"b"}]}`, `repeated field "checks"`},
	} {
		e := newEnv(t, "")
		got := apiError(t, e.do("POST", "/v1/check", tc.body), 400, api.CodeBadRequest)
		if !strings.HasPrefix(got.Message, tc.msg) {
			t.Errorf("%s: message %q, want prefix %q", tc.body, got.Message, tc.msg)
		}
		if calls := e.c.Calls(); len(calls) != 0 {
			t.Errorf("%s: refused, yet the checker was asked %+v", tc.body, calls)
		}
	}
	// The same name in two objects is no repetition.
	e := newEnv(t, "")
	if w := e.do("POST", "/v1/check", `{"checks":[{"rule":"default","key":"a"},{"rule":"default","key":"b"}]}`); w.Code != 200 {
		t.Errorf("two entries: %d %s, want 200", w.Code, w.Body)
	}
}
