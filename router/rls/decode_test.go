package rls

import (
	"errors"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzDecodeRateLimitRequest: decodeRateLimitRequest never panics and
// decodes as protobuf-go does. Where proto.Unmarshal succeeds, it
// succeeds with a proto.Equal message; where proto.Unmarshal refuses the
// wire data for another reason than UTF-8, it refuses it too. And for
// every input, strings not UTF-8 included, it agrees with protobuf-go
// decoding the same bytes under a copy of the schema whose string fields
// are bytes (which protobuf-go takes as they are): both refuse, or both
// give the same fields and unknown fields.
func FuzzDecodeRateLimitRequest(f *testing.F) {
	add := func(m *rlspb.RateLimitRequest, extra ...byte) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append(b, extra...))
	}
	o := desc("x", "y", "z", "")
	o.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typepb.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}
	o.HitsAddend = wrapperspb.UInt64(1 << 40)
	o.IsNegativeHits = true
	add(&rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{o, desc("path", "/login")}, HitsAddend: 7})
	add(&rlspb.RateLimitRequest{Domain: "d"}, 0x12, 0x00) // an empty descriptor
	// Unknown fields: a varint (9), a group (10) holding a fixed32, a
	// fixed64 (11); the override twice (merged).
	add(&rlspb.RateLimitRequest{Domain: "d", Descriptors: []*commonpb.RateLimitDescriptor{o}},
		0x48, 0x01, 0x53, 0x0d, 1, 2, 3, 4, 0x54, 0x59, 1, 2, 3, 4, 5, 6, 7, 8,
		0x12, 0x06, 0x12, 0x04, 0x08, 0x05, 0x10, 0x03)
	f.Add(wireRequest("d", "user", "caf\xe9"))
	f.Add(wireRequest("\xff\xfe", "\x80", "caf\xe9", "k", "v"))
	f.Add([]byte{0x0a, 0x01, 0xe9, 0x1a, 0x05}) // not UTF-8, then truncated
	f.Add([]byte{0x0c})                         // a lone end group

	bytesTyped := bytesTypedRequest(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ours rlspb.RateLimitRequest
		err := decodeRateLimitRequest(b, &ours)
		if err != nil && !errors.Is(err, errMalformed) {
			t.Fatalf("error %v does not wrap errMalformed", err)
		}

		var std rlspb.RateLimitRequest
		switch stdErr := proto.Unmarshal(b, &std); {
		case stdErr == nil && err != nil:
			t.Fatalf("proto.Unmarshal decodes %v, decodeRateLimitRequest: %v", &std, err)
		case stdErr == nil && !proto.Equal(&std, &ours):
			t.Fatalf("decodeRateLimitRequest = %v, proto.Unmarshal = %v", &ours, &std)
		case stdErr != nil && !isInvalidUTF8(stdErr) && err == nil:
			t.Fatalf("proto.Unmarshal: %v, decodeRateLimitRequest decodes %v", stdErr, &ours)
		}

		want := dynamicpb.NewMessage(bytesTyped)
		wantErr := proto.Unmarshal(b, want)
		canonicalTags(want)
		switch {
		case (wantErr == nil) != (err == nil):
			t.Fatalf("with bytes for strings, proto.Unmarshal: %v; decodeRateLimitRequest: %v", wantErr, err)
		case err == nil && !proto.Equal(want, toDynamic(ours.ProtoReflect(), bytesTyped)):
			t.Fatalf("decodeRateLimitRequest = %v, with bytes for strings proto.Unmarshal = %v", &ours, want)
		}
	})
}

// wireRequest is a RateLimitRequest's wire form, written by hand as
// Envoy's C++ protobuf writes it: strings as they are, UTF-8 or not
// (protobuf-go refuses to marshal those). kv are one descriptor's
// entries, key then value.
func wireRequest(domain string, kv ...string) []byte {
	var d []byte
	for i := 0; i+1 < len(kv); i += 2 {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, kv[i])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, kv[i+1])
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendBytes(d, e)
	}
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, d)
}

// bytesTypedRequest returns RateLimitRequest's descriptor in a schema
// where every string field of the RLS files is bytes.
func bytesTypedRequest(tb testing.TB) protoreflect.MessageDescriptor {
	tb.Helper()
	files := new(protoregistry.Files)
	for _, fd := range []protoreflect.FileDescriptor{
		commonpb.File_envoy_extensions_common_ratelimit_v3_ratelimit_proto,
		rlspb.File_envoy_service_ratelimit_v3_rls_proto,
	} {
		fdp := protodesc.ToFileDescriptorProto(fd)
		for _, m := range fdp.MessageType {
			stringsToBytes(m)
		}
		f, err := protodesc.NewFile(fdp, localFirst{files})
		if err != nil {
			tb.Fatal(err)
		}
		if err := files.RegisterFile(f); err != nil {
			tb.Fatal(err)
		}
	}
	d, err := files.FindDescriptorByName("envoy.service.ratelimit.v3.RateLimitRequest")
	if err != nil {
		tb.Fatal(err)
	}
	return d.(protoreflect.MessageDescriptor)
}

func stringsToBytes(m *descriptorpb.DescriptorProto) {
	for _, f := range m.Field {
		if f.GetType() == descriptorpb.FieldDescriptorProto_TYPE_STRING {
			f.Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
		}
	}
	for _, n := range m.NestedType {
		stringsToBytes(n)
	}
}

// localFirst resolves in its files, then in the global registry.
type localFirst struct{ *protoregistry.Files }

func (r localFirst) FindFileByPath(p string) (protoreflect.FileDescriptor, error) {
	if f, err := r.Files.FindFileByPath(p); err == nil {
		return f, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(p)
}

func (r localFirst) FindDescriptorByName(n protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.Files.FindDescriptorByName(n); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(n)
}

// canonicalTags rewrites the tags of the unknown fields of m and of its
// messages as protowire writes them. protobuf-go's decoder of generated
// messages does (and so does decodeRateLimitRequest); its reflective one,
// dynamicpb's, keeps a tag written in more bytes than it needs as it
// came.
func canonicalTags(m protoreflect.Message) {
	if u := m.GetUnknown(); len(u) > 0 {
		var c []byte
		for len(u) > 0 {
			num, typ, n := protowire.ConsumeTag(u)
			v := protowire.ConsumeFieldValue(num, typ, u[n:])
			c = protowire.AppendTag(c, num, typ)
			c = append(c, u[n:n+v]...)
			u = u[n+v:]
		}
		m.SetUnknown(c)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				canonicalTags(v.List().Get(i).Message())
			}
		default:
			canonicalTags(v.Message())
		}
		return true
	})
}

// toDynamic copies src into a message of md, a schema of the same field
// numbers whose string fields may be bytes.
func toDynamic(src protoreflect.Message, md protoreflect.MessageDescriptor) *dynamicpb.Message {
	dst := dynamicpb.NewMessage(md)
	conv := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
		switch {
		case fd.Message() != nil:
			return protoreflect.ValueOfMessage(toDynamic(v.Message(), fd.Message()))
		case fd.Kind() == protoreflect.BytesKind:
			if s, ok := v.Interface().(string); ok {
				return protoreflect.ValueOfBytes([]byte(s))
			}
		}
		return v
	}
	src.Range(func(sfd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fd := md.Fields().ByNumber(sfd.Number())
		if fd.IsList() {
			l := dst.Mutable(fd).List()
			for i := range v.List().Len() {
				l.Append(conv(fd, v.List().Get(i)))
			}
			return true
		}
		dst.Set(fd, conv(fd, v))
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	return dst
}

// protowire's field numbers past MaxValidNumber parse as a tag, and
// protobuf-go refuses them: so does the decoder.
func TestDecodeRefusesFieldNumbersPastTheMax(t *testing.T) {
	for _, num := range []protowire.Number{protowire.MaxValidNumber, protowire.MaxValidNumber + 1} {
		b := protowire.AppendTag(nil, num, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		err := decodeRateLimitRequest(b, new(rlspb.RateLimitRequest))
		stdErr := proto.Unmarshal(b, new(rlspb.RateLimitRequest))
		if (err == nil) != (stdErr == nil) {
			t.Errorf("field %d: decodeRateLimitRequest: %v; proto.Unmarshal: %v", num, err, stdErr)
		}
	}
}
