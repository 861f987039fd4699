package rls

import (
	"context"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A detailed_metric value that is not UTF-8 is counted under a label
// with U+FFFD for its invalid bytes. Was: a panic (Prometheus refuses
// the label value), which ended the process.
func TestDetailedMetricOfNonUTF8Value(t *testing.T) {
	e := newEnv(t, `
domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`, Options{})
	for _, v := range []string{"caf\xe9", "caf\xe9", "caf\xff"} {
		req := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*commonpb.RateLimitDescriptor{desc("user", v)}}
		if _, err := e.srv.Service().ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatalf("ShouldRateLimit(user=%q): %v", v, err)
		}
	}
	if got := e.counter("d.user_caf\uFFFD", resultWithin); got != 2 {
		t.Errorf("d.user_caf\\uFFFD within_limit counted %v, want 2", got)
	}
	if got := e.counter("d.user_caf\uFFFD", resultOver); got != 1 {
		t.Errorf("d.user_caf\\uFFFD over_limit counted %v, want 1", got)
	}
}
