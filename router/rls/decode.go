package rls

import (
	"errors"
	"fmt"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// errMalformed: the bytes are not a RateLimitRequest in the protobuf
// wire format.
var errMalformed = errors.New("rls: malformed RateLimitRequest")

// decodeRateLimitRequest decodes b into m (reset first) as proto.Unmarshal
// does, but keeps string fields that are not UTF-8 as they are (a Go
// string holds any bytes). Where proto.Unmarshal succeeds, the result is
// proto.Equal to its (FuzzDecodeRateLimitRequest): a field repeated
// on the wire is the last one for a scalar and merged for a message, a
// known field of another wire type is an unknown field, and unknown
// fields are kept (tag re-encoded) as protobuf-go keeps them. Wire data
// that proto.Unmarshal refuses for any reason but UTF-8 is an error
// wrapping errMalformed.
//
// It walks b once, allocating at most in proportion to len(b) (gRPC
// bounds a message: New's MaxRecvMsgSize); the message nests four deep
// at most, and unknown groups are bounded by protowire's recursion limit.
func decodeRateLimitRequest(b []byte, m *rlspb.RateLimitRequest) error {
	proto.Reset(m)
	return decodeMessage(b, m.ProtoReflect(), func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			m.Domain = string(v)
			return n, nil
		case num == 2 && typ == protowire.BytesType:
			d := new(commonpb.RateLimitDescriptor)
			m.Descriptors = append(m.Descriptors, d)
			return decodeNested(b, func(b []byte) error { return decodeDescriptor(b, d) })
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.HitsAddend = uint32(v)
			return n, nil
		}
		return 0, nil
	})
}

// decodeDescriptor merges b into d.
func decodeDescriptor(b []byte, d *commonpb.RateLimitDescriptor) error {
	return decodeMessage(b, d.ProtoReflect(), func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := new(commonpb.RateLimitDescriptor_Entry)
			d.Entries = append(d.Entries, e)
			return decodeNested(b, func(b []byte) error { return decodeEntry(b, e) })
		case num == 2 && typ == protowire.BytesType:
			if d.Limit == nil {
				d.Limit = new(commonpb.RateLimitDescriptor_RateLimitOverride)
			}
			return decodeNested(b, func(b []byte) error { return decodeOverride(b, d.Limit) })
		case num == 3 && typ == protowire.BytesType:
			if d.HitsAddend == nil {
				d.HitsAddend = new(wrapperspb.UInt64Value)
			}
			w := d.HitsAddend
			return decodeNested(b, func(b []byte) error {
				return decodeVarintWrapper(b, w.ProtoReflect(), func(v uint64) { w.Value = v })
			})
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			d.IsNegativeHits = protowire.DecodeBool(v)
			return n, nil
		}
		return 0, nil
	})
}

// decodeEntry merges b into e.
func decodeEntry(b []byte, e *commonpb.RateLimitDescriptor_Entry) error {
	return decodeMessage(b, e.ProtoReflect(), func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || num != 1 && num != 2 {
			return 0, nil
		}
		v, n := protowire.ConsumeBytes(b)
		if num == 1 {
			e.Key = string(v)
		} else {
			e.Value = string(v)
		}
		return n, nil
	})
}

// decodeOverride merges b into o.
func decodeOverride(b []byte, o *commonpb.RateLimitDescriptor_RateLimitOverride) error {
	return decodeMessage(b, o.ProtoReflect(), func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			o.RequestsPerUnit = uint32(v)
			return n, nil
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			o.Unit = typepb.RateLimitUnit(int32(v)) // an enum is an int32
			return n, nil
		case num == 3 && typ == protowire.BytesType:
			if o.UnitMultiplier == nil {
				o.UnitMultiplier = new(wrapperspb.UInt32Value)
			}
			w := o.UnitMultiplier
			return decodeNested(b, func(b []byte) error {
				return decodeVarintWrapper(b, w.ProtoReflect(), func(v uint64) { w.Value = uint32(v) })
			})
		}
		return 0, nil
	})
}

// decodeVarintWrapper merges b, a google.protobuf.UInt32Value or
// UInt64Value, into m, setting its value (field 1) with set.
func decodeVarintWrapper(b []byte, m protoreflect.Message, set func(uint64)) error {
	return decodeMessage(b, m, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num != 1 || typ != protowire.VarintType {
			return 0, nil
		}
		v, n := protowire.ConsumeVarint(b)
		set(v)
		return n, nil
	})
}

// decodeNested decodes the length-prefixed message at the start of b
// with decode and returns the bytes it took.
func decodeNested(b []byte, decode func([]byte) error) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	return n, decode(v)
}

// decodeMessage walks the fields of b, a message's wire form. field is
// called with each field's number, wire type and the bytes after its
// tag; it decodes a field it knows and returns the bytes it took (a
// protowire error code, < 0, for bad wire data), or 0 for a field it does
// not know, which is then kept in m's unknown fields.
func decodeMessage(b []byte, m protoreflect.Message, field func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: field number %d", errMalformed, num)
		}
		b = b[n:]
		n, err := field(num, typ, b)
		if err != nil {
			return err
		}
		if n == 0 {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				unknown = protowire.AppendTag(unknown, num, typ)
				unknown = append(unknown, b[:n]...)
			}
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	if unknown != nil {
		m.SetUnknown(append(m.GetUnknown(), unknown...))
	}
	return nil
}
