package httptarget

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// The scanner reads what encoding/json reads of every answer a member
// writes (json.Marshal's bytes, which the server's encoder matches).
func TestScanRinglimitMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 300; n++ {
		var want api.BatchResponse
		for range n%7 + 1 {
			want.Results = append(want.Results, api.Decision{Allowed: rng.IntN(2) == 0, Limit: 1000,
				Remaining: rng.Int64N(1000), ResetAfterMs: rng.Int64N(5000), Degraded: rng.IntN(5) == 0})
		}
		body, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]api.Decision, len(want.Results))
		if !ScanRinglimit(body, got) {
			t.Fatalf("%s: not scanned", body)
		}
		for i, w := range want.Results {
			if got[i].Allowed != w.Allowed || got[i].Degraded != w.Degraded {
				t.Fatalf("%s: result %d = %+v, want allowed=%v degraded=%v", body, i, got[i], w.Allowed, w.Degraded)
			}
		}
	}
	one, _ := json.Marshal(api.Decision{Allowed: false, Limit: 5, RetryAfterMs: 200, Degraded: true})
	got := make([]api.Decision, 1)
	if !ScanRinglimit(one, got) || got[0].Allowed || !got[0].Degraded {
		t.Errorf("single decision %s: %+v", one, got[0])
	}
}

// Anything else is left to encoding/json.
func TestScanRinglimitRefuses(t *testing.T) {
	for _, tc := range []struct {
		body string
		n    int
	}{
		{`{"results":[{"allowed":true,"degraded":false}]}`, 2},                                   // too few
		{`{"results":[{"allowed":true,"degraded":false},{"allowed":true,"degraded":false}]}`, 1}, // too many
		{`{"results":[{"allowed":null,"degraded":false}]}`, 1},
		{`{"results":[{"allowed":true}]}`, 1}, // no degraded
		{`{"error":"unknown rule \"x\""}`, 1},
		{``, 1},
	} {
		if ScanRinglimit([]byte(tc.body), make([]api.Decision, tc.n)) {
			t.Errorf("%s (%d results): scanned", tc.body, tc.n)
		}
	}
}

func TestScanGubernator(t *testing.T) {
	ok := `{"responses":[{"status":"UNDER_LIMIT","limit":"1000","remaining":"999","reset_time":"1764500000000"},` +
		`{"status":"OVER_LIMIT","limit":"1000","remaining":"0","reset_time":"1764500000000","error":""},` +
		`{"limit":"1000","remaining":"998","reset_time":"1764500000000","metadata":{"owner":"127.0.0.1:1051"},"status":"UNDER_LIMIT"}]}`
	got := make([]api.Decision, 3)
	if !ScanGubernator([]byte(ok), got) {
		t.Fatalf("not scanned")
	}
	if !got[0].Allowed || got[1].Allowed || !got[2].Allowed {
		t.Errorf("allowed = %v %v %v, want true false true", got[0].Allowed, got[1].Allowed, got[2].Allowed)
	}
	// The encoding/json path agrees.
	var resp struct {
		Responses []struct {
			Status string `json:"status"`
		} `json:"responses"`
	}
	if err := json.Unmarshal([]byte(ok), &resp); err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Responses {
		if (r.Status != "OVER_LIMIT") != got[i].Allowed {
			t.Errorf("result %d: encoding/json reads %q, scanner allowed=%v", i, r.Status, got[i].Allowed)
		}
	}
	// An answer of gubernator v2.13.0's HTTP gateway, as written.
	real := `{"responses":[{"status":"UNDER_LIMIT","limit":"1000","remaining":"999","reset_time":"1796049835968","error":"","metadata":{}},` +
		`{"status":"UNDER_LIMIT","limit":"1","remaining":"0","reset_time":"1796049835968","error":"","metadata":{}},` +
		`{"status":"OVER_LIMIT","limit":"1","remaining":"0","reset_time":"1796049835968","error":"","metadata":{}}]}`
	if !ScanGubernator([]byte(real), got) || !got[0].Allowed || !got[1].Allowed || got[2].Allowed {
		t.Errorf("gubernator's own answer: %+v", got)
	}
	for _, bad := range []string{
		`{"responses":[{"status":"UNDER_LIMIT","error":"rate limit name is empty"}]}`,
		`{"responses":[{"status":"UNDER_LIMIT"},{"status":"UNDER_LIMIT"}]}`, // two for one
		`{"responses":[]}`,
		`{"code":3,"message":"bad"}`,
	} {
		if ScanGubernator([]byte(bad), make([]api.Decision, 1)) {
			t.Errorf("%s: scanned", bad)
		}
	}
}
