package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

const basicConfig = `
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      unit: hour
      requests_per_unit: 2
    shadow_mode: true
  - key: internal
    rate_limit:
      unlimited: true
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: 1
`

// OK until the limit, then OVER_LIMIT with limit_remaining 0; the window
// resets; current_limit and duration_until_reset describe the limit.
func TestUntilTheLimitThenOverLimit(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	t1 := desc("tenant", "t1")
	e.run(t, []step{
		{"api", 0, t1, ok, 2, 3, false},
		{"api", 0, t1, ok, 1, 3, false},
		{"api", 0, t1, ok, 0, 3, false},
		{"api", 0, t1, over, 0, 3, false},
		{"api", 0, t1, over, 0, 3, false},
		{"api", 0, desc("tenant", "t2"), ok, 2, 3, false}, // each value its own counter
	})
	resp := e.call(t, "api", 0, t1)
	if resp.OverallCode != over {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	st := resp.Statuses[0]
	if st.CurrentLimit.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE || st.DurationUntilReset.AsDuration() != time.Minute {
		t.Fatalf("current limit %v, reset in %v; want per MINUTE, 1m", st.CurrentLimit, st.DurationUntilReset.AsDuration())
	}
	e.owner.now.Add(int64(time.Minute)) // the next window
	e.run(t, []step{{"api", 0, t1, ok, 2, 3, false}})
	if got := e.counter("api.tenant", resultOver); got != 3 {
		t.Fatalf("over_limit counted %v, want 3", got)
	}
}

// hits_addend is the cost; 0 means 1; a descriptor's own hits_addend
// overrides the request's (an explicit 0 there is a query); more than the
// limit can ever take is OVER_LIMIT, resets after a period, and spends
// nothing.
func TestHitsAddend(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	k := desc("tenant", "h")
	e.run(t, []step{
		{"api", 2, k, ok, 1, 3, false},
		{"api", 4, k, over, 0, 3, false}, // over the capacity: nothing spent
		{"api", 2, k, over, 0, 3, false}, // denied: nothing spent either
		{"api", 1, k, ok, 0, 3, false},
	})
	// A cost that can never pass does not tell Envoy to retry at once.
	if st := e.call(t, "api", 4, k).Statuses[0]; st.Code != over || st.DurationUntilReset.AsDuration() <= 0 {
		t.Fatalf("over the capacity: %v, reset in %v; want OVER_LIMIT with a reset after now", st.Code, st.DurationUntilReset.AsDuration())
	}
	k2 := desc("tenant", "h2")
	k2.HitsAddend = wrapperspb.UInt64(3)
	e.run(t, []step{{"api", 1, k2, ok, 0, 3, false}})
	q := desc("tenant", "h2")
	q.HitsAddend = wrapperspb.UInt64(0) // an explicit 0 on a descriptor: a query
	e.run(t, []step{{"api", 1, q, over, 0, 3, false}})
}

// Nested descriptors match level by level; value-less entries match any
// value, each its own counter; a descriptor deeper or shallower than the
// config's limit does not match (as envoyproxy/ratelimit).
func TestNestedAndValueless(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	e.run(t, []step{
		{"api", 0, desc("plan", "free", "user", "u1"), ok, 0, 1, false},
		{"api", 0, desc("plan", "free", "user", "u1"), over, 0, 1, false},
		{"api", 0, desc("plan", "free", "user", "u2"), ok, 0, 1, false},
		{"api", 0, desc("plan", "free"), ok, 0, 0, true},                         // the placeholder has no limit
		{"api", 0, desc("plan", "paid", "user", "u1"), ok, 0, 0, true},           // no such value
		{"api", 0, desc("plan", "free", "user", "u1", "x", "y"), ok, 0, 0, true}, // deeper than the config
		{"api", 0, desc("tenant", "t", "user", "u"), ok, 0, 0, true},             // tenant has no children
	})
}

// A scalar keeps its text as written, as envoyproxy/ratelimit's yaml.v2
// decoder keeps it: `yes`, `off`, `010` and `1.50` are values to match
// as they are, and `y` a domain. Was: decoded through JSON, they became
// true, false, 8, 1.5 and the domain "true", and never matched.
func TestConfigScalarsKeepTheirText(t *testing.T) {
	const cfg = `
domain: y
descriptors:
  - key: flag
    value: yes
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: flag
    value: off
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: code
    value: 010
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ver
    value: 1.50
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	e := newEnv(t, cfg, Options{})
	for _, d := range []*commonpb.RateLimitDescriptor{desc("flag", "yes"), desc("flag", "off"), desc("code", "010"), desc("ver", "1.50")} {
		e.run(t, []step{{"y", 0, d, ok, 0, 1, false}, {"y", 0, d, over, 0, 1, false}})
	}
	for _, d := range []*commonpb.RateLimitDescriptor{desc("flag", "true"), desc("flag", "false"), desc("code", "8"), desc("ver", "1.5")} {
		e.run(t, []step{{"y", 0, d, ok, 0, 0, true}}) // unmatched
	}
}

// Entries of any length count: a value of 128 bytes or more, and one
// that makes the key longer than a key may be, each have their own
// counter. Was: InvalidArgument for the whole call (the counter's key
// was not UTF-8, which the router refuses).
func TestLongEntriesCount(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	for _, v := range []string{strings.Repeat("x", 127), strings.Repeat("x", 128), strings.Repeat("y", 200), strings.Repeat("z", 5000)} {
		d := desc("tenant", v)
		e.run(t, []step{{"api", 0, d, ok, 2, 3, false}, {"api", 0, d, ok, 1, 3, false}})
	}
}

// detailed_metric's series are bounded: past MaxDetailedKeys distinct
// values, the others are counted together under the key and "_<other>".
// Was: one series per value a client sent, without end (2000 values,
// 2000 series).
func TestDetailedMetricIsBounded(t *testing.T) {
	e := newEnv(t, `
domain: d
descriptors:
  - key: to_number
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`, Options{})
	const sent = MaxDetailedKeys + 500
	for i := range sent {
		e.call(t, "d", 0, desc("to_number", fmt.Sprint(i)))
	}
	series := testutil.CollectAndCount(e.srv.m.descriptors)
	if series != MaxDetailedKeys+1 {
		t.Fatalf("%d series for %d values, want %d (the bound and one for the others)", series, sent, MaxDetailedKeys+1)
	}
	if got := e.counter("d.to_number_0", resultWithin); got != 1 {
		t.Fatalf("a value within the bound counted %v, want 1", got)
	}
	if got := e.counter("d.to_number"+otherValues, resultWithin); got != sent-MaxDetailedKeys {
		t.Fatalf("the others counted %v, want %d", got, sent-MaxDetailedKeys)
	}
}

// shadow_mode answers OK past the limit and counts each would-be denial.
func TestShadowMode(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	login := desc("path", "/login")
	e.run(t, []step{
		{"api", 0, login, ok, 1, 2, false},
		{"api", 0, login, ok, 0, 2, false},
		{"api", 0, login, ok, 0, 2, false},
		{"api", 0, login, ok, 0, 2, false},
	})
	if got := e.counter("api.path_/login", resultShadow); got != 2 {
		t.Fatalf("shadow_mode would-be denials counted %v, want 2", got)
	}
	if got := e.counter("api.path_/login", resultWithin); got != 2 {
		t.Fatalf("within_limit counted %v, want 2", got)
	}
}

// unlimited is OK with limit_remaining 2^32-1; an unmatched descriptor
// and an unknown domain are OK without a limit; a bad request is an error.
func TestUnlimitedUnmatchedUnknownDomain(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	e.run(t, []step{
		{"api", 0, desc("internal", "x"), ok, math.MaxUint32, 0, true},
		{"api", 0, desc("nothing", "here"), ok, 0, 0, true},
		{"nowhere", 0, desc("tenant", "t1"), ok, 0, 0, true},
	})
	for i := range 5 {
		if st := e.call(t, "nowhere", 0, desc("tenant", "t1")).Statuses[0]; st.Code != ok {
			t.Fatalf("call %d for an unknown domain: %v", i, st.Code)
		}
	}
	for _, tt := range []struct {
		req  *rlspb.RateLimitRequest
		code codes.Code
	}{
		{&rlspb.RateLimitRequest{Descriptors: []*commonpb.RateLimitDescriptor{desc("a", "b")}}, codes.InvalidArgument},
		{&rlspb.RateLimitRequest{Domain: "api"}, codes.InvalidArgument},
		{&rlspb.RateLimitRequest{Domain: "api", Descriptors: make([]*commonpb.RateLimitDescriptor, MaxDescriptors+1)}, codes.InvalidArgument},
	} {
		_, err := e.client.ShouldRateLimit(context.Background(), tt.req)
		if status.Code(err) != tt.code {
			t.Errorf("ShouldRateLimit(%v) = %v, want %v", tt.req, err, tt.code)
		}
	}
}

// Several descriptors in one call: one status each, OVER_LIMIT overall
// when any is; the ones allowed are spent (as in envoyproxy/ratelimit).
func TestSeveralDescriptors(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	u := desc("plan", "free", "user", "u9")
	tn := desc("tenant", "t9")
	resp := e.call(t, "api", 0, tn, u, desc("nothing", "x"))
	if resp.OverallCode != ok {
		t.Fatalf("first call overall %v", resp.OverallCode)
	}
	resp = e.call(t, "api", 0, tn, u, desc("nothing", "x"))
	got := []rlspb.RateLimitResponse_Code{resp.Statuses[0].Code, resp.Statuses[1].Code, resp.Statuses[2].Code}
	if resp.OverallCode != over || got[0] != ok || got[1] != over || got[2] != ok {
		t.Fatalf("second call: overall %v, statuses %v; want OVER_LIMIT, [OK OVER_LIMIT OK]", resp.OverallCode, got)
	}
	if r := resp.Statuses[0].LimitRemaining; r != 1 {
		t.Fatalf("tenant remaining %d after two calls, want 1", r)
	}
}

// ringlimit's extras: an algorithm other than a fixed window, several
// limits on one descriptor (the decisive one is reported), burst.
func TestExtras(t *testing.T) {
	e := newEnv(t, `
domain: extras
descriptors:
  - key: user
    rate_limits:
      - name: burst
        unit: second
        requests_per_unit: 2
        algorithm: token_bucket
        burst: 4
      - name: daily
        unit: day
        requests_per_unit: 5
        algorithm: sliding_log
        failure_mode: closed
`, Options{})
	u := desc("user", "ann")
	e.run(t, []step{
		{"extras", 0, u, ok, 3, 2, false}, // burst: 3 left of 4 (the least remaining)
		{"extras", 0, u, ok, 2, 2, false},
		{"extras", 0, u, ok, 1, 2, false},
		{"extras", 0, u, ok, 0, 2, false},
		{"extras", 0, u, over, 0, 2, false}, // the bucket is empty; the daily limit does not count the hit
	})
	e.owner.now.Add(int64(time.Second)) // refills 2
	e.run(t, []step{
		{"extras", 0, u, ok, 0, 5, false},   // the daily limit's 5th
		{"extras", 0, u, over, 0, 5, false}, // the bucket admits, the daily limit is spent
	})
	st := e.call(t, "extras", 0, u).Statuses[0]
	if st.CurrentLimit.Name != "daily" || st.CurrentLimit.Unit != rlspb.RateLimitResponse_RateLimit_DAY {
		t.Fatalf("decisive limit %v, want daily per DAY", st.CurrentLimit)
	}
}

// A blocked value (requests_per_unit 0) denies everything, without a
// round trip; replaces drops the replaced limit (envoyproxy/ratelimit's
// README examples 3 and 7); a wildcard value matches a prefix.
func TestBlockReplacesWildcard(t *testing.T) {
	e := newEnv(t, "", Options{ConfigPath: "testdata/examples"})
	e.run(t, []step{
		{"edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.5"), over, 0, 0, false},
		{"edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.6"), ok, 9, 10, false},
		{"example9", 0, desc("key1", "value7"), ok, 19, 20, false},
		{"example9", 0, desc("key1", "other"), ok, 0, 0, true},
	})
	specific := desc("key_1", "value_1", "user", "bkthomps")
	replacing := desc("key_2", "value_2", "user", "bkthomps")
	for i := range 6 {
		resp := e.call(t, "example7", 0, specific, replacing)
		if resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != uint32(9-i) || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("call %d: %v; want OK, the replacing limit spent, the replaced one not checked", i, resp)
		}
	}
	e.run(t, []step{{"example7", 0, specific, ok, 4, 5, false}}) // alone, it applies, unspent before
	// The block says when its unit's window ends, as theirs does. Was:
	// no duration_until_reset.
	e.srv.svc.now = func() time.Time { return time.Unix(0, t0).Add(250 * time.Millisecond) }
	st := e.call(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.5")).Statuses[0]
	if got := st.DurationUntilReset.AsDuration(); got != 750*time.Millisecond {
		t.Errorf("blocked per second, 250 ms into its second: duration_until_reset %v, want 750ms", got)
	}
}

// The examples of envoyproxy/ratelimit's README, one domain per file in
// a directory, load unchanged (hidden and non-YAML files are skipped).
func TestReadmeExamplesLoadUnchanged(t *testing.T) {
	e := newEnv(t, "", Options{ConfigPath: "testdata/examples"})
	c := e.srv.Service().Config()
	if c.Domains() != 9 || c.Limits() != 16 {
		t.Fatalf("%d domains, %d limits; want 9 and 16", c.Domains(), c.Limits())
	}
	// Example 2: 5 marketing messages a day per number, 100 messages.
	mk := desc("message_type", "marketing", "to_number", "2061111111")
	num := desc("to_number", "2061111111")
	for i := range 5 {
		resp := e.call(t, "messaging", 0, mk, num)
		if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != uint32(4-i) || resp.Statuses[1].LimitRemaining != uint32(99-i) {
			t.Fatalf("message %d: %v", i, resp.Statuses)
		}
	}
	resp := e.call(t, "messaging", 0, mk, num)
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("6th marketing message: %v", resp)
	}
	e.run(t, []step{
		{"messaging", 0, desc("message_type", "marketing", "to_number", "2062222222"), ok, 4, 5, false},
		{"example4", 0, desc("key", "value", "subkey", "x"), ok, 299, 300, false},
		{"example4", 0, desc("key", "value"), ok, 0, 0, true},
		{"internal", 0, desc("ldap", "x"), ok, math.MaxUint32, 0, true},
		{"mongo_cps", 0, desc("database", "users"), ok, 499, 500, false},
	})
	// Example 8: detailed_metric puts the value in the metrics key.
	e.call(t, "example8", 0, desc("key1", "some_value"))
	if got := e.counter("example8.key1_some_value", resultWithin); got != 1 {
		t.Fatalf("detailed metric counted %v, want 1", got)
	}
	e.call(t, "example6", 0, desc("service", "auth", "user", "user-a"))
	if got := e.counter("example6.service.user_user-a", resultWithin); got != 1 {
		t.Fatalf("nested metric key counted %v, want 1", got)
	}
}

// A descriptor may carry its own limit (Envoy's per-route override).
func TestDescriptorLimitOverride(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	d := desc("anything", "x")
	d.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typepb.RateLimitUnit_MINUTE}
	e.run(t, []step{
		{"api", 0, d, ok, 1, 2, false},
		{"api", 0, d, ok, 0, 2, false},
		{"api", 0, d, over, 0, 2, false},
	})
	// Deeper than any config can match: the override needs none. Was:
	// every descriptor of more than MaxDepth entries was unlimited, its
	// override ignored.
	var kv []string
	for i := range MaxDepth + 1 {
		kv = append(kv, "k"+strconv.Itoa(i), "v")
	}
	deep := ov(1, typepb.RateLimitUnit_MINUTE, 0, kv...)
	e.run(t, []step{
		{"api", 0, deep, ok, 0, 1, false},
		{"api", 0, deep, over, 0, 1, false},
	})
}

// ov is desc(kv...) carrying Envoy's per-route limit override; a
// multiplier of 0 leaves unit_multiplier unset.
func ov(rpu uint32, unit typepb.RateLimitUnit, mult uint32, kv ...string) *commonpb.RateLimitDescriptor {
	d := desc(kv...)
	d.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

// An override counts its descriptor's hits per window: two routes that
// send one descriptor with 3 per 30 SECOND and 3 per SECOND count apart,
// each in its own window. Windows of one length (60 SECOND, MINUTE)
// share a counter, and so do two limits in one window, as in
// envoyproxy/ratelimit. Was: one counter per unit, whose window was the
// period sent last (the 1 s override answered OVER_LIMIT, reset in 28 s).
func TestOverrideCounterPerWindow(t *testing.T) {
	const (
		sec    = typepb.RateLimitUnit_SECOND
		minute = typepb.RateLimitUnit_MINUTE
	)
	e := newEnv(t, basicConfig, Options{})
	per30s, perSec := ov(3, sec, 30, "user", "alt"), ov(3, sec, 0, "user", "alt")
	for i, s := range []struct {
		advance time.Duration // the owner's clock, before the call
		d       *commonpb.RateLimitDescriptor
		code    rlspb.RateLimitResponse_Code
		remain  uint32
		reset   time.Duration
	}{
		{0, per30s, ok, 2, 30 * time.Second},
		{0, perSec, ok, 2, time.Second},
		{0, per30s, ok, 1, 30 * time.Second},
		{0, perSec, ok, 1, time.Second},
		{0, per30s, ok, 0, 30 * time.Second},
		{0, perSec, ok, 0, time.Second},
		{0, per30s, over, 0, 30 * time.Second},
		{0, perSec, over, 0, time.Second},
		{time.Second, perSec, ok, 2, time.Second}, // its next window
		{0, per30s, over, 0, 29 * time.Second},    // not its next window
		{0, ov(3, sec, 60, "user", "alt"), ok, 2, 59 * time.Second},
		{0, ov(3, minute, 1, "user", "alt"), ok, 1, 59 * time.Second}, // the same window: the same counter
		{0, ov(5, minute, 0, "user", "alt"), ok, 2, 59 * time.Second}, // another limit in it: the same counter, held to 5
	} {
		e.owner.now.Add(int64(s.advance))
		st := e.call(t, "api", 0, s.d).Statuses[0]
		if st.Code != s.code || st.LimitRemaining != s.remain || st.DurationUntilReset.AsDuration() != s.reset {
			t.Errorf("step %d: ShouldRateLimit(%d per %v × %d) = %v remaining %d reset %v; want %v remaining %d reset %v",
				i, s.d.Limit.RequestsPerUnit, s.d.Limit.Unit, s.d.Limit.GetUnitMultiplier().GetValue(),
				st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), s.code, s.remain, s.reset)
		}
	}
	// A period of a unit's length keeps the name an override of that
	// unit always had, so its counters outlive the upgrade.
	for period, want := range map[time.Duration]string{
		time.Second: "rls:api/_override_second#0", 7 * 24 * time.Hour: "rls:api/_override_week#0", 30 * time.Second: "rls:api/_override_30s#0",
	} {
		if got := overrideRuleName("api", period); got != want {
			t.Errorf("overrideRuleName(api, %v) = %q, want %q", period, got, want)
		}
	}
}

// An override's period is at most limiter.MaxPeriod (366 days), for a
// block (requests_per_unit 0) too; one longer is InvalidArgument with a
// message giving both. Was: YEAR × 300 overflowed into a negative period
// (-2496095h…) in the message, and a block took any multiplier.
func TestOverridePeriodBounds(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	for _, tt := range []struct {
		rpu  uint32
		unit typepb.RateLimitUnit
		mult uint32
		want string // "" for OK
	}{
		{5, typepb.RateLimitUnit_YEAR, 300, "descriptor limit override: 300 × YEAR is a period of 9460800000s, over the longest allowed, 31622400s (366 days)"},
		{5, typepb.RateLimitUnit_YEAR, 4_000_000_000, "descriptor limit override: 4000000000 × YEAR is a period of 126144000000000000s, over the longest allowed, 31622400s (366 days)"},
		{5, typepb.RateLimitUnit_DAY, 100_000, "descriptor limit override: 100000 × DAY is a period of 8640000000s, over the longest allowed, 31622400s (366 days)"},
		{5, typepb.RateLimitUnit_SECOND, 31_622_401, "descriptor limit override: 31622401 × SECOND is a period of 31622401s, over the longest allowed, 31622400s (366 days)"},
		{0, typepb.RateLimitUnit_YEAR, 2, "descriptor limit override: 2 × YEAR is a period of 63072000s, over the longest allowed, 31622400s (366 days)"},
		{5, typepb.RateLimitUnit_SECOND, 31_622_400, ""},
		{5, typepb.RateLimitUnit_YEAR, 1, ""},
		{5, typepb.RateLimitUnit_MONTH, 12, ""},
		{0, typepb.RateLimitUnit_DAY, 366, ""},
	} {
		d := ov(tt.rpu, tt.unit, tt.mult, "user", "bounds")
		_, err := e.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{d}})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%d per %d × %v: %v, want OK", tt.rpu, tt.mult, tt.unit, err)
		case tt.want != "" && (status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tt.want):
			t.Errorf("%d per %d × %v: %v; want InvalidArgument %q", tt.rpu, tt.mult, tt.unit, err, tt.want)
		}
	}
}

// x-ratelimit-limit's window (w=) is the period of the limit described:
// a config limit's unit, an override's unit times its unit_multiplier,
// for a block and for hits over a limit's capacity too; the status's
// current_limit carries the multiplier. Was: the unit alone (w=1 for 30
// SECOND, no unit_multiplier); and a block's reset ended its unit, not
// its window.
func TestResponseHeaderWindow(t *testing.T) {
	const sec = typepb.RateLimitUnit_SECOND
	e := newEnv(t, basicConfig, Options{Headers: true})
	e.owner.now.Add(int64(15 * time.Second))
	e.srv.svc.now = func() time.Time { return time.Unix(0, t0).Add(15 * time.Second) }
	for _, tt := range []struct {
		name  string
		hits  uint32
		d     *commonpb.RateLimitDescriptor
		limit string
		reset string
		mult  uint32 // current_limit.unit_multiplier, 0 for none
	}{
		{"config, per minute", 0, desc("tenant", "w"), "3, 3;w=60", "45", 0},
		{"3 per 30 SECOND", 0, ov(3, sec, 30, "user", "w"), "3, 3;w=30", "15", 30},
		{"2 per 90 MINUTE", 0, ov(2, typepb.RateLimitUnit_MINUTE, 90, "user", "w"), "2, 2;w=5400", "3585", 90},
		{"over the capacity of 3 per 30 SECOND", 4, ov(3, sec, 30, "user", "w2"), "3, 3;w=30", "30", 30},
		{"blocked per 30 SECOND", 0, ov(0, sec, 30, "user", "w"), "0, 0;w=30", "15", 30},
		{"3 per 1 SECOND", 0, ov(3, sec, 1, "user", "w"), "3, 3;w=1", "1", 0},
	} {
		resp := e.call(t, "api", tt.hits, tt.d)
		got := map[string]string{}
		for _, h := range resp.ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		if got["x-ratelimit-limit"] != tt.limit || got["x-ratelimit-reset"] != tt.reset {
			t.Errorf("%s: x-ratelimit-limit %q, x-ratelimit-reset %q; want %q, %q", tt.name, got["x-ratelimit-limit"], got["x-ratelimit-reset"], tt.limit, tt.reset)
		}
		if m := resp.Statuses[0].CurrentLimit.GetUnitMultiplier(); m.GetValue() != tt.mult {
			t.Errorf("%s: current_limit.unit_multiplier %v, want %d", tt.name, m, tt.mult)
		}
	}
}

// With headers on, the limited descriptor with the least remaining is
// described in x-ratelimit-* headers for Envoy to add.
func TestResponseHeaders(t *testing.T) {
	e := newEnv(t, basicConfig, Options{Headers: true})
	e.owner.now.Add(int64(15 * time.Second))
	resp := e.call(t, "api", 0, desc("tenant", "hd"), desc("tenant", "hd"), desc("internal", "x"))
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	want := map[string]string{"x-ratelimit-limit": "3, 3;w=60", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "45"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// The limit that denied is described, not one that passed with as
	// little left. Was: the first with the least remaining, the passing
	// 3 per minute here.
	user := desc("plan", "free", "user", "hd")
	e.call(t, "api", 0, user) // its 1 per second spent
	tenant := desc("tenant", "hd2")
	tenant.HitsAddend = wrapperspb.UInt64(3)
	resp = e.call(t, "api", 0, tenant, user)
	if resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[1].Code != over {
		t.Fatalf("statuses %v, want OK with 0 left, then OVER_LIMIT", resp.Statuses)
	}
	got = map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	want = map[string]string{"x-ratelimit-limit": "1, 1;w=1", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("a denial: %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// Bad configs are refused with a message naming the file, the domain and
// the descriptor.
func TestConfigErrors(t *testing.T) {
	for _, tt := range []struct{ name, yaml, want string }{
		{"unit", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`rls config f.yaml: domain "d": descriptor "a.b_c": rate_limit: unit: invalid unit "fortnight"`},
		{"unknown field", "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
			`rls config f.yaml: domain "d": line 4: unknown field "rate_limt"`},
		{"no domain", "descriptors: []\n", `rls config f.yaml: domain: missing`},
		{"no key", "domain: d\ndescriptors:\n  - value: x\n", `rls config f.yaml: domain "d": descriptors[0]: key: missing`},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", `rls config f.yaml: domain "d": descriptor "a": duplicate descriptor`},
		// Rules are named by path: two descriptors of one path, or one of
		// an override's, would share a rule name.
		{"same path", "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n", `descriptor "a_b": another descriptor of this domain has the same path`},
		{"same nested path", "domain: d\ndescriptors:\n  - key: x.y\n  - key: x\n    descriptors:\n      - key: y\n", `descriptor "x.y": another descriptor of this domain has the same path`},
		{"override's name", "domain: d\ndescriptors:\n  - key: _override_30s\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `descriptor "_override_30s": descriptor keys beginning with "_override_" are reserved`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", `descriptor "a": rate_limit: unlimited: takes no unit`},
		{"algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n", `descriptor "a": rate_limit: algorithm: unknown algorithm "magic"`},
		{"too fast", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: second, requests_per_unit: 2000000, algorithm: gcra}\n", `descriptor "a": rate_limits[1]: requests_per_unit: 2000000 per 1s is over`},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: lim, replaces: [{name: lim}], unit: second, requests_per_unit: 1}\n", `descriptor "a": rate_limit: replaces: names its own limit "lim"`},
		{"negative", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "domain \"d\": line 4: cannot unmarshal !!int `-1` into a whole number from 0 to 4294967295"},
		{"not yaml", "domain: [\n", `rls config f.yaml: `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig(File{Name: "f.yaml", Data: []byte(tt.yaml)})
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseConfig = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	_, err := ParseConfig(File{Name: "a.yaml", Data: []byte("domain: d\n")}, File{Name: "b.yaml", Data: []byte("domain: d\n")})
	if err == nil || err.Error() != `rls config b.yaml: domain "d": duplicate domain (also in a.yaml)` {
		t.Fatalf("duplicate domain: %v", err)
	}
}

// A reload that fails keeps the config in force; fixing the file puts
// the new one in force; an unchanged file is not parsed again.
func TestBadReloadKeepsTheOldConfig(t *testing.T) {
	e := newEnv(t, basicConfig, Options{})
	path := e.srv.opts.ConfigPath
	e.run(t, []step{{"api", 0, desc("tenant", "r"), ok, 2, 3, false}})
	writeFile(t, path, strings.Replace(basicConfig, "unit: minute", "unit: minuet", 1))
	err := e.srv.Reload()
	if err == nil || !strings.Contains(err.Error(), path+`: domain "api": descriptor "tenant": rate_limit: unit: invalid unit "minuet"`) {
		t.Fatalf("bad reload: %v", err)
	}
	if again := e.srv.Reload(); again == nil || again.Error() != err.Error() {
		t.Fatalf("the same bad file again: %v", again)
	}
	e.run(t, []step{{"api", 0, desc("tenant", "r"), ok, 1, 3, false}}) // the old config, its counters
	if got := testutilValue(e, "error"); got != 1 {
		t.Fatalf("refused loads counted %v, want 1 (the same bad file is counted once)", got)
	}
	writeFile(t, path, strings.Replace(basicConfig, "requests_per_unit: 3", "requests_per_unit: 5", 1))
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	e.run(t, []step{{"api", 0, desc("tenant", "r"), ok, 2, 5, false}}) // new limit, same counter
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := testutilValue(e, "ok"); got != 2 {
		t.Fatalf("loads counted %v, want 2 (an unchanged file is not reloaded)", got)
	}
}

const burstAndMinute = `
domain: two
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 2}
      - {name: minute, unit: minute, requests_per_unit: 5}
`

// Two rate limits on one descriptor: hits the burst limit denies are
// not counted by the minute limit (issue 12), so the minute limit still
// has room for what the burst limit lets through later.
func TestSeveralRateLimitsCountNoDeniedHit(t *testing.T) {
	e := newEnv(t, burstAndMinute, Options{})
	u := desc("user", "bo")
	e.run(t, []step{
		{"two", 0, u, ok, 1, 2, false}, // burst 1 left, minute 4
		{"two", 0, u, ok, 0, 2, false}, // burst 0, minute 3
		{"two", 0, u, over, 0, 2, false},
		{"two", 0, u, over, 0, 2, false}, // minute still 3: the denied hits spent nothing
	})
	if q := e.call(t, "two", 0, queryOf(u)).Statuses[0]; q.LimitRemaining != 0 || q.CurrentLimit.Name != "burst" {
		t.Fatalf("query: %v, want the burst limit empty", q)
	}
	e.owner.now.Add(int64(time.Second))
	e.run(t, []step{
		{"two", 0, u, ok, 1, 2, false}, // burst 1, minute 2
		{"two", 0, u, ok, 0, 2, false}, // burst 0, minute 1
	})
	e.owner.now.Add(int64(time.Second))
	e.run(t, []step{
		{"two", 0, u, ok, 0, 5, false},   // burst 1, minute 0: the minute limit is decisive
		{"two", 0, u, over, 0, 5, false}, // the burst limit would admit; the minute limit denies
	})
}

// queryOf is d as a query (is_negative_hits: answered, nothing spent).
func queryOf(d *commonpb.RateLimitDescriptor) *commonpb.RateLimitDescriptor {
	q := &commonpb.RateLimitDescriptor{Entries: d.Entries, IsNegativeHits: true}
	return q
}
