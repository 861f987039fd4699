package httpapi

import (
	"io"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/router"
)

// The fast path of POST /v1/check: a body in the common shape is decoded
// without encoding/json, which took two thirds of the handler's CPU
// (reflection, a Decoder per batch and per entry). Anything else falls
// back to encoding/json, which gives the contract's error messages.

// maxKeptBody is the largest read buffer a pooled scratch keeps.
const maxKeptBody = 64 << 10

// readBody reads all of r into buf's array (grown as needed) and returns
// what it read, with the error that stopped it (nil at EOF).
func readBody(buf []byte, r io.Reader) ([]byte, error) {
	buf = buf[:0]
	if cap(buf) == 0 {
		buf = make([]byte, 0, 512)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// fastParser reads the common shape of a check body: objects with the
// exact lower-case field names, strings without escapes or control
// characters and in valid UTF-8 (invalid UTF-8 is refused by the
// general path, with its message), integer costs, no null, no repeated
// field, at most api.MaxBatch checks. It stops (ok false) at anything
// else; encoding/json then decodes the body, so the two paths agree on
// every body the fast one accepts (FuzzCheckFastPath holds them to it).
//
// The checks of a batch are read straight into router requests (reqs),
// with no struct of their own in between.
//
// The keys of a batch are substrings of one string holding them all,
// made once the array is read: one allocation of the keys' bytes per
// batch, not one per key. A key kept after the request (none is: the
// router keeps hashes) would keep its batch's keys alive.
type fastParser struct {
	b     []byte
	i     int
	rules *[]string        // names seen before, to share their strings
	keys  []int            // per item of the batch read so far: the start and end of its key in b
	kbuf  []byte           // the keys of a batch, gathered (setKeys)
	reqs  []router.Request // the checks of the batch read so far
}

// parse decodes b into body; false means "use encoding/json".
func (p *fastParser) parse(body *checkBody, maxItems int) bool {
	if !p.open('{') || p.peek('}') {
		return false // {} is neither shape: encoding/json's path says so
	}
	for {
		name, ok := p.name()
		if !ok {
			return false
		}
		switch name {
		case "rule", "key":
			f := &body.Rule
			if name == "key" {
				f = &body.Key
			}
			if f.present {
				return false
			}
			if f.v, ok = p.str(name == "rule"); !ok {
				return false
			}
			f.present = true
		case "cost":
			if body.Cost.present {
				return false
			}
			if body.Cost.v, ok = p.int(); !ok {
				return false
			}
			body.Cost.present, body.Cost.set = true, true
		case "checks":
			if body.Checks.present || !p.items(maxItems) {
				return false
			}
			body.Checks.present = true
		default:
			return false
		}
		if !p.next('}') {
			return false
		}
		if p.b[p.i-1] == '}' {
			break
		}
	}
	p.ws()
	return p.i == len(p.b)
}

// items reads the checks array into p.reqs.
func (p *fastParser) items(maxItems int) bool {
	if !p.open('[') {
		return false
	}
	if p.peek(']') {
		p.i++
		return true
	}
	for {
		if len(p.reqs) == maxItems || !p.open('{') {
			return false
		}
		// The key will be valid UTF-8: compact takes ASCII, raw checks
		// the rest.
		p.reqs = append(p.reqs, router.Request{Cost: 1, KeyValid: true})
		q := &p.reqs[len(p.reqs)-1]
		p.keys = append(p.keys, 0, 0) // no key: ""
		if p.peek('}') {
			p.i++
		} else if !p.compact(q) && !p.item(q) {
			return false
		}
		if !p.next(']') {
			return false
		}
		if p.b[p.i-1] == ']' {
			p.setKeys()
			return true
		}
	}
}

// setKeys gives the requests their keys (p.keys) as substrings of one
// new string: the keys are gathered in p.kbuf (reused), then copied once.
func (p *fastParser) setKeys() {
	buf := p.kbuf[:0]
	for k := 0; k < len(p.keys); k += 2 {
		buf = append(buf, p.b[p.keys[k]:p.keys[k+1]]...)
	}
	p.kbuf = buf
	all, off := string(buf), 0
	for i := range p.reqs {
		end := off + p.keys[2*i+1] - p.keys[2*i]
		p.reqs[i].Key = all[off:end]
		off = end
	}
}

// compact reads one check in the shape clients send,
// "rule":"…","key":"…" and an optional ,"cost":N, with no white space
// and plain ASCII strings, after its '{' through its '}': without the
// general path's white space skipping and name matching per token. On
// any other shape it returns false with p.i and q unchanged, for item.
func (p *fastParser) compact(q *router.Request) bool {
	b, start := p.b, p.i
	i := start
	if !hasField(b[i:], `"rule":"`) {
		return false
	}
	i += len(`"rule":"`)
	rs := i
	for i < len(b) && plain[b[i]] {
		i++
	}
	re := i
	if !hasField(b[i:], `","key":"`) {
		return false
	}
	i += len(`","key":"`)
	ks := i
	for i < len(b) && plain[b[i]] {
		i++
	}
	ke := i
	if !hasField(b[i:], `"`) {
		return false
	}
	i++
	cost := q.Cost
	if hasField(b[i:], `,"cost":`) {
		p.i = i + len(`,"cost":`)
		n, ok := p.int()
		if !ok {
			p.i = start
			return false
		}
		i, cost = p.i, n
	}
	if !hasField(b[i:], "}") {
		p.i = start
		return false
	}
	p.i = i + 1
	q.Rule, q.Cost = p.ruleName(b[rs:re]), cost
	p.keys[len(p.keys)-2], p.keys[len(p.keys)-1] = ks, ke // set by setKeys
	return true
}

// item reads the fields of one check, after its '{', through its '}'.
func (p *fastParser) item(q *router.Request) bool {
	var rule, key, cost bool
	for {
		name, ok := p.name()
		if !ok {
			return false
		}
		switch name {
		case "rule":
			if rule {
				return false
			}
			rule = true
			if q.Rule, ok = p.str(true); !ok {
				return false
			}
		case "key":
			if key {
				return false
			}
			key = true
			start, end, ok := p.raw()
			if !ok {
				return false
			}
			p.keys[len(p.keys)-2], p.keys[len(p.keys)-1] = start, end // set by setKeys
		case "cost":
			if cost {
				return false
			}
			cost = true
			if q.Cost, ok = p.int(); !ok {
				return false
			}
		default:
			return false
		}
		if !p.next('}') {
			return false
		}
		if p.b[p.i-1] == '}' {
			return true
		}
	}
}

func (p *fastParser) ws() {
	for p.i < len(p.b) && p.b[p.i] <= ' ' {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// open skips white space and c.
func (p *fastParser) open(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// peek skips white space and reports whether c comes next (not taken).
func (p *fastParser) peek(c byte) bool {
	p.ws()
	return p.i < len(p.b) && p.b[p.i] == c
}

// next takes a ',' or the closing byte end.
func (p *fastParser) next(end byte) bool {
	p.ws()
	if p.i < len(p.b) && (p.b[p.i] == ',' || p.b[p.i] == end) {
		p.i++
		return true
	}
	return false
}

// name reads a field name and its ':'. Names are matched as literals,
// quotes included, so "rulex" or an escaped name is no match (the
// general path decides those).
func (p *fastParser) name() (string, bool) {
	p.ws()
	rest := p.b[p.i:]
	var n string
	switch {
	case hasField(rest, `"rule"`):
		n = "rule"
	case hasField(rest, `"key"`):
		n = "key"
	case hasField(rest, `"cost"`):
		n = "cost"
	case hasField(rest, `"checks"`):
		n = "checks"
	default:
		return "", false
	}
	p.i += len(n) + 2
	if !p.open(':') {
		return "", false
	}
	return n, true
}

// hasField reports whether b starts with the quoted name q; the
// comparison does not allocate.
func hasField(b []byte, q string) bool {
	return len(b) >= len(q) && string(b[:len(q)]) == q
}

// str reads a string value. Rule names repeat within a batch and across
// requests: a name seen before shares its string.
func (p *fastParser) str(rule bool) (string, bool) {
	start, end, ok := p.raw()
	if !ok {
		return "", false
	}
	if rule {
		return p.ruleName(p.b[start:end]), true
	}
	return string(p.b[start:end]), true
}

// ruleName returns raw as a string, shared with an earlier name equal to
// it when there is one.
func (p *fastParser) ruleName(raw []byte) string {
	if p.rules == nil {
		return string(raw)
	}
	for _, r := range *p.rules {
		if r == string(raw) {
			return r
		}
	}
	s := string(raw)
	if len(*p.rules) < 8 {
		*p.rules = append(*p.rules, s)
	}
	return s
}

// plain marks the bytes a string may hold as they are on the fast path:
// ASCII but for the quote, the backslash and control characters.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// raw skips white space and reads a string without escapes, returning
// the offsets of the bytes between its quotes.
func (p *fastParser) raw() (start, end int, ok bool) {
	if !p.open('"') {
		return 0, 0, false
	}
	b, i := p.b, p.i
	for i < len(b) && plain[b[i]] {
		i++
	}
	start, ascii := p.i, true
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			p.i = i + 1
			return start, i, ascii || utf8.Valid(b[start:i])
		case c == '\\' || c < 0x20:
			return 0, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0, false
}

// int reads an integer of at most 18 digits (no fraction, exponent or
// leading zero), so that it cannot overflow an int64.
func (p *fastParser) int() (int64, bool) {
	p.ws()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var n int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		n = n*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	digits := p.i - start
	switch {
	case digits == 0 || digits > 18 || (digits > 1 && p.b[start] == '0'):
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}
