package rls

import (
	"context"
	"errors"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends a *wireBytes as it is and decodes replies as gRPC does.
type rawCodec struct{ encoding.CodecV2 }

type wireBytes []byte

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*wireBytes); ok {
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// callRaw calls ShouldRateLimit with the request's wire form b.
func (e *env) callRaw(b []byte) (*rlspb.RateLimitResponse, error) {
	in, out := wireBytes(b), new(rlspb.RateLimitResponse)
	err := e.cc.Invoke(context.Background(), rlspb.RateLimitService_ShouldRateLimit_FullMethodName, &in, out,
		grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	return out, err
}

// A descriptor value that is not UTF-8 (Envoy sends a header's bytes as
// they are) is limited like any other, each such value its own counter.
// Was: the call failed (Internal: invalid UTF-8), and Envoy, failing
// open, allowed every one of them.
func TestNonUTF8DescriptorValueIsLimited(t *testing.T) {
	e := newEnv(t, `
domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`, Options{Headers: true})
	steps := []struct {
		value  string
		code   rlspb.RateLimitResponse_Code
		remain uint32
	}{
		{"caf\xe9", rlspb.RateLimitResponse_OK, 1},
		{"caf\xe9", rlspb.RateLimitResponse_OK, 0},
		{"caf\xe9", rlspb.RateLimitResponse_OVER_LIMIT, 0},
		{"caf\xff", rlspb.RateLimitResponse_OK, 1}, // another value, another counter
		{"café", rlspb.RateLimitResponse_OK, 1},    // and so is its UTF-8 spelling
		{"\x80", rlspb.RateLimitResponse_OK, 1},
		{"caf\xe9", rlspb.RateLimitResponse_OVER_LIMIT, 0},
	}
	for i, s := range steps {
		resp, err := e.callRaw(wireRequest("d", "user", s.value))
		if err != nil {
			t.Fatalf("step %d: ShouldRateLimit(user=%q): %v", i, s.value, err)
		}
		if st := resp.Statuses[0]; st.Code != s.code || st.LimitRemaining != s.remain {
			t.Errorf("step %d: ShouldRateLimit(user=%q) = %v remaining %d, want %v remaining %d", i, s.value, st.Code, st.LimitRemaining, s.code, s.remain)
		}
	}
	// detailed_metric's label is the value made UTF-8 (was: a panic,
	// since Prometheus refuses a label value that is not).
	if got := e.counter("d.user_caf\uFFFD", resultOver); got != 2 {
		t.Errorf("d.user_caf\\uFFFD over_limit counted %v, want 2", got)
	}
	// The other service on the server, and a malformed request, are as
	// they were.
	hc := healthpb.NewHealthClient(e.cc)
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v; want SERVING", r, err)
	}
	bad := wireRequest("d", "user", "caf\xe9")
	if _, err := e.callRaw(bad[:len(bad)-1]); status.Code(err) != codes.Internal {
		t.Fatalf("truncated request: %v, want Internal (as the standard codec answers)", err)
	}
}

// The codec decodes with the standard codec, and with
// decodeRateLimitRequest only a RateLimitRequest refused for its UTF-8.
func TestCodecFallsBackOnlyForInvalidUTF8(t *testing.T) {
	c := newCodec()
	if c.Name() != grpcproto.Name {
		t.Fatalf("Name() = %q, want %q", c.Name(), grpcproto.Name)
	}
	valid := wireRequest("d", "user", "café")
	latin1 := wireRequest("d", "user", "caf\xe9")
	health, err := proto.Marshal(&healthpb.HealthCheckRequest{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	health[len(health)-1] = 0xff // Service "\xff"
	for _, tc := range []struct {
		name    string
		b       []byte
		msg     proto.Message
		want    proto.Message // nil: an error
		wantStd bool          // the error is the standard codec's
	}{
		{"valid", valid, new(rlspb.RateLimitRequest), mustUnmarshal(t, valid), false},
		{"latin-1 value", latin1, new(rlspb.RateLimitRequest), request("d", "user", "caf\xe9"), false},
		{"latin-1 domain", wireRequest("\xe9", "k", "v"), new(rlspb.RateLimitRequest), request("\xe9", "k", "v"), false},
		{"truncated valid", valid[:len(valid)-1], new(rlspb.RateLimitRequest), nil, true},
		{"latin-1, then a truncated field", append(latin1[:len(latin1):len(latin1)], 0x1a, 0x05), new(rlspb.RateLimitRequest), nil, false},
		{"latin-1, then a bad tag", append(latin1[:len(latin1):len(latin1)], 0x07), new(rlspb.RateLimitRequest), nil, false},
		{"another message, not UTF-8", health, new(healthpb.HealthCheckRequest), nil, true},
	} {
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, tc.msg)
		stdErr := proto.Unmarshal(tc.b, proto.Clone(tc.msg))
		switch {
		case tc.want != nil && err != nil:
			t.Errorf("%s: Unmarshal: %v", tc.name, err)
		case tc.want != nil && !proto.Equal(tc.msg, tc.want):
			t.Errorf("%s: Unmarshal = %v, want %v", tc.name, tc.msg, tc.want)
		case tc.want == nil && err == nil:
			t.Errorf("%s: Unmarshal = %v, want an error", tc.name, tc.msg)
		case tc.want == nil && tc.wantStd && (stdErr == nil || err.Error() != stdErr.Error()):
			t.Errorf("%s: Unmarshal: %v, want the standard codec's %v", tc.name, err, stdErr)
		case tc.want == nil && !tc.wantStd && !errors.Is(err, errMalformed):
			t.Errorf("%s: Unmarshal: %v, want errMalformed", tc.name, err)
		}
	}
	// The fallback hangs on protobuf-go's error for a string that is not
	// UTF-8 saying so (InvalidUTF8() true).
	if err := proto.Unmarshal(latin1, new(rlspb.RateLimitRequest)); !isInvalidUTF8(err) {
		t.Fatalf("proto.Unmarshal of a value that is not UTF-8: %v, not recognized as such", err)
	}
	if err := proto.Unmarshal(valid[:len(valid)-1], new(rlspb.RateLimitRequest)); err == nil || isInvalidUTF8(err) {
		t.Fatalf("proto.Unmarshal of a truncated request: %v, taken for a UTF-8 error", err)
	}
	// Replies are marshalled by the standard codec.
	out, err := c.Marshal(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT})
	if err != nil {
		t.Fatal(err)
	}
	var resp rlspb.RateLimitResponse
	if err := proto.Unmarshal(out.Materialize(), &resp); err != nil || resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("Marshal: %v, %v", &resp, err)
	}
	out.Free()
}

func request(domain string, kv ...string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*commonpb.RateLimitDescriptor{desc(kv...)}}
}

func mustUnmarshal(t *testing.T, b []byte) *rlspb.RateLimitRequest {
	t.Helper()
	var m rlspb.RateLimitRequest
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}
