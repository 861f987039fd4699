package transport

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Wire format, versions 1 to 5. All fixed-width integers are little-endian;
// "uvarint" is encoding/binary's unsigned varint and "varint" its zig-zag
// signed varint.
//
// Every frame:
//
//	u32     length of the rest of the frame (so a frame is 4+length bytes)
//	u8      version (ProtocolVersion)
//	u8      type (FrameType)
//	u64     request id (chosen by the client, echoed by the server)
//	...     body, by type
//
// FrameBatchRequest body:
//
//	uvarint deadline: the sender's remaining budget in ns; 0 = none
//	uvarint epoch
//	uvarint number of checks n
//	u32     offset of the name table from the start of the frame
//	n ×     uvarint name index, u64 key hash, uvarint partition, uvarint cost
//	name table: uvarint count m (≤ n), m × (uvarint length, bytes)
//
// The name table comes last so that the encoder can build it in its single
// pass over the checks; the decoder jumps to it first, so every check's rule
// resolves to an already interned string.
//
// Version 2 is used only for a FrameBatchRequest in which some check
// carries an inline rule (Check.Inline); every other frame is version 1,
// byte for byte as before, so a batch without inline rules still reaches
// a peer that knows only version 1. A version-2 request differs in its
// name table alone: each entry is a (name, inline rule) pair,
//
//	uvarint length, bytes, u8 algorithm (0 = no inline rule), and when
//	the algorithm is not 0: u8 failure mode, varint limit, varint period
//	ns, varint burst
//
// so two checks of one name with different inline rules get two entries.
// Versions 3 and 4 are versions 1 and 2 with one more uvarint, the
// sender's rules version, right after the epoch.
//
// Version 5 is used only for a FrameBatchRequest in which some check is
// joined with the one before it (Check.Joined): a peer that predates
// groups refuses the frame (UnsupportedVersionError) rather than decide
// a group's checks one by one. Right after the header it has a flags
// byte, and then the body as above:
//
//	u8      flags: bit 0 = the name table is inline (as in version 2),
//	        bit 1 = a rules version follows the epoch (as in version 3),
//	        bit 2 = joined: each check's name index is written as
//	        index<<1 | joined (1 when the check joins the group of the
//	        check before it); the other bits must be 0
//
// The first check of a frame must not be joined. A batch without joined
// checks is written as before (versions 1 to 4), byte for byte; new
// request options are meant to take further flag bits, not versions.
//
// FrameBatchResponse body:
//
//	uvarint epoch
//	uvarint number of results n
//	n ×     u8 status<<1 | allowed, varint limit, varint remaining,
//	        varint reset-after ns, varint retry-after ns, varint delay ns
//
// FrameError body: u8 ErrorCode, uvarint length, message bytes.

// ProtocolVersion is the version byte of every frame this package writes,
// except requests carrying inline rules, a rules version or joined checks
// (versions 2 to 5 below).
const ProtocolVersion uint8 = 1

// InlineVersion is the version byte of a FrameBatchRequest whose name
// table carries inline rules. It is accepted for that frame type only.
const InlineVersion uint8 = 2

// Versions 3 and 4 are versions 1 and 2 of a FrameBatchRequest that
// carries the sender's rules version (BatchRequest.RulesVersion, not 0):
// one more uvarint right after the epoch. Accepted for that frame type only.
const (
	RulesVersionVersion       uint8 = 3
	InlineRulesVersionVersion uint8 = 4
)

// JoinedVersion is the version byte of a FrameBatchRequest with joined
// checks (Check.Joined); its flags byte says which options it uses.
// Accepted for that frame type only.
const JoinedVersion uint8 = 5

// The flags of a version-5 request.
const (
	flagInline       = 1 << 0
	flagRulesVersion = 1 << 1
	flagJoined       = 1 << 2
	knownFlags       = flagInline | flagRulesVersion | flagJoined
)

// HeaderSize is the size of the fixed frame header, length prefix included.
const HeaderSize = 14

// FrameType is the type byte of a frame.
type FrameType uint8

// Frame types. Numbers not listed here are reserved for frame types to come
// (partition hand-off streams, backup replication) and are rejected with an
// *UnknownFrameTypeError until a version of this package defines them.
const (
	FrameBatchRequest  FrameType = 1 // client → server: a BatchRequest
	FrameBatchResponse FrameType = 2 // server → client: a BatchResponse
	FrameError         FrameType = 3 // server → client: a RemoteError instead of a response
)

func (t FrameType) String() string {
	switch t {
	case FrameBatchRequest:
		return "BatchRequest"
	case FrameBatchResponse:
		return "BatchResponse"
	case FrameError:
		return "Error"
	case FramePushRequest:
		return "PushRequest"
	case FramePushResponse:
		return "PushResponse"
	}
	return fmt.Sprintf("FrameType(%d)", uint8(t))
}

func (t FrameType) known() bool { return t >= FrameBatchRequest && t <= FramePushResponse }

const (
	lenPrefix       = 4
	minCheckSize    = 1 + 8 + 1 + 1 // name index, key hash, partition, cost
	minResultSize   = 1 + 5         // status byte and five one-byte varints
	maxErrorMessage = 1024
	linearNames     = 16 // encoder: names looked up by linear scan up to this many
	internScan      = 32 // decoder: old names searched per new name
)

// Default limits.
const (
	DefaultMaxFrameSize = 16 << 20
	DefaultMaxChecks    = 65536

	maxFrameSizeLimit = 1 << 30
	maxChecksLimit    = 1 << 24
)

// Limits bound what a decoder accepts. A zero field means its default.
type Limits struct {
	// MaxFrameSize is the largest frame, length prefix included.
	MaxFrameSize int
	// MaxChecks is the most checks in a request (and results in a response).
	MaxChecks int
}

// DefaultLimits returns 16 MiB frames and 65536 checks per batch.
func DefaultLimits() Limits {
	return Limits{MaxFrameSize: DefaultMaxFrameSize, MaxChecks: DefaultMaxChecks}
}

// Validate reports whether l is usable. It changes nothing.
func (l Limits) Validate() error {
	if l.MaxFrameSize < 0 || l.MaxFrameSize > maxFrameSizeLimit ||
		(l.MaxFrameSize > 0 && l.MaxFrameSize < 256) {
		return fmt.Errorf("%w: MaxFrameSize %d not 0 (default) or in [256, %d]", ErrInvalidConfig, l.MaxFrameSize, maxFrameSizeLimit)
	}
	if l.MaxChecks < 0 || l.MaxChecks > maxChecksLimit {
		return fmt.Errorf("%w: MaxChecks %d not 0 (default) or in [1, %d]", ErrInvalidConfig, l.MaxChecks, maxChecksLimit)
	}
	return nil
}

func (l Limits) maxFrame() int {
	if l.MaxFrameSize <= 0 {
		return DefaultMaxFrameSize
	}
	return l.MaxFrameSize
}

func (l Limits) maxChecks() int {
	if l.MaxChecks <= 0 {
		return DefaultMaxChecks
	}
	return l.MaxChecks
}

// Header is the fixed part of a frame.
type Header struct {
	Version uint8
	Type    FrameType
	ID      uint64
}

// ReadFrame reads one whole frame from r into buf (reusing its capacity) and
// returns it, length prefix included. The length is checked against
// MaxFrameSize before anything is allocated. It returns io.EOF only when r
// ends cleanly between frames.
func (l Limits) ReadFrame(r io.Reader, buf []byte) ([]byte, error) {
	buf = slices.Grow(buf[:0], HeaderSize)[:lenPrefix]
	if _, err := io.ReadFull(r, buf); err != nil {
		return buf[:0], err
	}
	size := uint64(binary.LittleEndian.Uint32(buf)) + lenPrefix
	if size < HeaderSize {
		return buf[:0], malformed(fmt.Sprintf("frame of %d bytes is shorter than its header", size))
	}
	if size > uint64(l.maxFrame()) {
		return buf[:0], &FrameTooLargeError{Size: size, Limit: l.maxFrame()}
	}
	// The buffer grows as the body arrives (doubling from growStep), so a
	// peer pays for what it allocates with bytes actually sent: a bare
	// length prefix pins nothing.
	for have := lenPrefix; have < int(size); {
		next := min(int(size), max(have+growStep, 2*have))
		if cap(buf) < next {
			buf = slices.Grow(buf[:have], next-have)
		}
		buf = buf[:next]
		if _, err := io.ReadFull(r, buf[have:next]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf[:0], err
		}
		have = next
	}
	return buf[:size], nil
}

// growStep is the most ReadFrame allocates ahead of the bytes received.
const growStep = 64 << 10

// ReadFrame is DefaultLimits().ReadFrame.
func ReadFrame(r io.Reader, buf []byte) ([]byte, error) { return Limits{}.ReadFrame(r, buf) }

// ParseHeader checks a whole frame's length prefix, size, version and type,
// and returns its header.
func (l Limits) ParseHeader(frame []byte) (Header, error) {
	if len(frame) < HeaderSize {
		return Header{}, errTruncated
	}
	size := uint64(binary.LittleEndian.Uint32(frame)) + lenPrefix
	if size != uint64(len(frame)) {
		return Header{}, malformed(fmt.Sprintf("length prefix says %d bytes, frame has %d", size, len(frame)))
	}
	if size > uint64(l.maxFrame()) {
		return Header{}, &FrameTooLargeError{Size: size, Limit: l.maxFrame()}
	}
	h := Header{Version: frame[4], Type: FrameType(frame[5]), ID: binary.LittleEndian.Uint64(frame[6:])}
	if h.Version != ProtocolVersion && (h.Version < InlineVersion || h.Version > JoinedVersion || h.Type != FrameBatchRequest) {
		return h, &UnsupportedVersionError{Version: h.Version}
	}
	if !h.Type.known() {
		return h, &UnknownFrameTypeError{Type: h.Type}
	}
	return h, nil
}

// ParseHeader is DefaultLimits().ParseHeader.
func ParseHeader(frame []byte) (Header, error) { return Limits{}.ParseHeader(frame) }

func (l Limits) parseAs(frame []byte, t FrameType) (Header, error) {
	h, err := l.ParseHeader(frame)
	if err == nil && h.Type != t {
		err = &UnknownFrameTypeError{Type: h.Type}
	}
	return h, err
}

func appendHeader(dst []byte, t FrameType, id uint64) []byte {
	dst = append(dst, 0, 0, 0, 0, ProtocolVersion, byte(t))
	return binary.LittleEndian.AppendUint64(dst, id)
}

// finish writes the length prefix of the frame that starts at dst[start].
func finish(dst []byte, start int) []byte {
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-lenPrefix))
	return dst
}

// AppendBatchRequest appends req as a FrameBatchRequest with the given id
// and deadline budget to dst and returns the extended slice. A deadline of 0
// means none; a negative one is clamped to 1ns (already spent). The frame is
// not checked against any Limits; the caller compares its length with
// MaxFrameSize. Frames above 4 GiB cannot be represented.
func AppendBatchRequest(dst []byte, id uint64, deadline time.Duration, req *BatchRequest) []byte {
	var inline uint8
	var jn uint64
	for i := range req.Checks {
		c := &req.Checks[i]
		inline |= c.Inline.Algorithm
		jn |= bit(c.Joined)
	}
	joined := jn != 0
	if inline != 0 {
		return appendInlineBatchRequest(dst, id, deadline, req, joined)
	}
	start := len(dst)
	dst = slices.Grow(dst, HeaderSize+1+4*binary.MaxVarintLen64+4+len(req.Checks)*20+16)
	dst = appendRequestHead(dst, id, deadline, req, false, joined)
	offAt := len(dst) - 4

	var t nameTable
	shift := joinedShift(joined) // branch-free: 0 for versions 1 to 4
	for i := range req.Checks {
		c := &req.Checks[i]
		dst = binary.AppendUvarint(dst, uint64(t.lookup(c.Rule))<<shift|bit(c.Joined)&uint64(shift))
		dst = binary.LittleEndian.AppendUint64(dst, c.KeyHash)
		dst = binary.AppendUvarint(dst, uint64(c.Partition))
		dst = binary.AppendUvarint(dst, c.Cost)
	}
	binary.LittleEndian.PutUint32(dst[offAt:], uint32(len(dst)-start))
	names := t.big
	if names == nil {
		names = t.small[:t.n]
	}
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, s := range names {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return finish(dst, start)
}

// appendRequestHead appends a request frame's header (its version chosen
// by the options the batch uses), flags byte (version 5), deadline,
// epoch, rules version, check count and a zero name table offset, which
// the caller fills in (the last 4 bytes).
func appendRequestHead(dst []byte, id uint64, deadline time.Duration, req *BatchRequest, inline, joined bool) []byte {
	start := len(dst)
	dst = appendHeader(dst, FrameBatchRequest, id)
	switch {
	case joined:
		dst[start+4] = JoinedVersion
		flags := byte(flagJoined)
		if inline {
			flags |= flagInline
		}
		if req.RulesVersion != 0 {
			flags |= flagRulesVersion
		}
		dst = append(dst, flags)
	case inline && req.RulesVersion != 0:
		dst[start+4] = InlineRulesVersionVersion
	case inline:
		dst[start+4] = InlineVersion
	case req.RulesVersion != 0:
		dst[start+4] = RulesVersionVersion
	}
	if deadline < 0 {
		deadline = 1
	}
	dst = binary.AppendUvarint(dst, uint64(deadline))
	dst = binary.AppendUvarint(dst, req.Epoch)
	if req.RulesVersion != 0 {
		dst = binary.AppendUvarint(dst, req.RulesVersion)
	}
	dst = binary.AppendUvarint(dst, uint64(len(req.Checks)))
	return append(dst, 0, 0, 0, 0)
}

// joinedShift is how far a name index is shifted to make room for the
// Joined bit: 1 in a version-5 frame with the joined flag, else 0.
func joinedShift(joined bool) uint64 { return bit(joined) }

func bit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// appendInlineBatchRequest is AppendBatchRequest for a batch with inline
// rules: a version-2 frame (5 with joined checks) whose name table holds
// (name, rule) pairs. Inline rules are rare enough (Envoy RLS) that a map
// is fine here.
func appendInlineBatchRequest(dst []byte, id uint64, deadline time.Duration, req *BatchRequest, joined bool) []byte {
	type entry struct {
		name string
		rule InlineRule
	}
	start := len(dst)
	dst = slices.Grow(dst, HeaderSize+1+4*binary.MaxVarintLen64+4+len(req.Checks)*20+64)
	dst = appendRequestHead(dst, id, deadline, req, true, joined)
	offAt := len(dst) - 4
	index := make(map[entry]uint32)
	var entries []entry
	for i := range req.Checks {
		c := &req.Checks[i]
		e := entry{c.Rule, c.Inline}
		if e.rule.Algorithm == 0 {
			e.rule = InlineRule{} // only the algorithm says "none"
		}
		idx, ok := index[e]
		if !ok {
			idx = uint32(len(entries))
			index[e] = idx
			entries = append(entries, e)
		}
		dst = binary.AppendUvarint(dst, uint64(idx)<<joinedShift(joined)|bit(c.Joined && joined))
		dst = binary.LittleEndian.AppendUint64(dst, c.KeyHash)
		dst = binary.AppendUvarint(dst, uint64(c.Partition))
		dst = binary.AppendUvarint(dst, c.Cost)
	}
	binary.LittleEndian.PutUint32(dst[offAt:], uint32(len(dst)-start))
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	for _, e := range entries {
		dst = binary.AppendUvarint(dst, uint64(len(e.name)))
		dst = append(dst, e.name...)
		dst = append(dst, e.rule.Algorithm)
		if e.rule.Algorithm != 0 {
			dst = append(dst, e.rule.FailureMode)
			dst = binary.AppendVarint(dst, e.rule.Limit)
			dst = binary.AppendVarint(dst, int64(e.rule.Period))
			dst = binary.AppendVarint(dst, e.rule.Burst)
		}
	}
	return finish(dst, start)
}

// nameTable assigns indexes to the distinct rule names of one frame, in
// order of first appearance. It lives on the encoder's stack: the first
// linearNames names sit in an array searched linearly; past that, all names
// move to a slice with a map index.
type nameTable struct {
	small   [linearNames]string
	n       int               // names in small, while big is nil
	big     []string          // all names, once there are more than linearNames
	index   map[string]uint32 // index of big
	last    string
	lastIdx uint32
}

func (t *nameTable) lookup(s string) uint32 {
	if (t.n > 0 || t.big != nil) && s == t.last { // runs of one rule: the common case
		return t.lastIdx
	}
	idx, ok := uint32(0), false
	if t.big != nil {
		idx, ok = t.index[s]
	} else {
		for i := 0; i < t.n; i++ {
			if t.small[i] == s {
				idx, ok = uint32(i), true
				break
			}
		}
	}
	if !ok {
		switch {
		case t.big != nil:
			idx = uint32(len(t.big))
			t.big = append(t.big, s)
			t.index[s] = idx
		case t.n < linearNames:
			idx = uint32(t.n)
			t.small[t.n] = s
			t.n++
		default:
			idx = uint32(t.n)
			t.big = make([]string, t.n, 4*linearNames)
			copy(t.big, t.small[:])
			t.big = append(t.big, s)
			t.index = make(map[string]uint32, 4*linearNames)
			for i, n := range t.big {
				t.index[n] = uint32(i)
			}
		}
	}
	t.last, t.lastIdx = s, idx
	return idx
}

// DecodeBatchRequest is DefaultLimits().DecodeBatchRequest.
func DecodeBatchRequest(frame []byte, req *BatchRequest) (id uint64, deadline time.Duration, err error) {
	return Limits{}.DecodeBatchRequest(frame, req)
}

// DecodeBatchRequest decodes a whole FrameBatchRequest frame into req,
// reusing the capacity of req.Checks and the rule names req already holds.
// It returns the request id and the deadline budget (0 = none). On error,
// the contents of *req are unspecified.
func (l Limits) DecodeBatchRequest(frame []byte, req *BatchRequest) (id uint64, deadline time.Duration, err error) {
	h, err := l.parseAs(frame, FrameBatchRequest)
	if err != nil {
		return h.ID, 0, err
	}
	r := reader{b: frame, pos: HeaderSize}
	var flags byte
	switch h.Version {
	case InlineVersion:
		flags = flagInline
	case RulesVersionVersion:
		flags = flagRulesVersion
	case InlineRulesVersionVersion:
		flags = flagInline | flagRulesVersion
	case JoinedVersion:
		if flags = r.byte(); flags&^knownFlags != 0 && r.err == nil {
			return h.ID, 0, malformed(fmt.Sprintf("unknown request flags %#x", flags))
		}
	}
	inline, joined := flags&flagInline != 0, flags&flagJoined != 0
	dl := r.uvarint()
	epoch := r.uvarint()
	var rulesVersion uint64
	if flags&flagRulesVersion != 0 {
		rulesVersion = r.uvarint()
	}
	n := r.uvarint()
	if r.err != nil {
		return h.ID, 0, r.err
	}
	if dl > math.MaxInt64 {
		return h.ID, 0, malformed("deadline overflows")
	}
	if n > uint64(l.maxChecks()) {
		return h.ID, 0, &TooManyChecksError{Count: n, Limit: l.maxChecks()}
	}
	off64 := uint64(r.uint32())
	if r.err != nil {
		return h.ID, 0, r.err
	}
	if off64 < uint64(r.pos) || off64 > uint64(len(frame)) {
		return h.ID, 0, malformed("name table offset out of range")
	}
	off := int(off64)
	if n > uint64(off-r.pos)/minCheckSize { // no allocation before this check
		return h.ID, 0, malformed(fmt.Sprintf("%d checks cannot fit in %d bytes", n, off-r.pos))
	}
	nn, err := req.decodeNames(frame, off, n, inline)
	if err != nil {
		return h.ID, 0, err
	}

	checks := req.Checks
	if uint64(cap(checks)) < n {
		checks = make([]Check, n)
	}
	checks = checks[:n]
	names := req.names[:nn]
	var inlines []InlineRule // nil in version-1 frames
	if inline {
		inlines = req.inlines[:nn]
	}
	// The hot loop: position in a local, one-byte varints inline.
	b, pos := frame[:off], r.pos // the checks end where the name table starts
	shift := joinedShift(joined) // branch-free: 0 unless joined
	for i := range checks {
		var idx, keyHash, part, cost uint64
		if pos < len(b) && b[pos] < 0x80 {
			idx, pos = uint64(b[pos]), pos+1
		} else if idx, pos, err = uvarintAt(b, pos); err != nil {
			return h.ID, 0, err
		}
		if len(b)-pos < 8 {
			return h.ID, 0, errTruncated
		}
		keyHash, pos = binary.LittleEndian.Uint64(b[pos:]), pos+8
		if part, pos, err = uvarintAt(b, pos); err != nil {
			return h.ID, 0, err
		}
		if pos < len(b) && b[pos] < 0x80 {
			cost, pos = uint64(b[pos]), pos+1
		} else if cost, pos, err = uvarintAt(b, pos); err != nil {
			return h.ID, 0, err
		}
		j := idx & shift // the Joined bit, 0 unless joined
		idx >>= shift
		if idx >= uint64(len(names)) {
			return h.ID, 0, malformed("rule name index out of range")
		}
		if part > math.MaxUint32 {
			return h.ID, 0, malformed("partition overflows 32 bits")
		}
		checks[i] = Check{Rule: names[idx], KeyHash: keyHash, Partition: uint32(part), Cost: cost, Joined: j != 0}
		if inlines != nil {
			checks[i].Inline = inlines[idx]
		}
	}
	if pos != off {
		return h.ID, 0, malformed("bytes between checks and name table")
	}
	if len(checks) > 0 && checks[0].Joined {
		return h.ID, 0, malformed("the first check is joined to no check before it")
	}
	req.Epoch, req.RulesVersion = epoch, rulesVersion
	req.Checks = checks
	return h.ID, time.Duration(dl), nil
}

// decodeNames decodes the name table at frame[off:] into req.names[:nn]
// (and, with inline set, the entries' inline rules into req.inlines[:nn])
// and returns nn. A name equal to one req.names
// already holds reuses that string.
func (req *BatchRequest) decodeNames(frame []byte, off int, nchecks uint64, inline bool) (int, error) {
	r := reader{b: frame, pos: off}
	nn := r.uvarint()
	if r.err != nil {
		return 0, r.err
	}
	if nn > nchecks || nn > uint64(len(frame)-r.pos) {
		return 0, malformed("name count exceeds checks or bytes")
	}
	names := req.names
	if uint64(len(names)) < nn {
		names = slices.Grow(names, int(nn)-len(names))[:nn]
	}
	inlines := req.inlines
	if inline && uint64(len(inlines)) < nn {
		inlines = slices.Grow(inlines, int(nn)-len(inlines))[:nn]
	}
	for i := 0; i < int(nn); i++ {
		b := r.bytes()
		if r.err != nil {
			return 0, r.err
		}
		intern(names, i, b)
		if inline {
			inlines[i] = r.inlineRule()
			if r.err != nil {
				return 0, r.err
			}
		}
	}
	req.names, req.inlines = names, inlines
	if r.pos != len(frame) {
		return 0, malformed("bytes after name table")
	}
	return int(nn), nil
}

// intern sets names[i] to a string equal to b, reusing names[i] or a later
// (older) entry when one is equal; entries before i hold this frame's names.
func intern(names []string, i int, b []byte) {
	if names[i] == string(b) {
		return
	}
	for j := i + 1; j < len(names) && j <= i+internScan; j++ {
		if names[j] == string(b) {
			names[i], names[j] = names[j], names[i]
			return
		}
	}
	names[i] = string(b)
}

// AppendBatchResponse appends resp as a FrameBatchResponse with the given id
// to dst and returns the extended slice. A Status this package does not
// know is sent as StatusInternal.
func AppendBatchResponse(dst []byte, id uint64, resp *BatchResponse) []byte {
	start := len(dst)
	dst = slices.Grow(dst, HeaderSize+2*binary.MaxVarintLen64+len(resp.Results)*16)
	dst = appendHeader(dst, FrameBatchResponse, id)
	dst = binary.AppendUvarint(dst, resp.Epoch)
	dst = binary.AppendUvarint(dst, uint64(len(resp.Results)))
	for i := range resp.Results {
		r := &resp.Results[i]
		st := r.Status
		if st > maxStatus {
			st = StatusInternal
		}
		b := byte(st) << 1
		if r.Allowed {
			b |= 1
		}
		dst = append(dst, b)
		dst = binary.AppendVarint(dst, r.Limit)
		dst = binary.AppendVarint(dst, r.Remaining)
		dst = binary.AppendVarint(dst, int64(r.ResetAfter))
		dst = binary.AppendVarint(dst, int64(r.RetryAfter))
		dst = binary.AppendVarint(dst, int64(r.Delay))
	}
	return finish(dst, start)
}

// DecodeBatchResponse is DefaultLimits().DecodeBatchResponse.
func DecodeBatchResponse(frame []byte, resp *BatchResponse) (id uint64, err error) {
	return Limits{}.DecodeBatchResponse(frame, resp)
}

// DecodeBatchResponse decodes a whole FrameBatchResponse frame into resp,
// reusing the capacity of resp.Results, and returns the request id. On
// error, the contents of *resp are unspecified.
func (l Limits) DecodeBatchResponse(frame []byte, resp *BatchResponse) (id uint64, err error) {
	h, err := l.parseAs(frame, FrameBatchResponse)
	if err != nil {
		return h.ID, err
	}
	r := reader{b: frame, pos: HeaderSize}
	epoch := r.uvarint()
	n := r.uvarint()
	if r.err != nil {
		return h.ID, r.err
	}
	if n > uint64(l.maxChecks()) {
		return h.ID, &TooManyChecksError{Count: n, Limit: l.maxChecks()}
	}
	if n > uint64(len(frame)-r.pos)/minResultSize { // no allocation before this check
		return h.ID, malformed(fmt.Sprintf("%d results cannot fit in %d bytes", n, len(frame)-r.pos))
	}
	results := resp.Results
	if uint64(cap(results)) < n {
		results = make([]Result, n)
	}
	results = results[:n]
	b, pos := frame, r.pos
	for i := range results {
		if pos >= len(b) {
			return h.ID, errTruncated
		}
		sb := b[pos]
		pos++
		var v [5]uint64 // limit, remaining, reset after, retry after, delay
		for k := range v {
			if pos < len(b) && b[pos] < 0x80 {
				v[k], pos = uint64(b[pos]), pos+1
			} else if v[k], pos, err = uvarintAt(b, pos); err != nil {
				return h.ID, err
			}
		}
		st := Status(sb >> 1)
		if st > maxStatus {
			return h.ID, malformed(fmt.Sprintf("unknown status %d", uint8(st)))
		}
		results[i] = Result{
			Status: st, Allowed: sb&1 == 1,
			Limit: unzigzag(v[0]), Remaining: unzigzag(v[1]),
			ResetAfter: time.Duration(unzigzag(v[2])), RetryAfter: time.Duration(unzigzag(v[3])),
			Delay: time.Duration(unzigzag(v[4])),
		}
	}
	if pos != len(frame) {
		return h.ID, malformed("bytes after results")
	}
	resp.Epoch = epoch
	resp.Results = results
	return h.ID, nil
}

// AppendError appends a FrameError with the given id to dst and returns the
// extended slice. Messages longer than 1 KiB are cut.
func AppendError(dst []byte, id uint64, code ErrorCode, msg string) []byte {
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	start := len(dst)
	dst = appendHeader(dst, FrameError, id)
	dst = append(dst, byte(code))
	dst = binary.AppendUvarint(dst, uint64(len(msg)))
	dst = append(dst, msg...)
	return finish(dst, start)
}

// DecodeError decodes a whole FrameError frame.
func (l Limits) DecodeError(frame []byte) (id uint64, e *RemoteError, err error) {
	h, err := l.parseAs(frame, FrameError)
	if err != nil {
		return h.ID, nil, err
	}
	r := reader{b: frame, pos: HeaderSize}
	code := ErrorCode(r.byte())
	msg := r.bytes()
	if r.err != nil {
		return h.ID, nil, r.err
	}
	if r.pos != len(frame) || len(msg) > maxErrorMessage {
		return h.ID, nil, malformed("error message length does not match frame or exceeds 1 KiB")
	}
	return h.ID, &RemoteError{Code: code, Message: string(msg)}, nil
}

// DecodeError is DefaultLimits().DecodeError.
func DecodeError(frame []byte) (id uint64, e *RemoteError, err error) {
	return Limits{}.DecodeError(frame)
}

// reader reads fields from b at pos. The first failure sticks in err and
// moves pos to the end, so later reads return zeros without bounds trouble;
// callers check err once per group of fields. The common one-byte varint is
// inlined into the callers' loops.
type reader struct {
	b   []byte
	pos int
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.pos = len(r.b)
}

func (r *reader) byte() byte {
	if r.pos < len(r.b) {
		c := r.b[r.pos]
		r.pos++
		return c
	}
	r.fail(errTruncated)
	return 0
}

func (r *reader) uvarint() uint64 {
	if p := r.pos; uint(p) < uint(len(r.b)) && r.b[p] < 0x80 {
		r.pos = p + 1
		return uint64(r.b[p])
	}
	return r.uvarintSlow()
}

func (r *reader) uvarintSlow() uint64 {
	var x uint64
	var s uint
	for k := r.pos; k < len(r.b) && k < r.pos+binary.MaxVarintLen64; k++ {
		c := r.b[k]
		if c < 0x80 {
			if k == r.pos+binary.MaxVarintLen64-1 && c > 1 {
				break // the 10th byte may only hold the 64th bit
			}
			r.pos = k + 1
			return x | uint64(c)<<s
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	if len(r.b)-r.pos >= binary.MaxVarintLen64 {
		r.fail(errVarint)
	} else {
		r.fail(errTruncated)
	}
	return 0
}

// uvarintAt reads an unsigned varint at b[pos:] and returns it and the
// position after it. Unrolled (as protowire.ConsumeVarint is) when ten
// bytes are left, so that multi-byte values cost no loop or bounds checks.
func uvarintAt(b []byte, pos int) (uint64, int, error) {
	if pos < 0 || len(b)-pos < binary.MaxVarintLen64 {
		r := reader{b: b, pos: pos}
		v := r.uvarintSlow()
		return v, r.pos, r.err
	}
	p := b[pos : pos+binary.MaxVarintLen64]
	var v, y uint64
	y = uint64(p[0])
	if y < 0x80 {
		return y, pos + 1, nil
	}
	v = y - 0x80
	y = uint64(p[1])
	v += y << 7
	if y < 0x80 {
		return v, pos + 2, nil
	}
	v -= 0x80 << 7
	y = uint64(p[2])
	v += y << 14
	if y < 0x80 {
		return v, pos + 3, nil
	}
	v -= 0x80 << 14
	y = uint64(p[3])
	v += y << 21
	if y < 0x80 {
		return v, pos + 4, nil
	}
	v -= 0x80 << 21
	y = uint64(p[4])
	v += y << 28
	if y < 0x80 {
		return v, pos + 5, nil
	}
	v -= 0x80 << 28
	y = uint64(p[5])
	v += y << 35
	if y < 0x80 {
		return v, pos + 6, nil
	}
	v -= 0x80 << 35
	y = uint64(p[6])
	v += y << 42
	if y < 0x80 {
		return v, pos + 7, nil
	}
	v -= 0x80 << 42
	y = uint64(p[7])
	v += y << 49
	if y < 0x80 {
		return v, pos + 8, nil
	}
	v -= 0x80 << 49
	y = uint64(p[8])
	v += y << 56
	if y < 0x80 {
		return v, pos + 9, nil
	}
	v -= 0x80 << 56
	y = uint64(p[9])
	v += y << 63
	if y < 2 {
		return v, pos + 10, nil
	}
	return 0, pos, errVarint
}

// unzigzag undoes the zig-zag mapping of binary.AppendVarint.
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

func (r *reader) uint32() uint32 {
	if len(r.b)-r.pos >= 4 {
		v := binary.LittleEndian.Uint32(r.b[r.pos:])
		r.pos += 4
		return v
	}
	r.fail(errTruncated)
	return 0
}

// inlineRule reads a version-2 name entry's rule: u8 algorithm, and when
// it is not 0, u8 failure mode and three varints.
func (r *reader) inlineRule() InlineRule {
	var ir InlineRule
	if ir.Algorithm = r.byte(); ir.Algorithm == 0 {
		return ir
	}
	ir.FailureMode = r.byte()
	ir.Limit = unzigzag(r.uvarint())
	ir.Period = time.Duration(unzigzag(r.uvarint()))
	ir.Burst = unzigzag(r.uvarint())
	return ir
}

// bytes reads a uvarint length and that many bytes (aliasing r.b).
func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.pos) {
		r.fail(errTruncated)
		return nil
	}
	b := r.b[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b
}
