package limiter

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// A partition crosses machines (hand-off, backup) as a compact byte
// stream of its live states. Times in it are relative to the exporter's
// now, so no absolute wall time crosses machines: the importer adds its
// own now.
//
//	stream  = "RLP1" · version · partition · count · record × count
//	version = 1 byte, 1
//	partition, count = uvarint
//	record  = hash · kind · payload
//	hash    = the bucket hash, 8 bytes little endian
//	kind    = 1 byte: 1 TAT, 2 Window, 3 Log
//	payload, kind 1 (TAT):    uvarint(TAT − now)
//	payload, kind 2 (Window): uvarint(DeadAt − now) · uvarint(Counts)
//	payload, kind 3 (Log):    uvarint(n) · n × (uvarint(exp − now) · uvarint(cost))
//
// The encoding is canonical: one set of states at one now has exactly one
// stream, and Import rejects every other byte string. A valid stream has
//
//   - records sorted by (kind, hash), strictly increasing: no duplicates,
//     but one hash may appear under two kinds, as in the table's stores;
//   - only live states: every time delta ≥ 1 and ≤ maxDelta; Counts ≠ 0,
//     with each 32-bit half ≤ MaxLimit; a log of 1 to MaxLogLimit
//     entries in non-decreasing expiry order, each of cost ≥ 1, their sum
//     ≤ MaxLogLimit (a sliding_log Limit);
//   - uvarints in their shortest form, and no byte after the last record.
//
// Export clamps a delta above maxDelta (only a clock that ran far
// backwards makes one) to maxDelta.
const (
	streamMagic   = "RLP1"
	streamVersion = 1

	kindTAT    = 1
	kindWindow = 2
	kindLog    = 3

	// minRecord is the size of the smallest record (a TAT whose delta
	// takes one byte): it bounds count by the bytes that follow.
	minRecord = 8 + 1 + 1

	// maxDelta bounds every time delta in a stream: twice the longest
	// a TAT may legitimately run ahead (MaxTolerance), about 20 years.
	// It keeps importer's now + delta, and the steps' arithmetic on it,
	// far from overflow.
	maxDelta = 2 * int64(MaxTolerance)
)

// ErrCorrupt: an Import stream that is not a valid export. The error is a
// *CorruptError that says where and why.
var ErrCorrupt = errors.New("limiter: corrupt partition stream")

// CorruptError describes an invalid partition stream.
type CorruptError struct {
	Offset int    // byte offset of the offending field
	Msg    string // what is wrong with it
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%v at byte %d: %s", ErrCorrupt, e.Offset, e.Msg)
}

// Unwrap lets errors.Is(err, ErrCorrupt) match.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Export appends to dst the stream of partition part's states that are
// live at now (see the format above) and returns the extended slice. The
// stream is sorted, so the same states at the same now always export to
// the same bytes.
func (t *Table) Export(dst []byte, part uint32, now int64) []byte {
	p := t.part(part)
	p.mu.Lock()
	defer p.mu.Unlock()

	var tats []slot[TAT]
	p.tats.all(func(h uint64, v TAT) {
		if !v.idle(now) {
			tats = append(tats, slot[TAT]{h, v})
		}
	})
	var wins []slot[Window]
	p.wins.all(func(h uint64, v Window) {
		if !v.idle(now) {
			wins = append(wins, slot[Window]{h, v})
		}
	})
	type logRef struct {
		h uint64
		l *Log
	}
	var logs []logRef
	for h, l := range p.logs {
		if !l.Dead(now) { // drops the entries expired at now
			logs = append(logs, logRef{h, l})
		}
	}
	slices.SortFunc(tats, func(a, b slot[TAT]) int { return cmp.Compare(a.key, b.key) })
	slices.SortFunc(wins, func(a, b slot[Window]) int { return cmp.Compare(a.key, b.key) })
	slices.SortFunc(logs, func(a, b logRef) int { return cmp.Compare(a.h, b.h) })

	dst = slices.Grow(dst, 16+len(tats)*13+len(wins)*18+len(logs)*20)
	dst = append(dst, streamMagic...)
	dst = append(dst, streamVersion)
	dst = binary.AppendUvarint(dst, uint64(part))
	dst = binary.AppendUvarint(dst, uint64(len(tats)+len(wins)+len(logs)))
	for _, e := range tats {
		dst = appendHead(dst, e.key, kindTAT)
		dst = binary.AppendUvarint(dst, delta(int64(e.val), now))
	}
	for _, e := range wins {
		dst = appendHead(dst, e.key, kindWindow)
		dst = binary.AppendUvarint(dst, delta(e.val.DeadAt, now))
		dst = binary.AppendUvarint(dst, e.val.Counts)
	}
	for _, e := range logs {
		dst = appendHead(dst, e.h, kindLog)
		dst = binary.AppendUvarint(dst, uint64(e.l.n))
		for i := range int(e.l.n) {
			le := e.l.at(i)
			dst = binary.AppendUvarint(dst, delta(le.exp, now))
			dst = binary.AppendUvarint(dst, uint64(le.cost))
		}
	}
	return dst
}

func appendHead(dst []byte, h uint64, kind byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, h)
	return append(dst, kind)
}

// delta is at − now for a live time at > now, clamped to maxDelta.
func delta(at, now int64) uint64 {
	return min(uint64(at)-uint64(now), uint64(maxDelta)) // at > now: no overflow
}

// Import merges a stream made by Export (from any node, at any now of its
// own clock) into partition part, and returns the number of states it
// held. The whole stream is decoded and validated before the partition is
// touched: on error nothing changes. The error wraps ErrPartition when part
// is out of range or differs from the stream's partition, ErrCorrupt when
// the stream is invalid.
//
// A state already held under the same hash is merged conservatively, so
// that importing never admits more than either side would: for a TAT the
// later one; for a Window the later DeadAt, and on equal DeadAt the larger
// of each count; for a Log the imported one.
func (t *Table) Import(part uint32, src []byte, now int64) (n int, err error) {
	if err := t.checkPart(part); err != nil {
		return 0, err
	}
	recs, err := decodeStream(src, part, now)
	if err != nil {
		return 0, err
	}
	p := &t.parts[part]
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tats.reserve(len(recs.tats), now)
	for _, e := range recs.tats {
		if ps := p.tats.get(e.key); ps != nil {
			*ps = max(*ps, e.val)
		} else {
			p.tats.insert(e.key, e.val, now)
		}
	}
	p.wins.reserve(len(recs.wins), now)
	for _, e := range recs.wins {
		if ps := p.wins.get(e.key); ps != nil {
			*ps = mergeWindow(*ps, e.val)
		} else {
			p.wins.insert(e.key, e.val, now)
		}
	}
	if len(recs.logs) > 0 && p.logs == nil {
		p.logs = make(map[uint64]*Log, len(recs.logs))
	}
	for _, e := range recs.logs {
		p.logs[e.h] = e.l
	}
	return recs.count, nil
}

// mergeWindow keeps the window state that admits less.
func mergeWindow(a, b Window) Window {
	switch {
	case a.DeadAt > b.DeadAt:
		return a
	case a.DeadAt < b.DeadAt:
		return b
	}
	hi := max(a.Counts>>32, b.Counts>>32)
	lo := max(a.Counts&math.MaxUint32, b.Counts&math.MaxUint32)
	return Window{DeadAt: a.DeadAt, Counts: hi<<32 | lo}
}

// reserve makes room for k more entries, sweeping or growing once rather
// than on the way.
func (s *slots[V]) reserve(k int, now int64) {
	if k > 0 && overMax(s.n+k, len(s.ents)) {
		s.makeRoom(k, now)
	}
}

// decoded is a validated stream, with absolute times on the importer's
// clock.
type decoded struct {
	count int
	tats  []slot[TAT]
	wins  []slot[Window]
	logs  []logRec
}

type logRec struct {
	h uint64
	l *Log
}

// decoder reads a stream; its methods return *CorruptError on failure.
type decoder struct {
	b   []byte
	off int
}

func (d *decoder) fail(format string, args ...any) error {
	return &CorruptError{Offset: d.off, Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) rest() int { return len(d.b) - d.off }

func (d *decoder) byte1(what string) (byte, error) {
	if d.rest() < 1 {
		return 0, d.fail("truncated %s", what)
	}
	d.off++
	return d.b[d.off-1], nil
}

func (d *decoder) u64(what string) (uint64, error) {
	if d.rest() < 8 {
		return 0, d.fail("truncated %s", what)
	}
	d.off += 8
	return binary.LittleEndian.Uint64(d.b[d.off-8:]), nil
}

// uvarint reads a uvarint in its shortest form, at most hi.
func (d *decoder) uvarint(what string, hi uint64) (uint64, error) {
	v, n := binary.Uvarint(d.b[d.off:])
	switch {
	case n == 0:
		return 0, d.fail("truncated %s", what)
	case n < 0:
		return 0, d.fail("%s overflows 64 bits", what)
	case n != (bits.Len64(v|1)+6)/7:
		return 0, d.fail("%s %d not in its shortest form", what, v)
	case v > hi:
		return 0, d.fail("%s %d over %d", what, v, hi)
	}
	d.off += n
	return v, nil
}

// at reads a time delta and returns now + delta.
func (d *decoder) at(what string, now int64) (int64, error) {
	off := d.off
	v, err := d.uvarint(what, uint64(maxDelta))
	if err != nil {
		return 0, err
	}
	if v == 0 {
		d.off = off
		return 0, d.fail("%s is 0: a dead state", what)
	}
	if now > math.MaxInt64-int64(v) {
		d.off = off
		return 0, d.fail("%s %d overflows the importer's clock at %d", what, v, now)
	}
	return now + int64(v), nil
}

// decodeStream validates a whole stream for partition part and decodes it
// at the importer's now.
func decodeStream(src []byte, part uint32, now int64) (*decoded, error) {
	d := &decoder{b: src}
	if len(src) < len(streamMagic) || string(src[:len(streamMagic)]) != streamMagic {
		return nil, d.fail("no %q magic", streamMagic)
	}
	d.off = len(streamMagic)
	v, err := d.byte1("version")
	if err != nil {
		return nil, err
	}
	if v != streamVersion {
		d.off--
		return nil, d.fail("version %d, want %d", v, streamVersion)
	}
	sp, err := d.uvarint("partition", math.MaxUint32)
	if err != nil {
		return nil, err
	}
	if sp != uint64(part) {
		return nil, fmt.Errorf("%w: stream holds partition %d, importing into %d", ErrPartition, sp, part)
	}
	off := d.off
	count, err := d.uvarint("record count", math.MaxInt32)
	if err != nil {
		return nil, err
	}
	if count > uint64(d.rest()/minRecord) {
		d.off = off
		return nil, d.fail("record count %d, but only %d bytes follow", count, d.rest())
	}
	out := &decoded{count: int(count)}
	lastKind, lastHash := byte(0), uint64(0)
	for range count {
		off := d.off
		h, err := d.u64("hash")
		if err != nil {
			return nil, err
		}
		kind, err := d.byte1("kind")
		if err != nil {
			return nil, err
		}
		if kind < kindTAT || kind > kindLog {
			d.off--
			return nil, d.fail("unknown kind %d", kind)
		}
		if kind < lastKind || kind == lastKind && h <= lastHash {
			d.off = off
			return nil, d.fail("record (kind %d, hash %#x) out of order or duplicate", kind, h)
		}
		lastKind, lastHash = kind, h
		switch kind {
		case kindTAT:
			v, err := d.at("TAT delta", now)
			if err != nil {
				return nil, err
			}
			out.tats = append(out.tats, slot[TAT]{h, TAT(v)})
		case kindWindow:
			w, err := d.window(now)
			if err != nil {
				return nil, err
			}
			out.wins = append(out.wins, slot[Window]{h, w})
		case kindLog:
			l, err := d.log(now)
			if err != nil {
				return nil, err
			}
			out.logs = append(out.logs, logRec{h, l})
		}
	}
	if d.rest() != 0 {
		return nil, d.fail("%d bytes after the last record", d.rest())
	}
	return out, nil
}

func (d *decoder) window(now int64) (Window, error) {
	deadAt, err := d.at("window delta", now)
	if err != nil {
		return Window{}, err
	}
	off := d.off
	c, err := d.uvarint("window counts", math.MaxUint64)
	if err != nil {
		return Window{}, err
	}
	if c == 0 || c>>32 > MaxLimit || c&math.MaxUint32 > MaxLimit {
		d.off = off
		return Window{}, d.fail("window counts %#x: want nonzero halves ≤ %d", c, MaxLimit)
	}
	return Window{DeadAt: deadAt, Counts: c}, nil
}

func (d *decoder) log(now int64) (*Log, error) {
	off := d.off
	n, err := d.uvarint("log length", MaxLogLimit)
	if err != nil {
		return nil, err
	}
	if n == 0 || n > uint64(d.rest()/2) {
		d.off = off
		return nil, d.fail("log length %d with %d bytes left", n, d.rest())
	}
	ents := make([]logEntry, n)
	sum := int64(0)
	for i := range ents {
		off := d.off
		exp, err := d.at("log expiry delta", now)
		if err != nil {
			return nil, err
		}
		if i > 0 && exp < ents[i-1].exp {
			d.off = off
			return nil, d.fail("log entry %d expires before entry %d", i, i-1)
		}
		off = d.off
		c, err := d.uvarint("log cost", MaxLogLimit)
		if err != nil {
			return nil, err
		}
		if c == 0 || sum+int64(c) > MaxLogLimit {
			d.off = off
			return nil, d.fail("log cost %d after a sum of %d: want 1 to a total of %d", c, sum, MaxLogLimit)
		}
		sum += int64(c)
		ents[i] = logEntry{exp: exp, cost: int64(c)}
	}
	return logFrom(ents, sum), nil
}

// logFrom builds a Log holding ents, oldest first, whose costs add up to
// sum.
func logFrom(ents []logEntry, sum int64) *Log {
	l := &Log{exps: make([]int64, len(ents)), n: int32(len(ents)), sum: sum}
	for i, e := range ents {
		l.exps[i] = e.exp
		if e.cost != 1 && l.costs == nil {
			l.costs = make([]uint16, len(ents))
			for j := range l.costs {
				l.costs[j] = 1
			}
		}
		if l.costs != nil {
			l.costs[i] = uint16(e.cost) // the decoder bounds the sum by MaxLogLimit
		}
	}
	return l
}
