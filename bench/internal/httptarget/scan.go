package httptarget

import (
	"bytes"

	"github.com/ringlimit/ringlimit/api"
)

// The answers of the HTTP rows are read by scanning for the members the
// load loop counts, not decoded with encoding/json: decoding 100 results
// per call with reflection took ~3 µs of the load generator's CPU per
// check, about three times what a ringlimit member spent deciding it, on
// a machine where the load generator and the servers share two cores —
// so the HTTP rows measured the load generator. Each scanner is exact on
// the answers its server writes and reports false on anything it does
// not recognise; the caller then decodes with encoding/json as before,
// so an unexpected answer is still read, or refused with its error.

// ScanRinglimit reads ringlimit's answer to POST /v1/check — one decision
// object, or {"results":[…]} — into ds: each result's "allowed" and
// "degraded" members, in order. It reports false unless it found exactly
// len(ds) of each, every one a JSON boolean.
func ScanRinglimit(body []byte, ds []api.Decision) bool {
	return scanBools(body, `"allowed":`, ds, false) && scanBools(body, `"degraded":`, ds, true)
}

// scanBools sets, in order, the Allowed (or Degraded) field of each of ds
// from the boolean after each occurrence of name in b: true when there
// are exactly len(ds), all booleans.
func scanBools(b []byte, name string, ds []api.Decision, degraded bool) bool {
	n := 0
	for {
		at := bytes.Index(b, []byte(name))
		if at < 0 {
			return n == len(ds)
		}
		b = b[at+len(name):]
		var v bool
		switch {
		case bytes.HasPrefix(b, []byte("true")):
			v, b = true, b[4:]
		case bytes.HasPrefix(b, []byte("false")):
			b = b[5:]
		default:
			return false
		}
		if n == len(ds) {
			return false
		}
		if degraded {
			ds[n].Degraded = v
		} else {
			ds[n] = api.Decision{Allowed: v}
		}
		n++
	}
}

// ScanGubernator reads gubernator's answer to POST /v1/GetRateLimits
// (grpc-gateway JSON) into ds: a result is allowed unless its "status"
// is "OVER_LIMIT", as the encoding/json path decides. It reports false
// unless it found exactly len(ds) statuses, and when a result carries a
// non-empty "error" (the encoding/json path then reports it).
func ScanGubernator(body []byte, ds []api.Decision) bool {
	for rest := body; ; {
		at := bytes.Index(rest, []byte(`"error":`))
		if at < 0 {
			break
		}
		rest = rest[at+len(`"error":`):]
		if !bytes.HasPrefix(rest, []byte(`""`)) {
			return false
		}
	}
	n := 0
	for rest := body; ; n++ {
		at := bytes.Index(rest, []byte(`"status":"`))
		if at < 0 {
			break
		}
		rest = rest[at+len(`"status":"`):]
		end := bytes.IndexByte(rest, '"')
		if end < 0 || n == len(ds) {
			return false
		}
		ds[n] = api.Decision{Allowed: string(rest[:end]) != "OVER_LIMIT"}
		rest = rest[end+1:]
	}
	return n == len(ds)
}
