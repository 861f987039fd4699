package client

import (
	"io"
	"strconv"
	"sync"

	"github.com/ringlimit/ringlimit/api"
)

// The check bodies of POST /v1/check, written and read without
// reflection: a Client sits on its caller's request path, and
// encoding/json cost it more CPU per check than the member spends
// deciding it (BenchmarkCheckBodies: Marshal and Unmarshal took 120 µs
// for a batch of 100, these 9.5 µs; a member spends 0.5–0.7 µs per
// check of such a batch over HTTP).
//
// The writers produce what json.Marshal produces for api.CheckRequest
// and api.BatchRequest, except for strings: they are written as they
// are, escaping only what JSON requires (quote, backslash, control
// characters). json.Marshal replaces bytes that are not UTF-8 with
// U+FFFD, so two different invalid keys reached one bucket; written as
// they are, the node refuses them (400 bad_request), as the data
// plane's router does.
//
// The readers take the answers in the layout the node writes them
// (router/httpapi: fields in api.Decision's order, no spaces). Anything
// else — another order, spaces, unknown fields, escapes — is left to
// encoding/json, so the fast path only ever agrees with it (see
// FuzzParseAnswer).

// appendCheck appends the body of a single check: cost is always sent,
// since cost 0 is a query and an omitted cost means 1.
func appendCheck(b []byte, rule, key string, cost int64) []byte {
	b = append(b, `{"rule":`...)
	b = appendString(b, rule)
	b = append(b, `,"key":`...)
	b = appendString(b, key)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, cost, 10)
	return append(b, '}')
}

// appendBatch appends the body of a batch; a nil Cost is omitted, as
// json.Marshal omits it.
func appendBatch(b []byte, checks []api.CheckRequest) []byte {
	b = append(b, `{"checks":[`...)
	for i := range checks {
		c := &checks[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"rule":`...)
		b = appendString(b, c.Rule)
		b = append(b, `,"key":`...)
		b = appendString(b, c.Key)
		if c.Cost != nil {
			b = append(b, `,"cost":`...)
			b = strconv.AppendInt(b, *c.Cost, 10)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// bodySize is an estimate of the bytes of a batch's body, to size it once.
func bodySize(checks []api.CheckRequest) int {
	n := len(`{"checks":[]}`)
	for i := range checks {
		n += len(checks[i].Rule) + len(checks[i].Key) + len(`{"rule":"","key":"","cost":},`) + 4
	}
	return n
}

// appendString appends s as a JSON string: its bytes as they are, with
// '"', '\\' and the control characters escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// parseDecision reads a single check's answer in the node's layout into
// d; false (d untouched) for anything else.
func parseDecision(b []byte, d *api.Decision) bool {
	p := answerParser{b: b}
	var v api.Decision
	if !p.decision(&v) || !p.end() {
		return false
	}
	*d = v
	return true
}

// parseResults reads a batch's answer in the node's layout, expecting n
// results; ok false for anything else.
func parseResults(b []byte, n int) (ds []api.Decision, ok bool) {
	p := answerParser{b: b}
	if !p.lit(`{"results":[`) {
		return nil, false
	}
	ds = make([]api.Decision, 0, n)
	if !p.lit("]") {
		for {
			var d api.Decision
			if !p.decision(&d) {
				return nil, false
			}
			ds = append(ds, d)
			if p.lit("]") {
				break
			}
			if !p.lit(",") {
				return nil, false
			}
		}
	}
	if !p.lit("}") || !p.end() {
		return nil, false
	}
	return ds, true
}

// answerParser reads the node's answers: literal runs and numbers.
type answerParser struct {
	b []byte
	i int
}

// decision reads one api.Decision object, fields in its order.
func (p *answerParser) decision(d *api.Decision) bool {
	return p.lit(`{"allowed":`) && p.bool(&d.Allowed) &&
		p.lit(`,"limit":`) && p.int(&d.Limit) &&
		p.lit(`,"remaining":`) && p.int(&d.Remaining) &&
		p.lit(`,"reset_after_ms":`) && p.int(&d.ResetAfterMs) &&
		p.lit(`,"retry_after_ms":`) && p.int(&d.RetryAfterMs) &&
		p.lit(`,"delay_ms":`) && p.int(&d.DelayMs) &&
		p.lit(`,"degraded":`) && p.bool(&d.Degraded) &&
		p.lit("}")
}

// lit consumes s if the input continues with it.
func (p *answerParser) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

func (p *answerParser) bool(v *bool) bool {
	switch {
	case p.lit("true"):
		*v = true
	case p.lit("false"):
		*v = false
	default:
		return false
	}
	return true
}

// int reads a JSON integer that fits an int64: an optional minus, then 0
// or digits not starting with 0. A fraction or exponent follows it only
// in JSON that is not the node's: the next literal fails on it.
func (p *answerParser) int(v *int64) bool {
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var u uint64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		if p.i-start == 19 { // 20 digits overflow an int64
			return false
		}
		u = u*10 + uint64(p.b[p.i]-'0')
		p.i++
	}
	switch n := p.i - start; {
	case n == 0, n > 1 && p.b[start] == '0':
		return false
	case neg && u > 1<<63, !neg && u > 1<<63-1:
		return false
	case neg:
		*v = -int64(u)
	default:
		*v = int64(u)
	}
	return true
}

// end reports whether only JSON whitespace is left.
func (p *answerParser) end() bool {
	for ; p.i < len(p.b); p.i++ {
		switch p.b[p.i] {
		case ' ', '\t', '\r', '\n':
		default:
			return false
		}
	}
	return true
}

// bodies holds the buffers answers are read into, so that a check reads
// its answer without growing a new one.
var bodies = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody is the largest buffer put back in bodies (a full batch
// answer is ~150 KiB).
const maxPooledBody = 256 << 10

// readBody reads r up to limit+1 bytes into *buf (reused, grown as
// needed), sized first by hint (the Content-Length, -1 if unknown).
func readBody(r io.Reader, buf *[]byte, hint int64, limit int) ([]byte, error) {
	b := (*buf)[:0]
	if hint > 0 && hint <= int64(limit) && int(hint) >= cap(b) {
		b = make([]byte, 0, int(hint)+1) // +1: the Read that sees EOF needs room
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > limit {
			*buf = b
			return b, nil
		}
		if err == io.EOF {
			*buf = b
			return b, nil
		}
		if err != nil {
			*buf = b
			return b, err
		}
	}
}
