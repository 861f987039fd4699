package rls

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ringlimit/ringlimit/internal/clustertest"
)

// On a 3-member cluster, an RLS service on each member, one config: a
// descriptor's two rate limits share one counter each across the
// services, and the hits the burst limit denies are counted by neither
// (exact, whichever member answers). Fake time: the windows turn when
// the test sleeps.
func TestSeveralRateLimitsExactAcrossMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.New(t, 3, clustertest.Options{DeadAfter: time.Hour})
		cfg, err := ParseConfig(File{Name: "f.yaml", Data: []byte(burstAndMinute)})
		if err != nil {
			t.Fatal(err)
		}
		var svcs []*Service
		for _, m := range c.Members() {
			met, err := newMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			s := NewService(m.Router(), false, met)
			s.SetConfig(cfg)
			svcs = append(svcs, s)
		}
		call := 0
		hit := func() *rlspb.RateLimitResponse_DescriptorStatus {
			t.Helper()
			s := svcs[call%len(svcs)] // round robin over the members
			call++
			resp, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "two",
				Descriptors: []*commonpb.RateLimitDescriptor{desc("user", "cy")}})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Statuses[0]
		}
		// Start on a minute boundary, so both windows are fresh.
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)))
		want := func(code rlspb.RateLimitResponse_Code, remaining, limit uint32) {
			t.Helper()
			st := hit()
			if st.Code != code || st.LimitRemaining != remaining || st.CurrentLimit.RequestsPerUnit != limit {
				t.Fatalf("call %d: %v remaining %d limit %d; want %v remaining %d limit %d",
					call, st.Code, st.LimitRemaining, st.CurrentLimit.RequestsPerUnit, code, remaining, limit)
			}
		}
		want(ok, 1, 2)
		want(ok, 0, 2)
		for range 4 {
			want(over, 0, 2) // denied by the burst limit, counted by neither
		}
		time.Sleep(time.Second)
		want(ok, 1, 2) // the minute limit has 2 left, not 0
		want(ok, 0, 2)
		time.Sleep(time.Second)
		want(ok, 0, 5) // its 5th
		want(over, 0, 5)
	})
}
