package rls

import (
	"errors"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// codec is the RLS gRPC server's codec: gRPC's standard proto codec for
// every message of every service on the server, except that a
// RateLimitRequest the standard codec refuses only because a string
// field is not UTF-8 is decoded by decodeRateLimitRequest, which takes
// the bytes as they are.
//
// Envoy (C++ protobuf) sends descriptor values taken from request
// headers unchanged, bytes ≥ 0x80 included (envoyproxy/envoy#5141).
// protobuf-go refuses such a string field and has no option not to, so
// the whole call failed, and Envoy (failure_mode_deny: false by default)
// allowed it: one byte ≥ 0x80 in the header bypassed every limit. Such
// values are limited like any other (the counter's key is then hashed:
// Service.counterKey).
//
// A message that is malformed apart from its strings is refused as
// before: gRPC answers any codec error with codes.Internal, the code the
// standard codec's refusals get too.
//
// The zero value is not usable: newCodec. It is safe for concurrent use.
type codec struct {
	std encoding.CodecV2 // the codec gRPC uses for "proto"
}

func newCodec() codec {
	return codec{std: encoding.GetCodecV2(grpcproto.Name)}
}

func (c codec) Name() string { return c.std.Name() }

// Marshal is the standard codec's: no response field carries a
// request's string (statuses, limit names and header values come from
// the config and from numbers).
func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.std.Marshal(v) }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.std.Unmarshal(data, v)
	req, ok := v.(*rlspb.RateLimitRequest)
	if err == nil || !ok || !isInvalidUTF8(err) {
		return err
	}
	// data stays valid until Unmarshal returns (gRPC frees it then).
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return decodeRateLimitRequest(buf.ReadOnlyData(), req)
}

// isInvalidUTF8 reports whether err is protobuf-go's refusal of a string
// field that is not UTF-8: its error says so with an InvalidUTF8 method
// (google.golang.org/protobuf/internal/impl.errInvalidUTF8).
func isInvalidUTF8(err error) bool {
	var u interface{ InvalidUTF8() bool }
	return errors.As(err, &u) && u.InvalidUTF8()
}
