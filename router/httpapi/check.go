package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/router"
)

// checkBody is the body of POST /v1/check: a single check (rule, key,
// cost) or a batch (checks). Each field remembers whether it was present,
// so the handler can tell the two shapes apart and refuse a body with
// both or neither.
type checkBody struct {
	Rule   optString `json:"rule"`
	Key    optString `json:"key"`
	Cost   optCost   `json:"cost"`
	Checks checkList `json:"checks"`
}

// checkItem is one entry of a batch, as encoding/json decodes it (the
// fast path reads entries straight into router requests).
type checkItem struct {
	Rule strictString `json:"rule"`
	Key  strictString `json:"key"`
	Cost optCost      `json:"cost"`
}

// strictString is a JSON string that must be valid UTF-8 without lone
// surrogate escapes (see optString).
type strictString string

func (s *strictString) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		// null is empty (json.Unmarshal would leave an earlier value in
		// place; a repeated field is refused before decoding anyway).
		*s = ""
		return nil
	}
	if b[0] == '"' {
		if msg := invalidJSONString(b[1 : len(b)-1]); msg != "" {
			return &bodyError{msg}
		}
	}
	return json.Unmarshal(b, (*string)(s))
}

// optString is a JSON string field that remembers its presence; null is
// present and empty. name is the field's name, for messages.
type optString struct {
	name    string
	present bool
	v       string
}

func (s *optString) UnmarshalJSON(b []byte) error {
	s.present = true
	switch {
	case string(b) == "null":
		s.v = ""
		return nil
	case b[0] != '"':
		return &bodyError{fmt.Sprintf("%s: must be a string, got %s", s.name, truncate(string(b)))}
	}
	// encoding/json would turn invalid UTF-8 and lone-surrogate escapes
	// into U+FFFD, so two different keys would share one bucket: refuse
	// them on the raw bytes.
	raw := b[1 : len(b)-1]
	if msg := invalidJSONString(raw); msg != "" {
		return &bodyError{s.name + ": " + msg}
	}
	// The decoder has checked the syntax: without escapes (and valid
	// UTF-8, checked above), the string is the bytes between the quotes.
	if bytes.IndexByte(raw, '\\') < 0 {
		s.v = string(raw)
		return nil
	}
	return json.Unmarshal(b, &s.v)
}

// optCost is the cost field: absent or null means the default, 1.
type optCost struct {
	present bool // in the body, null included
	set     bool // with a value
	v       int64
}

func (c *optCost) UnmarshalJSON(b []byte) error {
	c.present = true
	if string(b) == "null" {
		c.set, c.v = false, 0 // the default
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return &bodyError{"cost: must be an integer, got " + truncate(string(b))}
	}
	c.set, c.v = true, n
	return nil
}

func (c *optCost) value() int64 {
	if !c.set {
		return 1
	}
	return c.v
}

// request is the router request of c. Its key is valid UTF-8:
// strictString refuses anything else.
func (c *checkItem) request() router.Request {
	return router.Request{Rule: string(c.Rule), Key: string(c.Key), Cost: c.Cost.value(), KeyValid: true}
}

// checkList is the checks field of a batch. Its entries are decoded one
// by one, so that an error names its index and a batch over api.MaxBatch
// stops at entry api.MaxBatch+1.
type checkList struct {
	present bool
	items   []checkItem
}

func (l *checkList) UnmarshalJSON(b []byte) error {
	l.present = true
	if b[0] != '[' {
		return &bodyError{"checks: must be an array, got " + truncate(string(b))}
	}
	clear(l.items) // (a repeated "checks" is refused before decoding)
	l.items = l.items[:0]
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if _, err := dec.Token(); err != nil { // '['
		return err
	}
	for dec.More() {
		i := len(l.items)
		if i == api.MaxBatch {
			return &bodyError{fmt.Sprintf("checks: more than %d checks in a batch", api.MaxBatch)}
		}
		l.items = append(l.items, checkItem{})
		if err := dec.Decode(&l.items[i]); err != nil {
			return &bodyError{fmt.Sprintf("checks[%d]: %s", i, describe(err))}
		}
		// Validated as decoded, so that the error names the first bad
		// check. Was: a later check's type error came before an earlier
		// one's empty key (shape validates after decoding).
		q := l.items[i].request()
		if msg := validate(&q); msg != "" {
			return &bodyError{fmt.Sprintf("checks[%d]: %s", i, msg)}
		}
	}
	return nil
}

// bodyError is a body the decoder accepted as JSON but not as a request;
// its text is the message of the 400.
type bodyError struct{ msg string }

func (e *bodyError) Error() string { return e.msg }

// checkScratch is the pooled working memory of one POST /v1/check.
type checkScratch struct {
	body  checkBody
	reqs  []router.Request
	used  int // elements of reqs's array that may hold the last requests' strings
	out   []router.Result
	buf   []byte   // the answer
	in    []byte   // the body read
	rules []string // rule names seen, shared by the fast path
	keys  []int    // the fast path's key offsets
	kbuf  []byte   // the fast path's keys, gathered
}

// reset readies s for a request. The last one's requests stay in s.reqs's
// array until decode writes over them, and drops those it did not
// (trim): clearing them here would write every element twice.
func (s *checkScratch) reset() {
	clear(s.body.Checks.items)
	s.used = max(s.used, len(s.reqs))
	s.body = checkBody{
		Rule:   optString{name: "rule"},
		Key:    optString{name: "key"},
		Checks: checkList{items: s.body.Checks.items[:0]},
	}
	s.reqs, s.buf = s.reqs[:0], s.buf[:0]
	if cap(s.in) > maxKeptBody {
		s.in = nil
	}
	if cap(s.kbuf) > maxKeptBody {
		s.kbuf = nil
	}
}

func (h *handler) serveCheck(w http.ResponseWriter, r *http.Request) {
	s := h.scratch.Get().(*checkScratch)
	defer h.scratch.Put(s)
	s.reset()
	in, err := readBody(s.in, limitBody(w, r))
	s.in = in
	if e := h.decideCheck(r.Context(), s, in, err); e != nil {
		writeError(w, e)
		return
	}
	writeBody(w, http.StatusOK, s.buf)
}

// decideCheck decodes the check body in (readErr: the error that ended
// its read, if any), decides it under ctx and leaves the answer in
// s.buf; or returns the error answer. in is not kept.
func (h *handler) decideCheck(ctx context.Context, s *checkScratch, in []byte, readErr error) *api.Error {
	batch, e := s.decode(in, readErr)
	if e != nil {
		return e
	}
	if len(s.reqs) > 0 {
		if cap(s.out) < len(s.reqs) {
			s.out = make([]router.Result, len(s.reqs), max(len(s.reqs), 8))
		}
		out := s.out[:len(s.reqs)]
		clear(out)
		if err := h.checker.Check(ctx, s.reqs, out); err != nil {
			e := h.errorAt(http.MethodPost, endpointNames[epCheck], err)
			var ie *router.ItemError
			if errors.As(err, &ie) {
				e.Message = reason(ie.Err)
				if batch { // a single check has no index
					e.Message = "checks[" + strconv.Itoa(ie.Index) + "]: " + e.Message
				}
			}
			return e
		}
		s.out = out
	}
	if batch {
		s.buf = appendResults(s.buf, s.out[:len(s.reqs)])
	} else {
		s.buf = appendDecision(s.buf, &s.out[0])
		s.buf = append(s.buf, '\n')
	}
	return nil
}

// decode reads the check body in (readErr: the error that ended its
// read) into s.body and s.reqs and validates what needs no rule: the
// shape, names, key lengths and cost signs, so that such an entry is
// named before the router sees the batch. The router checks rules and
// costs against them. batch says which shape the body had. in is not
// kept: the requests' keys are copied out of it.
func (s *checkScratch) decode(in []byte, readErr error) (batch bool, e *api.Error) {
	defer s.trim()
	p := fastParser{b: in, rules: &s.rules, keys: s.keys[:0], kbuf: s.kbuf, reqs: s.reqs[:0]}
	ok := readErr == nil && p.parse(&s.body, api.MaxBatch)
	s.keys, s.kbuf, s.reqs = p.keys, p.kbuf, p.reqs
	if !ok {
		s.reqs = s.reqs[:0]
		if e := s.decodeJSON(in, readErr); e != nil {
			return false, e
		}
	}
	return s.shape()
}

// trim drops the strings of the last requests that this one's did not
// replace, so that a pooled scratch keeps no more than its last
// request's.
func (s *checkScratch) trim() {
	if s.used > len(s.reqs) {
		clear(s.reqs[len(s.reqs):s.used])
	}
	s.used = len(s.reqs)
}

// decodeJSON decodes the body with encoding/json into a fresh s.body:
// the general path, for what the fast one does not take. readErr is the
// error that ended the read after in (a body over the limit).
func (s *checkScratch) decodeJSON(in []byte, readErr error) *api.Error {
	items := s.body.Checks.items
	clear(items)
	s.body = checkBody{Rule: optString{name: "rule"}, Key: optString{name: "key"}, Checks: checkList{items: items[:0]}}
	// Names first, so that a repeated field is named as such rather
	// than by what its last value fails (a body not read whole fails
	// decoding, 413).
	if readErr == nil {
		if err := exactNames(in, checkNames); err != nil {
			return decodeError(err)
		}
	}
	var r io.Reader = bytes.NewReader(in)
	if readErr != nil {
		r = io.MultiReader(r, errReader{readErr})
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.body); err != nil {
		return decodeError(err)
	}
	return atEOF(dec)
}

// checkNames are the field names of a check body and of its checks.
var checkNames = []string{"rule", "key", "cost", "checks"}

// shape tells the two shapes of a decoded body apart and validates its
// checks, which it leaves in s.reqs. The fast path has read a batch's
// checks into s.reqs already; encoding/json's are in s.body.
func (s *checkScratch) shape() (batch bool, e *api.Error) {
	b := &s.body
	single := b.Rule.present || b.Key.present || b.Cost.present
	switch {
	case b.Checks.present && single:
		return false, badRequest(`body has both "checks" and a single check's fields; send one or the other`)
	case b.Checks.present:
		for i := range b.Checks.items {
			s.reqs = append(s.reqs, b.Checks.items[i].request())
		}
		for i := range s.reqs {
			if msg := validate(&s.reqs[i]); msg != "" {
				return true, badRequest(fmt.Sprintf("checks[%d]: %s", i, msg))
			}
		}
		return true, nil
	case single:
		q := router.Request{Rule: b.Rule.v, Key: b.Key.v, Cost: b.Cost.value(), KeyValid: true} // optString refuses invalid UTF-8
		if msg := validate(&q); msg != "" {
			return false, badRequest(msg)
		}
		s.reqs = append(s.reqs, q)
		return false, nil
	}
	return false, badRequest(`body is neither a check {"rule", "key", "cost"} nor a batch {"checks": [...]}`)
}

// validate returns what is wrong with q that no rule can make right, or "".
// The cost's upper bound depends on the rule: the router checks it.
func validate(q *router.Request) string {
	switch {
	case q.Rule == "":
		return "rule is empty"
	case q.Key == "":
		return "key is empty"
	case len(q.Key) > api.MaxKeyLen:
		return fmt.Sprintf("key is %d bytes, at most %d", len(q.Key), api.MaxKeyLen)
	case q.Cost < 0:
		return fmt.Sprintf("cost must be ≥ 0, got %d", q.Cost)
	}
	return ""
}

func badRequest(msg string) *api.Error {
	return &api.Error{Status: http.StatusBadRequest, Code: api.CodeBadRequest, Message: msg}
}

// decodeError is the answer to a body that does not decode.
func decodeError(err error) *api.Error {
	if e := tooLarge(err); e != nil {
		return e
	}
	var te *json.UnmarshalTypeError
	switch {
	case err == io.EOF:
		return badRequest("empty body: want a JSON object")
	case errors.As(err, &te) && te.Field == "":
		return badRequest("body must be a JSON object, got " + te.Value)
	}
	return badRequest(describe(err))
}

// atEOF answers a body with more after its JSON value.
func atEOF(dec *json.Decoder) *api.Error {
	if _, err := dec.Token(); err != io.EOF {
		if e := tooLarge(err); e != nil {
			return e
		}
		return badRequest("malformed JSON: data after the body's JSON value")
	}
	return nil
}

// describe says what is wrong with a JSON body in the API's terms, not
// Go's.
func describe(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var be *bodyError
	switch {
	case errors.As(err, &be):
		return be.msg
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: unexpected end of body"
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("%s: must be %s, got %s", te.Field, kindOf(te.Type), te.Value)
		}
		return fmt.Sprintf("must be %s, got %s", kindOf(te.Type), te.Value)
	}
	msg := err.Error()
	if len(msg) > 6 && msg[:6] == "json: " {
		msg = msg[6:] // unknown field "x"
	}
	return msg
}

// kindOf names the JSON kind a Go type decodes from.
func kindOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	}
	return "a " + t.Kind().String()
}

// millis is d in whole milliseconds, rounded up; 0 or less is 0.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Millisecond) + 1
}

// appendResults appends the answer to a batch, {"results": [...]} and a
// newline. A result equal to the one before it (fresh keys of one rule
// mostly get the same answer) copies that one's bytes.
func appendResults(b []byte, out []router.Result) []byte {
	b = append(b, `{"results":[`...)
	start, end := 0, 0 // the bytes of out[i-1]
	for i := range out {
		if i > 0 {
			b = append(b, ',')
			if out[i] == out[i-1] {
				n := len(b)
				b = append(b, b[start:end]...)
				start, end = n, len(b)
				continue
			}
		}
		start = len(b)
		b = appendDecision(b, &out[i])
		end = len(b)
	}
	return append(b, "]}\n"...)
}

// appendDecision appends the api.Decision of res as JSON: the same bytes
// json.Marshal writes for it, without reflection.
func appendDecision(b []byte, res *router.Result) []byte {
	if res.Allowed {
		b = append(b, `{"allowed":true,"limit":`...)
	} else {
		b = append(b, `{"allowed":false,"limit":`...)
	}
	b = appendInt(b, res.Limit)
	b = append(b, `,"remaining":`...)
	b = appendInt(b, res.Remaining)
	b = append(b, `,"reset_after_ms":`...)
	b = appendInt(b, millis(res.ResetAfter))
	b = append(b, `,"retry_after_ms":`...)
	b = appendInt(b, millis(res.RetryAfter))
	b = append(b, `,"delay_ms":`...)
	b = appendInt(b, millis(res.Delay))
	if res.Degraded {
		return append(b, `,"degraded":true}`...)
	}
	return append(b, `,"degraded":false}`...)
}

// appendInt is strconv.AppendInt(b, n, 10), quicker for the small
// non-negative numbers of a decision: two digits at a time, no call.
func appendInt(b []byte, n int64) []byte {
	switch {
	case n < 0:
		return strconv.AppendInt(b, n, 10)
	case n < 10:
		return append(b, byte('0'+n))
	}
	var d [20]byte
	i := len(d)
	u := uint64(n)
	for u >= 100 {
		q := u / 100
		r := (u - q*100) * 2
		i -= 2
		d[i], d[i+1] = digitPairs[r], digitPairs[r+1]
		u = q
	}
	if u >= 10 {
		i -= 2
		d[i], d[i+1] = digitPairs[u*2], digitPairs[u*2+1]
	} else {
		i--
		d[i] = byte('0' + u)
	}
	return append(b, d[i:]...)
}

// digitPairs is "00" through "99".
const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"
