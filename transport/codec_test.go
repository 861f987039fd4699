package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
	"unsafe"

	"pgregory.net/rapid"
)

func genRequest(t *rapid.T) BatchRequest {
	// Few rules usually (the common case), sometimes more than the
	// encoder's linear table holds.
	rules := rapid.SliceOfN(rapid.StringN(0, 12, 48), 1, 40).Draw(t, "rules")
	if rapid.Bool().Draw(t, "fewRules") {
		rules = rules[:min(len(rules), 3)]
	}
	inline := rapid.Bool().Draw(t, "inline") // some batches carry inline rules (version 2)
	joined := rapid.Bool().Draw(t, "joined") // some batches have groups (version 5)
	check := rapid.Custom(func(t *rapid.T) Check {
		c := Check{
			Rule:      rapid.SampledFrom(rules).Draw(t, "rule"),
			KeyHash:   rapid.Uint64().Draw(t, "keyHash"),
			Partition: rapid.Uint32().Draw(t, "partition"),
			Cost:      rapid.Uint64().Draw(t, "cost"),
		}
		if inline && rapid.Bool().Draw(t, "hasInline") {
			c.Inline = InlineRule{
				Algorithm:   rapid.Uint8Range(1, 255).Draw(t, "algorithm"),
				FailureMode: rapid.Uint8().Draw(t, "failureMode"),
				Limit:       rapid.Int64().Draw(t, "limit"),
				Period:      time.Duration(rapid.Int64().Draw(t, "period")),
				Burst:       rapid.Int64().Draw(t, "burst"),
			}
		}
		if joined {
			c.Joined = rapid.Bool().Draw(t, "joinedCheck")
		}
		return c
	})
	req := BatchRequest{
		Epoch:  rapid.Uint64().Draw(t, "epoch"),
		Checks: rapid.SliceOfN(check, 0, 200).Draw(t, "checks"),
	}
	if len(req.Checks) > 0 {
		req.Checks[0].Joined = false // the first check has no group to join
	}
	if rapid.Bool().Draw(t, "hasRulesVersion") {
		req.RulesVersion = rapid.Uint64().Draw(t, "rulesVersion")
	}
	return req
}

func genResponse(t *rapid.T) BatchResponse {
	result := rapid.Custom(func(t *rapid.T) Result {
		return Result{
			Status:     Status(rapid.IntRange(0, int(maxStatus)).Draw(t, "status")),
			Allowed:    rapid.Bool().Draw(t, "allowed"),
			Limit:      rapid.Int64().Draw(t, "limit"),
			Remaining:  rapid.Int64().Draw(t, "remaining"),
			ResetAfter: time.Duration(rapid.Int64().Draw(t, "resetAfter")),
			RetryAfter: time.Duration(rapid.Int64().Draw(t, "retryAfter")),
			Delay:      time.Duration(rapid.Int64().Draw(t, "delay")),
		}
	})
	return BatchResponse{
		Epoch:   rapid.Uint64().Draw(t, "epoch"),
		Results: rapid.SliceOfN(result, 0, 200).Draw(t, "results"),
	}
}

func sameChecks(a, b []Check) bool { return slices.Equal(a, b) }

func sameResults(a, b []Result) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The decoder is reused across iterations, as a server worker reuses it, so
// that capacity reuse and name interning across frames are exercised too.
// A request with a rules version travels as version 3 (4 with inline
// rules) and decodes to the same version; without one it stays version 1.
func TestRequestRulesVersion(t *testing.T) {
	for _, inline := range []bool{false, true} {
		req := &BatchRequest{Epoch: 7, RulesVersion: 42, Checks: []Check{{Rule: "r", KeyHash: 1, Partition: 2, Cost: 3}}}
		want := uint8(RulesVersionVersion)
		if inline {
			req.Checks[0].Inline = InlineRule{Algorithm: 1, Limit: 5, Period: time.Second, Burst: 5}
			want = InlineRulesVersionVersion
		}
		frame := AppendBatchRequest(nil, 1, 0, req)
		if frame[4] != want {
			t.Fatalf("inline=%v: version %d, want %d", inline, frame[4], want)
		}
		var got BatchRequest
		if _, _, err := DecodeBatchRequest(frame, &got); err != nil {
			t.Fatal(err)
		}
		if got.Epoch != 7 || got.RulesVersion != 42 || len(got.Checks) != 1 || got.Checks[0] != req.Checks[0] {
			t.Fatalf("inline=%v: decoded %+v, want %+v", inline, got, req)
		}
	}
	if v := AppendBatchRequest(nil, 1, 0, &BatchRequest{Epoch: 7, Checks: []Check{{Rule: "r"}}})[4]; v != ProtocolVersion {
		t.Fatalf("no rules version: frame version %d, want %d", v, ProtocolVersion)
	}
}

func TestRequestRoundTrip(t *testing.T) {
	var got BatchRequest
	rapid.Check(t, func(t *rapid.T) {
		req := genRequest(t)
		id := rapid.Uint64().Draw(t, "id")
		deadline := time.Duration(rapid.Int64Range(0, math.MaxInt64).Draw(t, "deadline"))
		prefix := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "prefix")

		frame := AppendBatchRequest(bytes.Clone(prefix), id, deadline, &req)
		if !bytes.Equal(frame[:len(prefix)], prefix) {
			t.Fatalf("AppendBatchRequest changed dst's existing bytes")
		}
		frame = frame[len(prefix):]
		gotID, gotDeadline, err := DecodeBatchRequest(frame, &got)
		if err != nil {
			t.Fatalf("DecodeBatchRequest: %v", err)
		}
		if gotID != id || gotDeadline != deadline || got.Epoch != req.Epoch || !sameChecks(got.Checks, req.Checks) {
			t.Fatalf("DecodeBatchRequest = id %d, deadline %v, %+v; want id %d, deadline %v, %+v",
				gotID, gotDeadline, got, id, deadline, req)
		}
	})
}

func TestResponseRoundTrip(t *testing.T) {
	var got BatchResponse
	rapid.Check(t, func(t *rapid.T) {
		resp := genResponse(t)
		id := rapid.Uint64().Draw(t, "id")
		frame := AppendBatchResponse(nil, id, &resp)
		gotID, err := DecodeBatchResponse(frame, &got)
		if err != nil {
			t.Fatalf("DecodeBatchResponse: %v", err)
		}
		if gotID != id || got.Epoch != resp.Epoch || !sameResults(got.Results, resp.Results) {
			t.Fatalf("DecodeBatchResponse = id %d, %+v; want id %d, %+v", gotID, got, id, resp)
		}
	})
}

func TestErrorRoundTrip(t *testing.T) {
	long := string(bytes.Repeat([]byte("x"), 2*maxErrorMessage))
	for _, msg := range []string{"", "boom", long} {
		frame := AppendError(nil, 7, CodeMalformed, msg)
		id, rerr, err := DecodeError(frame)
		if err != nil {
			t.Fatalf("DecodeError(%d-byte message): %v", len(msg), err)
		}
		want := msg[:min(len(msg), maxErrorMessage)]
		if id != 7 || rerr.Code != CodeMalformed || rerr.Message != want {
			t.Errorf("DecodeError = %d, %+v; want 7, code %v, %d-byte message", id, rerr, CodeMalformed, len(want))
		}
	}
}

func TestNegativeDeadlineClamped(t *testing.T) {
	frame := AppendBatchRequest(nil, 1, -time.Second, &BatchRequest{})
	var req BatchRequest
	_, deadline, err := DecodeBatchRequest(frame, &req)
	if err != nil || deadline != 1 {
		t.Fatalf("DecodeBatchRequest(deadline -1s) = %v, %v; want 1ns (spent), nil", deadline, err)
	}
}

func TestUnknownStatusEncodedAsInternal(t *testing.T) {
	resp := BatchResponse{Results: []Result{{Status: 200, Allowed: true}}}
	var got BatchResponse
	if _, err := DecodeBatchResponse(AppendBatchResponse(nil, 1, &resp), &got); err != nil {
		t.Fatal(err)
	}
	if got.Results[0].Status != StatusInternal {
		t.Errorf("status 200 decoded as %v, want %v", got.Results[0].Status, StatusInternal)
	}
}

func batchOf(n int, rules ...string) *BatchRequest {
	req := &BatchRequest{Epoch: 42, Checks: make([]Check, n)}
	for i := range req.Checks {
		req.Checks[i] = Check{Rule: rules[i%len(rules)], KeyHash: uint64(i) * 0x9E3779B97F4A7C15, Partition: uint32(i % 1024), Cost: 1}
	}
	return req
}

// A batch of 1000 checks on 2 rules allocates the 2 rule strings (and the
// slices) once; decoding into the same BatchRequest again allocates nothing.
func TestDecodeInternsRuleNames(t *testing.T) {
	frame := AppendBatchRequest(nil, 1, 0, batchOf(1000, "login", "api"))
	var req BatchRequest
	allocs := testing.AllocsPerRun(1, func() {
		req = BatchRequest{}
		if _, _, err := DecodeBatchRequest(frame, &req); err != nil {
			t.Fatal(err)
		}
	})
	// Checks slice, names slice, 2 strings.
	if allocs > 4 {
		t.Errorf("decoding into a fresh request: %v allocs, want ≤ 4", allocs)
	}
	byName := map[string]*byte{}
	for _, c := range req.Checks {
		p := unsafe.StringData(c.Rule)
		if q, ok := byName[c.Rule]; ok && q != p {
			t.Fatalf("rule %q decoded into distinct strings", c.Rule)
		}
		byName[c.Rule] = p
	}
	allocs = testing.AllocsPerRun(100, func() {
		if _, _, err := DecodeBatchRequest(frame, &req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("decoding into a reused request: %v allocs, want 0", allocs)
	}
	// Same names in another order: still reused.
	frame2 := AppendBatchRequest(nil, 2, 0, batchOf(10, "api", "login"))
	allocs = testing.AllocsPerRun(100, func() {
		for _, f := range [][]byte{frame, frame2} {
			if _, _, err := DecodeBatchRequest(f, &req); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("decoding reordered names into a reused request: %v allocs, want 0", allocs)
	}
}

func TestEncodeAllocs(t *testing.T) {
	req := batchOf(1000, "login", "api")
	resp := &BatchResponse{Results: make([]Result, 1000)}
	buf := AppendBatchRequest(nil, 1, time.Second, req)
	if a := testing.AllocsPerRun(100, func() { buf = AppendBatchRequest(buf[:0], 1, time.Second, req) }); a != 0 {
		t.Errorf("AppendBatchRequest into a reused buffer: %v allocs, want 0", a)
	}
	buf = AppendBatchResponse(buf[:0], 1, resp)
	if a := testing.AllocsPerRun(100, func() { buf = AppendBatchResponse(buf[:0], 1, resp) }); a != 0 {
		t.Errorf("AppendBatchResponse into a reused buffer: %v allocs, want 0", a)
	}
}

// frameWith builds a request frame by hand: header fields and a raw body.
func frameWith(version uint8, typ FrameType, body []byte) []byte {
	f := binary.LittleEndian.AppendUint32(nil, uint32(HeaderSize-lenPrefix+len(body)))
	f = append(f, version, byte(typ))
	f = binary.LittleEndian.AppendUint64(f, 9)
	return append(f, body...)
}

func TestDecodeMalformed(t *testing.T) {
	valid := AppendBatchRequest(nil, 9, time.Second, batchOf(3, "a", "b"))
	validResp := AppendBatchResponse(nil, 9, &BatchResponse{Results: make([]Result, 3)})

	// Request body: deadline 0, epoch 0, n checks, name table offset.
	body := func(n uint64, off uint32, rest ...byte) []byte {
		b := binary.AppendUvarint([]byte{0, 0}, n)
		b = binary.LittleEndian.AppendUint32(b, off)
		return append(b, rest...)
	}
	hugeCount := frameWith(ProtocolVersion, FrameBatchRequest, body(60000, HeaderSize+2+3+4, 0))
	lengthLies := bytes.Clone(valid)
	binary.LittleEndian.PutUint32(lengthLies, 1<<31)
	trailing := append(bytes.Clone(valid), 0)
	binary.LittleEndian.PutUint32(trailing, binary.LittleEndian.Uint32(trailing)+1)
	badIndex := frameWith(ProtocolVersion, FrameBatchRequest,
		body(1, HeaderSize+1+1+1+4+11, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'a'))
	manyNames := frameWith(ProtocolVersion, FrameBatchRequest, body(0, HeaderSize+1+1+1+4, 1, 0))
	overlongVarint := frameWith(ProtocolVersion, FrameBatchRequest,
		bytes.Repeat([]byte{0xff}, 11))
	badStatus := frameWith(ProtocolVersion, FrameBatchResponse, []byte{0, 1, 99 << 1, 0, 0, 0, 0, 0})
	respHugeCount := frameWith(ProtocolVersion, FrameBatchResponse, binary.AppendUvarint([]byte{0}, 60000))
	respTooMany := frameWith(ProtocolVersion, FrameBatchResponse, binary.AppendUvarint([]byte{0}, 1<<20))
	withInline := AppendBatchRequest(nil, 9, 0, &BatchRequest{Checks: []Check{{Rule: "rls:x", Inline: InlineRule{Algorithm: 4, Limit: 5, Period: time.Second}}}})
	inlineCut := withInline[:len(withInline)-1]
	joined := AppendBatchRequest(nil, 9, 0, &BatchRequest{Checks: []Check{{Rule: "a"}, {Rule: "a", Joined: true}}})
	firstJoined := bytes.Clone(joined)
	firstJoined[HeaderSize+1+1+1+1+4] |= 1 // flags, deadline, epoch, count, offset: the first name index
	unknownFlags := bytes.Clone(joined)
	unknownFlags[HeaderSize] |= 0x80
	binary.LittleEndian.PutUint32(inlineCut, uint32(len(inlineCut)-lenPrefix))

	tests := []struct {
		name  string
		frame []byte
		resp  bool // decode as a response
		as    any  // a typed error errors.As must find, if any
	}{
		{name: "empty", frame: nil},
		{name: "short header", frame: valid[:HeaderSize-1]},
		{name: "length prefix lies", frame: lengthLies},
		{name: "trailing byte", frame: trailing},
		{name: "bad version", frame: frameWith(9, FrameBatchRequest, valid[HeaderSize:]), as: new(*UnsupportedVersionError)},
		{name: "version 0", frame: frameWith(0, FrameBatchRequest, valid[HeaderSize:]), as: new(*UnsupportedVersionError)},
		{name: "unknown type", frame: frameWith(ProtocolVersion, 77, valid[HeaderSize:]), as: new(*UnknownFrameTypeError)},
		{name: "response as request", frame: validResp, as: new(*UnknownFrameTypeError)},
		{name: "request as response", frame: valid, resp: true, as: new(*UnknownFrameTypeError)},
		{name: "count larger than bytes", frame: hugeCount},
		{name: "too many checks", frame: frameWith(ProtocolVersion, FrameBatchRequest, body(1<<20, 0)), as: new(*TooManyChecksError)},
		{name: "name index out of range", frame: badIndex},
		{name: "more names than checks", frame: manyNames},
		{name: "overlong varint", frame: overlongVarint},
		{name: "unknown status", frame: badStatus, resp: true},
		{name: "result count larger than bytes", frame: respHugeCount, resp: true},
		{name: "too many results", frame: respTooMany, resp: true, as: new(*TooManyChecksError)},
		{name: "version 2 response", frame: frameWith(InlineVersion, FrameBatchResponse, validResp[HeaderSize:]), resp: true, as: new(*UnsupportedVersionError)},
		{name: "inline rule cut short", frame: inlineCut},
		{name: "first check joined", frame: firstJoined},
		{name: "unknown flags", frame: unknownFlags},
		{name: "version 5 response", frame: frameWith(JoinedVersion, FrameBatchResponse, validResp[HeaderSize:]), resp: true, as: new(*UnsupportedVersionError)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req BatchRequest
			var resp BatchResponse
			var err error
			if tt.resp {
				_, err = DecodeBatchResponse(tt.frame, &resp)
			} else {
				_, _, err = DecodeBatchRequest(tt.frame, &req)
			}
			t.Logf("decode: %v", err)
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("decode = %v, want an error wrapping ErrMalformedFrame", err)
			}
			if tt.as != nil && !errors.As(err, tt.as) {
				t.Errorf("decode = %v, want %T", err, tt.as)
			}
			if cap(req.Checks) > 0 || cap(resp.Results) > 0 {
				t.Errorf("decode of a malformed frame allocated %d checks / %d results", cap(req.Checks), cap(resp.Results))
			}
		})
	}
}

// Every proper prefix of a valid frame, with its length prefix fixed up or
// not, fails to decode.
func TestDecodeTruncated(t *testing.T) {
	frames := map[string][]byte{
		"request":  AppendBatchRequest(nil, 9, time.Second, batchOf(5, "rule-a", "rule-b")),
		"response": AppendBatchResponse(nil, 9, &BatchResponse{Epoch: 300, Results: make([]Result, 5)}),
	}
	for name, frame := range frames {
		for n := range len(frame) {
			for _, fix := range []bool{false, true} {
				f := bytes.Clone(frame[:n])
				if fix && n >= lenPrefix {
					binary.LittleEndian.PutUint32(f, uint32(n-lenPrefix))
				}
				var err error
				if name == "request" {
					_, _, err = DecodeBatchRequest(f, new(BatchRequest))
				} else {
					_, err = DecodeBatchResponse(f, new(BatchResponse))
				}
				if !errors.Is(err, ErrMalformedFrame) {
					t.Errorf("%s cut to %d of %d bytes (length fixed: %v): err = %v, want ErrMalformedFrame", name, n, len(frame), fix, err)
				}
			}
		}
	}
}

func TestReadFrame(t *testing.T) {
	valid := AppendBatchRequest(nil, 9, 0, batchOf(3, "a"))
	huge := binary.LittleEndian.AppendUint32(nil, math.MaxUint32)
	tiny := binary.LittleEndian.AppendUint32(nil, 3)
	tests := []struct {
		name    string
		in      []byte
		wantErr error // errors.Is target; nil = success
	}{
		{"one frame", valid, nil},
		{"empty stream", nil, nil}, // io.EOF, checked below
		{"huge length", append(huge, 1, 2, 3), ErrMalformedFrame},
		{"length below header", append(tiny, 1, 2, 3), ErrMalformedFrame},
		{"body cut", valid[:len(valid)-1], nil}, // io.ErrUnexpectedEOF
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf []byte
			got, err := Limits{MaxFrameSize: 1 << 10}.ReadFrame(bytes.NewReader(tt.in), buf)
			switch tt.name {
			case "one frame":
				if err != nil || !bytes.Equal(got, valid) {
					t.Fatalf("ReadFrame = %d bytes, %v; want the frame", len(got), err)
				}
			case "empty stream":
				if err == nil || err.Error() != "EOF" {
					t.Fatalf("ReadFrame = %v, want io.EOF", err)
				}
			case "body cut":
				if err == nil || err.Error() != "unexpected EOF" {
					t.Fatalf("ReadFrame = %v, want io.ErrUnexpectedEOF", err)
				}
			default:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ReadFrame = %v, want %v", err, tt.wantErr)
				}
				if cap(got) > 64 {
					t.Errorf("ReadFrame grew its buffer to %d for a rejected length", cap(got))
				}
			}
		})
	}
	var tooLarge *FrameTooLargeError
	_, err := Limits{MaxFrameSize: 1 << 10}.ReadFrame(bytes.NewReader(append(huge, 0)), nil)
	if !errors.As(err, &tooLarge) || tooLarge.Limit != 1<<10 {
		t.Errorf("ReadFrame(huge) = %v, want *FrameTooLargeError{Limit: 1024}", err)
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		l    Limits
		want bool
	}{
		{Limits{}, true},
		{DefaultLimits(), true},
		{Limits{MaxFrameSize: 100}, false},
		{Limits{MaxFrameSize: 2 << 30}, false},
		{Limits{MaxChecks: -1}, false},
		{Limits{MaxChecks: 1 << 25}, false},
	}
	for _, tt := range tests {
		if err := tt.l.Validate(); (err == nil) != tt.want {
			t.Errorf("%+v.Validate() = %v, want ok %v", tt.l, err, tt.want)
		}
	}
}

func ExampleAppendBatchRequest() {
	req := &BatchRequest{Epoch: 7, Checks: []Check{
		{Rule: "login", KeyHash: 1, Partition: 3, Cost: 1},
		{Rule: "login", KeyHash: 2, Partition: 3, Cost: 1},
	}}
	frame := AppendBatchRequest(nil, 1, time.Second, req)

	var got BatchRequest
	id, deadline, err := DecodeBatchRequest(frame, &got)
	fmt.Println(len(frame), id, deadline, err, got.Epoch, len(got.Checks), got.Checks[1].Rule)
	// Output: 54 1 1s <nil> 7 2 login
}

// The unrolled varint reader agrees with encoding/binary on any bytes.
func TestUvarintAtMatchesBinary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		if rapid.Bool().Draw(t, "encoded") {
			b = binary.AppendUvarint(nil, rapid.Uint64().Draw(t, "v"))
			b = append(b, rapid.SliceOfN(rapid.Byte(), 0, 12).Draw(t, "tail")...)
		} else {
			b = rapid.SliceOfN(rapid.Byte(), 0, 14).Draw(t, "raw")
		}
		pos := rapid.IntRange(0, len(b)).Draw(t, "pos")
		v, next, err := uvarintAt(b, pos)
		want, n := binary.Uvarint(b[pos:])
		switch {
		case n > 0:
			if err != nil || v != want || next != pos+n {
				t.Fatalf("uvarintAt(%x, %d) = %d, %d, %v; want %d, %d", b, pos, v, next, err, want, pos+n)
			}
		case err == nil:
			t.Fatalf("uvarintAt(%x, %d) = %d, %d, nil; binary.Uvarint rejects it (n=%d)", b, pos, v, next, n)
		}
	})
}

func TestManyRuleNames(t *testing.T) {
	rules := make([]string, 100)
	for i := range rules {
		rules[i] = fmt.Sprintf("rule-%d", i)
	}
	req := batchOf(1000, rules...)
	var got BatchRequest
	if _, _, err := DecodeBatchRequest(AppendBatchRequest(nil, 1, 0, req), &got); err != nil {
		t.Fatal(err)
	}
	if !sameChecks(got.Checks, req.Checks) {
		t.Fatal("100 rules did not round-trip")
	}
}

// A batch without inline rules is a version-1 frame, byte for byte what a
// peer that predates inline rules reads; one with an inline rule is a
// version-2 frame. Decoding a version-1 frame into a request that held
// inline rules leaves none behind.
func TestInlineRulesVersionTheFrame(t *testing.T) {
	plain := batchOf(3, "a", "b")
	v1 := AppendBatchRequest(nil, 1, 0, plain)
	if v1[4] != ProtocolVersion {
		t.Fatalf("batch without inline rules written as version %d", v1[4])
	}
	ir := InlineRule{Algorithm: 4, FailureMode: 1, Limit: 10, Period: time.Minute}
	mixed := &BatchRequest{Epoch: 7, Checks: []Check{
		{Rule: "rls:d.k#0", KeyHash: 1, Partition: 1, Cost: 1, Inline: ir},
		{Rule: "default", KeyHash: 2, Partition: 2, Cost: 1},
		{Rule: "rls:d.k#0", KeyHash: 3, Partition: 3, Cost: 2, Inline: InlineRule{Algorithm: 4, Limit: 20, Period: time.Minute}},
		{Rule: "rls:d.k#0", KeyHash: 4, Partition: 4, Cost: 1, Inline: ir},
	}}
	v2 := AppendBatchRequest(nil, 2, 0, mixed)
	if v2[4] != InlineVersion {
		t.Fatalf("batch with inline rules written as version %d", v2[4])
	}
	var got BatchRequest
	if _, _, err := DecodeBatchRequest(v2, &got); err != nil {
		t.Fatal(err)
	}
	if !sameChecks(got.Checks, mixed.Checks) {
		t.Fatalf("decoded %+v, want %+v", got.Checks, mixed.Checks)
	}
	if _, _, err := DecodeBatchRequest(v1, &got); err != nil {
		t.Fatal(err)
	}
	if !sameChecks(got.Checks, plain.Checks) {
		t.Fatalf("version 1 after version 2 decoded %+v, want %+v", got.Checks, plain.Checks)
	}
}

// Joined checks make a version-5 frame whose flags byte names the
// options the batch uses (inline rules, rules version), and round-trip;
// the same batch with no joined check is the version 1 to 4 frame it
// always was, and a version-5 frame decoded into a request leaves no
// Joined behind for the next frame.
func TestJoinedChecksVersionTheFrame(t *testing.T) {
	ir := InlineRule{Algorithm: 4, FailureMode: 1, Limit: 10, Period: time.Minute}
	for _, tt := range []struct {
		inline    bool
		rv        uint64
		unjoined  uint8
		wantFlags byte
	}{
		{false, 0, ProtocolVersion, flagJoined},
		{true, 0, InlineVersion, flagJoined | flagInline},
		{false, 9, RulesVersionVersion, flagJoined | flagRulesVersion},
		{true, 9, InlineRulesVersionVersion, flagJoined | flagInline | flagRulesVersion},
	} {
		req := &BatchRequest{Epoch: 7, RulesVersion: tt.rv, Checks: []Check{
			{Rule: "a", KeyHash: 1, Partition: 1, Cost: 1},
			{Rule: "b", KeyHash: 1, Partition: 1, Cost: 1, Joined: true},
			{Rule: "a", KeyHash: 2, Partition: 2, Cost: 2},
			{Rule: "c", KeyHash: 3, Partition: 3, Cost: 3},
			{Rule: "a", KeyHash: 3, Partition: 3, Cost: 3, Joined: true},
			{Rule: "b", KeyHash: 3, Partition: 3, Cost: 3, Joined: true},
		}}
		if tt.inline {
			req.Checks[3].Inline = ir
		}
		frame := AppendBatchRequest(nil, 1, time.Second, req)
		if frame[4] != JoinedVersion || frame[HeaderSize] != tt.wantFlags {
			t.Errorf("inline %v, rules version %d: version %d flags %#x; want %d, %#x", tt.inline, tt.rv, frame[4], frame[HeaderSize], JoinedVersion, tt.wantFlags)
		}
		var got BatchRequest
		if _, dl, err := DecodeBatchRequest(frame, &got); err != nil || dl != time.Second || got.RulesVersion != tt.rv || !sameChecks(got.Checks, req.Checks) {
			t.Fatalf("inline %v: decoded %+v (%v, %v), want %+v", tt.inline, got, dl, err, req)
		}
		plain := &BatchRequest{Epoch: req.Epoch, RulesVersion: req.RulesVersion, Checks: slices.Clone(req.Checks)}
		for i := range plain.Checks {
			plain.Checks[i].Joined = false
		}
		old := AppendBatchRequest(nil, 1, time.Second, plain)
		if old[4] != tt.unjoined {
			t.Errorf("inline %v, rules version %d, no joined check: version %d, want %d", tt.inline, tt.rv, old[4], tt.unjoined)
		}
		// The unjoined frame is the joined one without its flags byte
		// and with each name index halved (all indexes here are small).
		if len(old) != len(frame)-1 {
			t.Errorf("unjoined frame %d bytes, joined %d: want one byte less", len(old), len(frame))
		}
		if _, _, err := DecodeBatchRequest(old, &got); err != nil || !sameChecks(got.Checks, plain.Checks) {
			t.Fatalf("unjoined after joined decoded %+v (%v), want %+v", got.Checks, err, plain.Checks)
		}
	}
}
