package rls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
)

// FuzzParseConfig: no config file panics the loader; one that loads
// yields only valid inline rules, under the reserved prefix, with names
// that are stable (a second parse gives the same), within the bounds.
func FuzzParseConfig(f *testing.F) {
	examples, _, err := readConfig("testdata/examples")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range examples {
		f.Add(e.Data)
	}
	f.Add([]byte(basicConfig))
	f.Add([]byte("domain: x\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 2, algorithm: gcra, burst: 5, failure_mode: closed}\n      - {unit: day, requests_per_unit: 9}\n"))
	f.Add([]byte("domain: \"a/b#c\"\ndescriptors:\n  - key: \"k#\"\n    value: \"v w\"\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(File{Name: "f.yaml", Data: data})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "rls config f.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if c.Limits() > MaxLimits {
			t.Fatalf("%d limits", c.Limits())
		}
		var names []string
		for _, lv := range c.domains {
			walk(lv, func(l *limit) {
				for _, r := range l.rules {
					if err := r.Validate(); err != nil || !strings.HasPrefix(r.Name, rules.InlinePrefix) {
						t.Fatalf("rule %+v: %v", r, err)
					}
					names = append(names, r.Name)
				}
			})
		}
		again, err := ParseConfig(File{Name: "f.yaml", Data: data})
		if err != nil {
			t.Fatalf("parses once, then not: %v", err)
		}
		var names2 []string
		for _, lv := range again.domains {
			walk(lv, func(l *limit) {
				for _, r := range l.rules {
					names2 = append(names2, r.Name)
				}
			})
		}
		if fmt.Sprint(sortedCopy(names)) != fmt.Sprint(sortedCopy(names2)) {
			t.Fatalf("rule names differ between two parses: %v vs %v", names, names2)
		}
	})
}

func walk(lv *level, fn func(*limit)) {
	visit := func(n *descNode) {
		if n.limit != nil {
			fn(n.limit)
		}
		if n.children != nil {
			walk(n.children, fn)
		}
	}
	for _, n := range lv.exact {
		visit(n)
	}
	for _, n := range lv.anyValue {
		visit(n)
	}
	for _, p := range lv.prefix {
		visit(p.node)
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// strictChecker checks what the service asks of the router as the router
// and the owner would, and allows everything with cost ≤ 1.
type strictChecker struct{ t *testing.T }

func (c strictChecker) CheckBy(_ context.Context, _ time.Time, reqs []router.Request, out []router.Result) error {
	for i, q := range reqs {
		switch {
		case q.Inline == nil || q.Inline.Name != q.Rule || !strings.HasPrefix(q.Rule, rules.InlinePrefix):
			c.t.Fatalf("request %d: rule %q, inline %+v", i, q.Rule, q.Inline)
		case q.Inline.Validate() != nil:
			c.t.Fatalf("request %d: invalid inline rule %+v", i, q.Inline)
		case q.Key == "" || len(q.Key) > api.MaxKeyLen:
			c.t.Fatalf("request %d: key of %d bytes", i, len(q.Key))
		case !utf8.ValidString(q.Key):
			c.t.Fatalf("request %d: key %q is not UTF-8: the router refuses it", i, q.Key)
		case q.Inline.CheckCost(q.Cost) != nil:
			c.t.Fatalf("request %d: cost %d over %+v", i, q.Cost, q.Inline)
		}
		out[i] = router.Result{Decision: limiter.Decision{Allowed: q.Cost <= 1, Limit: q.Inline.Capacity(), Remaining: q.Inline.Capacity() - q.Cost}}
	}
	return nil
}

// FuzzShouldRateLimit: no request (any bytes that decode as a
// RateLimitRequest) panics the service; each is refused as an invalid
// argument or answered with one status per descriptor, OVER_LIMIT overall
// exactly when a descriptor is; what reaches the router is always valid.
func FuzzShouldRateLimit(f *testing.F) {
	add := func(domain string, hits uint32, ds ...*commonpb.RateLimitDescriptor) {
		b, err := proto.Marshal(&rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	add("messaging", 0, desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
	add("edge_proxy_per_ip", 7, desc("remote_address", "50.0.0.5"), desc("remote_address", "1.2.3.4"))
	add("example7", 1, desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
	add("example9", 0, desc("key1", "value_x"), desc("key1", strings.Repeat("v", 2000)))
	add("internal", 0, desc("ldap", ""), desc())
	add("extras", 3, desc("user", "u"))
	o := desc("x", "y")
	o.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typepb.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}
	o.HitsAddend = wrapperspb.UInt64(2)
	add("api", 0, o)
	add("", 0)

	files := []File{{Name: "extras.yaml", Data: []byte("domain: extras\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}\n      - {unit: day, requests_per_unit: 5, algorithm: sliding_log}\n")}}
	examples, _, err := readConfig("testdata/examples")
	if err != nil {
		f.Fatal(err)
	}
	files = append(files, examples...)
	files = append(files, File{Name: "basic.yaml", Data: []byte(basicConfig)})
	c, err := ParseConfig(files...)
	if err != nil {
		f.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlspb.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		svc := NewService(strictChecker{t}, true, m)
		svc.SetConfig(c)
		resp, err := svc.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument or an answer", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		anyOver := false
		for _, st := range resp.Statuses {
			anyOver = anyOver || st.Code == rlspb.RateLimitResponse_OVER_LIMIT
			if st.Code != rlspb.RateLimitResponse_OK && st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("status code %v", st.Code)
			}
		}
		if anyOver != (resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("overall %v with statuses %v", resp.OverallCode, resp.Statuses)
		}
	})
}
