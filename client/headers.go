package client

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// RateLimit is what a response's rate-limit headers describe: the rule
// (the policy), its period (the window) and the decision.
type RateLimit struct {
	Policy   string // the rule's name
	Window   time.Duration
	Decision api.Decision
}

// Denied is the body of a 429 answer (README.md, "Gateway").
type Denied struct {
	Error             string `json:"error"` // "rate_limited"
	Message           string `json:"message"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
}

// SetHeaders writes the rate-limit headers of rl to h, as the gateway and
// the Middleware send them: the IETF structured fields RateLimit-Policy
// ("name";q=LIMIT;w=WINDOW_SECONDS) and RateLimit ("name";r=REMAINING;
// t=SECONDS_UNTIL_FULL), and X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (Unix seconds when the limit is full again, on now's
// clock). Seconds are rounded up. A denied decision shows remaining 0.
func SetHeaders(h http.Header, rl RateLimit, now time.Time) {
	d := rl.Decision
	remaining := max(d.Remaining, 0)
	if !d.Allowed {
		remaining = 0
	}
	reset := ceilSeconds(d.ResetAfterMs)
	name := sfString(rl.Policy)
	h.Set("RateLimit-Policy", name+";q="+fmtInt(d.Limit)+";w="+fmtInt(max(ceilSeconds(rl.Window.Milliseconds()), 1)))
	h.Set("RateLimit", name+";r="+fmtInt(remaining)+";t="+fmtInt(reset))
	h.Set("X-RateLimit-Limit", fmtInt(d.Limit))
	h.Set("X-RateLimit-Remaining", fmtInt(remaining))
	h.Set("X-RateLimit-Reset", fmtInt(now.Add(time.Duration(d.ResetAfterMs)*time.Millisecond+time.Second-1).Unix()))
}

// WriteDenied answers 429 Too Many Requests for rl: the headers of
// SetHeaders, Retry-After in whole seconds (rounded up, at least 1),
// Cache-Control: no-store, and a JSON Denied body whose
// retry_after_seconds equals Retry-After; its message says whether the
// limit was exceeded or could not be checked (a degraded decision of a
// closed rule).
func WriteDenied(w http.ResponseWriter, rl RateLimit, now time.Time) {
	h := w.Header()
	SetHeaders(h, rl, now)
	retry := max(ceilSeconds(rl.Decision.RetryAfterMs), 1)
	h.Set("Retry-After", fmtInt(retry))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	msg := "rate limit " + strconv.Quote(rl.Policy) + " exceeded; retry in " + fmtInt(retry) + "s"
	if rl.Decision.Degraded {
		// Denied by the rule's failure_mode closed: the owner of the key
		// could not be asked. Was "exceeded", which sent operators (an
		// audit: 5% of a gateway's requests while a member was down)
		// looking for a client that had exceeded nothing.
		msg = "rate limit " + strconv.Quote(rl.Policy) + " could not be checked (the rate limiter did not answer in time) and its rule denies until it can; retry in " + fmtInt(retry) + "s"
	}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(jsonLine(Denied{Error: "rate_limited", RetryAfterSeconds: retry, Message: msg}))
}

func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

func fmtInt(n int64) string { return strconv.FormatInt(n, 10) }

// sfString writes s as a structured-field string (RFC 8941 §3.3.3):
// quoted, with \ and " escaped; characters outside printable ASCII (which
// rule names never hold) become '?'.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// jsonLine is v as JSON and a newline, without encoding/json's HTML
// escaping: the bodies are application/json with nosniff, never HTML,
// and escaped, a rule named "a<b" read "a\u003cb" in a 429's message.
func jsonLine(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // plain strings and integers: cannot fail
	return b.Bytes()
}
