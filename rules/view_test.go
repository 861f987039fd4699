package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"pgregory.net/rapid"
)

func TestFormatPeriod(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{time.Second, "1s"},
		{10 * time.Second, "10s"},
		{time.Minute, "1m"},
		{10 * time.Minute, "10m"},
		{90 * time.Second, "1m30s"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + 5*time.Second, "1h0m5s"},
		{24 * time.Hour, "24h"},
		{250 * time.Millisecond, "250ms"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Minute + 500*time.Millisecond, "1m0.5s"},
		{0, "0s"},
	}
	for _, tt := range tests {
		got := FormatPeriod(tt.d)
		if got != tt.want {
			t.Errorf("FormatPeriod(%d) = %q, want %q", tt.d, got, tt.want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != tt.d {
			t.Errorf("ParseDuration(%q) = %v, %v, want %v", got, back, err, tt.d)
		}
	}
}

func TestPropFormatPeriodParses(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := time.Duration(rapid.Int64().Draw(t, "d"))
		s := FormatPeriod(d)
		back, err := time.ParseDuration(s)
		if err != nil || back != d {
			t.Fatalf("ParseDuration(FormatPeriod(%d) = %q) = %v, %v", int64(d), s, back, err)
		}
	})
}

func TestViewOf(t *testing.T) {
	tests := []struct {
		r    limiter.Rule
		want RuleView
	}{
		{Default(), RuleView{"default", "token_bucket", 100, "1s", 200, "open"}},
		{limiter.Rule{Name: "g", Algorithm: limiter.GCRA, Limit: 5, Period: time.Minute}, RuleView{"g", "gcra", 5, "1m", 5, "open"}},
		{limiter.Rule{Name: "w", Algorithm: limiter.SlidingWindow, Limit: 5, Period: time.Hour, FailureMode: limiter.FailClosed},
			RuleView{"w", "sliding_window", 5, "1h", 5, "closed"}},
		{limiter.Rule{Name: "f", Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second, Burst: 5}, RuleView{"f", "fixed_window", 5, "1s", 5, "open"}},
	}
	for _, tt := range tests {
		if got := ViewOf(tt.r); got != tt.want {
			t.Errorf("ViewOf(%+v) = %+v, want %+v", tt.r, got, tt.want)
		}
	}
}

func TestMarshal(t *testing.T) {
	got, err := Marshal(Effective(apiExampleRules))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"rules":[` +
		`{"name":"default","algorithm":"token_bucket","limit":100,"period":"1s","burst":200,"failure_mode":"open"},` +
		`{"name":"public-api","algorithm":"token_bucket","limit":100,"period":"1s","burst":200,"failure_mode":"open"},` +
		`{"name":"login","algorithm":"sliding_log","limit":5,"period":"1m","burst":5,"failure_mode":"closed"}]}`
	if string(got) != want {
		t.Errorf("Marshal =\n%s\nwant\n%s", got, want)
	}
	if got, err := Marshal(nil); err != nil || string(got) != `{"rules":[]}` {
		t.Errorf("Marshal(nil) = %s, %v", got, err)
	}
	_, err = Marshal([]limiter.Rule{{Name: "x"}})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("Marshal(invalid) = %v, want ErrInvalid", err)
	}
}

// genRule draws a valid rule named name.
func genRule(name string) *rapid.Generator[limiter.Rule] {
	return rapid.Custom(func(t *rapid.T) limiter.Rule {
		r := limiter.Rule{
			Name:        name,
			Algorithm:   limiter.Algorithm(rapid.IntRange(int(limiter.TokenBucket), int(limiter.SlidingLog)).Draw(t, "algorithm")),
			Period:      time.Duration(rapid.Int64Range(int64(limiter.MinPeriod), int64(limiter.MaxPeriod)).Draw(t, "period")),
			FailureMode: limiter.FailureMode(rapid.IntRange(0, 1).Draw(t, "failure_mode")),
		}
		maxLimit := min(int64(limiter.MaxLimit), int64(r.Period/limiter.MinInterval))
		if r.Algorithm == limiter.SlidingLog {
			maxLimit = min(maxLimit, limiter.MaxLogLimit)
		}
		r.Limit = rapid.Int64Range(1, maxLimit).Draw(t, "limit")
		if rapid.Bool().Draw(t, "with burst") {
			r.Burst = rapid.Int64Range(1, limiter.MaxLimit).Draw(t, "burst")
			if r.Validate() != nil {
				r.Burst = r.Limit
			}
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("generated an invalid rule: %v", err)
		}
		return r
	})
}

// genRules draws a valid written rule set.
func genRules(t *rapid.T) []limiter.Rule {
	names := rapid.SliceOfDistinct(rapid.StringMatching(`[a-z][a-z0-9_.:/-]{0,12}`), rapid.ID[string]).Draw(t, "names")
	rs := make([]limiter.Rule, len(names))
	for i, n := range names {
		rs[i] = genRule(n).Draw(t, "rule")
	}
	return rs
}

// normal is r as it reads back from its view: burst made explicit.
func normal(r limiter.Rule) limiter.Rule {
	r.Burst = r.Capacity()
	return r
}

func TestPropMarshalParse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rs := genRules(t)
		b, err := Marshal(rs)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("Parse(Marshal) = %v\n%s", err, b)
		}
		if len(back) != len(rs) {
			t.Fatalf("Parse(Marshal) = %d rules, want %d", len(back), len(rs))
		}
		for i := range rs {
			if back[i] != normal(rs[i]) {
				t.Fatalf("rule %d: Parse(Marshal) = %+v, want %+v", i, back[i], normal(rs[i]))
			}
		}
		b2, err := Marshal(back)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("Marshal(Parse(Marshal)) = %s, %v\nwant %s", b2, err, b)
		}
		if Fingerprint(rs) != Fingerprint(back) {
			t.Fatalf("Fingerprint changed over Marshal/Parse")
		}
		// The view is what the API promises: burst equals limit for windows.
		var doc document
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for i, v := range doc.Rules {
			if rs[i].Algorithm == limiter.FixedWindow || rs[i].Algorithm == limiter.SlidingWindow || rs[i].Algorithm == limiter.SlidingLog {
				if v.Burst != v.Limit {
					t.Fatalf("view %+v: burst != limit for a window algorithm", v)
				}
			}
		}
	})
}

func TestPropFingerprint(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rs := genRules(t)
		fp := Fingerprint(rs)
		if len(fp) != 64 {
			t.Fatalf("Fingerprint = %q, want 64 hex digits", fp)
		}
		if len(rs) == 0 {
			return
		}
		// Changing any one field of any one rule changes it.
		i := rapid.IntRange(0, len(rs)-1).Draw(t, "i")
		mod := append([]limiter.Rule(nil), rs...)
		switch rapid.IntRange(0, 3).Draw(t, "field") {
		case 0:
			mod[i].Name += "x"
		case 1:
			mod[i].Limit++
		case 2:
			mod[i].Period++
		case 3:
			mod[i].FailureMode ^= 1
		}
		if Fingerprint(mod) == fp {
			t.Fatalf("Fingerprint unchanged after changing rule %d: %+v → %+v", i, rs[i], mod[i])
		}
	})
}

func TestFingerprint(t *testing.T) {
	a := apiExampleRules
	if Fingerprint(a) != Fingerprint(append([]limiter.Rule(nil), a...)) {
		t.Error("Fingerprint differs for equal sets")
	}
	if Fingerprint(nil) != Fingerprint([]limiter.Rule{}) {
		t.Error("Fingerprint(nil) != Fingerprint(empty)")
	}
	if Fingerprint(a) == Fingerprint([]limiter.Rule{a[1], a[0]}) {
		t.Error("Fingerprint ignores order")
	}
	// Burst omitted and burst equal to the limit are the same rule.
	b := a[1]
	b.Burst = b.Limit
	if Fingerprint([]limiter.Rule{a[0], b}) != Fingerprint(a) {
		t.Error("Fingerprint tells an omitted burst from an equal one")
	}
	// Pin the format: a changed fingerprint re-applies every rules file.
	sum := sha256.Sum256([]byte(`{"rules":[]}`))
	if got, want := Fingerprint(nil), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("Fingerprint(nil) = %q, want %q", got, want)
	}
}

// MarshalCompact leaves out a burst equal to the limit and failure_mode
// open, and Parse reads it back to the rules Marshal writes.
func TestMarshalCompactParsesBack(t *testing.T) {
	rs := []limiter.Rule{
		{Name: "plain", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second},
		{Name: "bursty", Algorithm: limiter.GCRA, Limit: 10, Period: time.Minute, Burst: 50},
		{Name: "closed", Algorithm: limiter.SlidingLog, Limit: 5, Period: time.Hour, FailureMode: limiter.FailClosed},
		{Name: "window", Algorithm: limiter.FixedWindow, Limit: 7, Period: 90 * time.Minute, Burst: 7},
		{Name: "leaky", Algorithm: limiter.LeakyBucket, Limit: 3, Period: time.Second, Burst: 1},
	}
	doc, err := MarshalCompact(rs)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"rules":[{"name":"plain","algorithm":"token_bucket","limit":10,"period":"1s"},` +
		`{"name":"bursty","algorithm":"gcra","limit":10,"period":"1m","burst":50},` +
		`{"name":"closed","algorithm":"sliding_log","limit":5,"period":"1h","failure_mode":"closed"},` +
		`{"name":"window","algorithm":"fixed_window","limit":7,"period":"1h30m"},` +
		`{"name":"leaky","algorithm":"leaky_bucket","limit":3,"period":"1s","burst":1}]}`
	if string(doc) != want {
		t.Errorf("MarshalCompact =\n%s\nwant\n%s", doc, want)
	}
	back, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := Marshal(rs)
	if again, _ := Marshal(back); string(again) != string(full) {
		t.Errorf("parsed back, Marshal gives\n%s\nwant\n%s", again, full)
	}
	if _, err := MarshalCompact([]limiter.Rule{{Name: "bad"}}); err == nil {
		t.Error("MarshalCompact of an invalid rule: no error")
	}
}
