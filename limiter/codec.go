package limiter

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"
)

// A partition crosses machines (hand-off, backup) as a compact byte
// stream of its live states. Times in it are relative to the exporter's
// now, so no absolute wall time crosses machines: the importer adds its
// own now. Each state says which rule set it was made under, and the
// stream carries those sets, so that an importer with newer rules carries
// the states over (see rulesets.go) however little it knew of the old ones.
//
//	stream  = "RLP1" · version · partition · nsets · set × nsets · count · record × count
//	version = 1 byte: 2, or 3 when a set is named by reference (format 1,
//	          without sets, is no longer read)
//	partition, nsets, count = uvarint
//	set     = uvarint(rules version ≥ 1) · body                      (format 2)
//	set     = uvarint(rules version ≥ 1) · 0 · body | … · 1          (format 3: in full, or by reference)
//	body    = uvarint(now − since) · uvarint(nrules) · rule × nrules
//	rule    = uvarint(len(name)) · name · algorithm (1 byte) · uvarint(limit) · uvarint(period, ns) · uvarint(burst)
//	record  = key · kind · uvarint(set) · payload
//	key     = the bucket's slot key (see slotKey) >> 8, 7 bytes little endian
//	kind    = 1 byte: 1 TAT, 2 Window, 3 Log
//	set     = 0 for the unversioned set, i for the i-th set of the stream
//	payload, kind 1 (TAT):    uvarint(TAT − now)
//	payload, kind 2 (Window): uvarint(DeadAt − now) · uvarint(Counts)
//	payload, kind 3 (Log):    uvarint(n) · n × (uvarint(exp − now) · uvarint(cost))
//
// A set by reference (ExportChanges with SetRefs) is its version alone:
// the importer must hold that version already (it takes a set it holds
// with its own rules and time in any case), or the import fails with
// ErrUnknownSet. A backup stream sent every few milliseconds thus carries
// no rules once its importer has them, however many rules there are (it
// carried every rule of every set it named, per partition: a cluster
// with 10,000 rules spent ~3.5 ms importing each changed partition).
//
// The encoding is canonical: one set of states at one now (and one
// choice of the sets named by reference) has exactly one stream, and
// Import rejects every other byte string. (ExportChanges writes coarse
// sliding logs, which are other states: its bytes differ from Export's
// for the same table.) A valid stream has
//
//   - format 3 only when a set is named by reference;
//   - sets in strictly increasing rules version, each used by a record,
//     "now − since" ≤ maxDelta (the exporter clamps it), rules valid
//     (Rule.Validate) and in strictly increasing name order;
//   - records sorted by (kind, key), strictly increasing: no duplicates,
//     but one key may appear under two kinds, as in the table's stores;
//   - only live states: every time delta ≥ 1 and ≤ maxDelta; Counts ≠ 0,
//     with each 32-bit half ≤ MaxLimit; a log of 1 to MaxLogLimit
//     entries in non-decreasing expiry order, each of cost ≥ 1, their sum
//     ≤ MaxLogLimit (a sliding_log Limit);
//   - uvarints in their shortest form, and no byte after the last record.
//
// Export clamps a delta above maxDelta (only a clock that ran far
// backwards makes one) to maxDelta, and writes a time at or before now
// of a state that is live all the same (one of an older rule set, see
// delta) as 1.
const (
	streamMagic   = "RLP1"
	streamVersion = 2
	// streamRefVersion is the format of a stream that names a set by
	// reference.
	streamRefVersion = 3
	setInFull        = 0
	setByRef         = 1

	kindTAT    = 1
	kindWindow = 2
	kindLog    = 3

	// keyBytes is the size of a record's key.
	keyBytes = 7

	// minRecord is the size of the smallest record (a TAT whose set and
	// delta take one byte each): it bounds count by the bytes that follow.
	minRecord = keyBytes + 1 + 1 + 1

	// minRule is the size of the smallest rule: it bounds nrules.
	minRule = 1 + 1 + 1 + 1 + 1 + 1

	// maxDelta bounds every time delta in a stream: twice the longest
	// a TAT may legitimately run ahead (MaxTolerance), about 20 years.
	// It keeps importer's now + delta, and the steps' arithmetic on it,
	// far from overflow.
	maxDelta = 2 * int64(MaxTolerance)
)

// ErrCorrupt: an Import stream that is not a valid export. The error is a
// *CorruptError that says where and why.
var ErrCorrupt = errors.New("limiter: corrupt partition stream")

// ErrUnknownSet: an Import stream names by reference a rule set that the
// table does not hold (SetRefs told its exporter otherwise); nothing was
// imported. Send it again with that set in full.
var ErrUnknownSet = errors.New("limiter: stream names a rule set this table does not hold")

// SetRefs is what an exporter knows of its importer's rule sets
// (ExportChanges): a set of a version that Known reports is written as
// its version alone; every other set is written in full, and Sent is told
// its version. Implementations need not be safe for concurrent use: an
// export calls them under the partition's lock, one at a time.
type SetRefs interface {
	Known(version uint64) bool
	Sent(version uint64)
}

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
	return t.appendLive(dst, part, p, t.sets.Load(), now, nil, false) // sets under the lock: see freeTag
}

// appendLive appends the stream of every state of p (partition part)
// live at now, with the table's rule sets g, naming by reference the
// sets refs knows (nil: none), its logs coarsened when coarse (see
// appendCoarseLog). The caller holds p.mu.
func (t *Table) appendLive(dst []byte, part uint32, p *partition, g *ruleSets, now int64, refs SetRefs, coarse bool) []byte {
	recs := t.scratch()
	defer t.release(recs)
	*recs = p.liveRecords(*recs, now, g)
	return appendStream(dst, part, *recs, g, now, refs, coarse)
}

// scratch returns an empty slice of records for one export, to give back
// with release: under load every partition is exported every backup
// round, and a fresh slice each time (its records hold pointers: zeroed,
// then scanned by the GC) cost the owner a third of each export.
func (t *Table) scratch() *[]exportRec {
	if s, ok := t.recs.Get().(*[]exportRec); ok {
		return s
	}
	return new([]exportRec)
}

// release gives back a scratch slice, cleared (it must not keep logs
// alive); one grown past maxScratch records is dropped instead.
func (t *Table) release(s *[]exportRec) {
	const maxScratch = 1 << 16
	if cap(*s) > maxScratch {
		return
	}
	clear(*s)
	*s = (*s)[:0]
	t.recs.Put(s)
}

// exportRec is one state on its way into a stream.
type exportRec struct {
	kind byte
	key  uint64
	tag  uint8
	tat  TAT
	win  Window
	log  *Log
}

// liveRecords appends to recs every state of p live at now, sorted by
// (kind, key), and returns the extended slice. The caller holds p.mu.
//
// Each kind is gathered and sorted by key on its own: a slot map's
// entries lie in key order but for probe runs (home is monotone in the
// key), so the sort finds them nearly sorted.
func (p *partition) liveRecords(recs []exportRec, now int64, g *ruleSets) []exportRec {
	recs = slices.Grow(recs, p.tats.n+p.wins.n+len(p.logs))
	n := len(recs)
	p.tats.all(func(k uint64, tag uint8, v TAT) {
		if !droppable(v, tag, now, g) {
			recs = append(recs, exportRec{kind: kindTAT, key: k, tag: tag, tat: v})
		}
	})
	sortByKey(recs[n:])
	n = len(recs)
	p.wins.all(func(k uint64, tag uint8, v Window) {
		if !droppable(v, tag, now, g) {
			recs = append(recs, exportRec{kind: kindWindow, key: k, tag: tag, win: v})
		}
	})
	sortByKey(recs[n:])
	n = len(recs)
	for k, l := range p.logs {
		if !droppableLog(l, now, g) { // drops the entries expired at now
			recs = append(recs, exportRec{kind: kindLog, key: k, tag: l.tag, log: l})
		}
	}
	sortByKey(recs[n:])
	return recs
}

// sortByKey sorts records of one kind by key, as a stream holds them.
func sortByKey(recs []exportRec) {
	slices.SortFunc(recs, func(a, b exportRec) int { return cmp.Compare(a.key, b.key) })
}

// appendStream appends the stream of recs (sorted by kind, then key) of
// partition part at now, naming by reference the sets refs knows (nil:
// none), its logs coarsened when coarse (see appendCoarseLog).
func appendStream(dst []byte, part uint32, recs []exportRec, g *ruleSets, now int64, refs SetRefs, coarse bool) []byte {
	// The sets the records use, in version order, numbered from 1.
	var ref [maxTags]uint64
	for _, r := range recs {
		ref[r.tag] = 1
	}
	var sets []*ruleSet
	var byRef [maxTags]bool // by the set's number − 1
	for _, s := range g.sets {
		if s.version != 0 && ref[s.tag] != 0 {
			if refs != nil {
				if byRef[len(sets)] = refs.Known(s.version); !byRef[len(sets)] {
					refs.Sent(s.version)
				}
			}
			sets = append(sets, s)
			ref[s.tag] = uint64(len(sets))
		}
	}
	ref[legacyTag] = 0

	dst = slices.Grow(dst, 16+len(recs)*16)
	dst = appendStreamHead(dst, part, sets, byRef[:len(sets)], len(recs), now)
	for i := range recs {
		if coarse && recs[i].kind == kindLog && recs[i].log.n > maxCoarseLog {
			dst = appendCoarseLog(dst, &recs[i], ref[recs[i].tag], now)
			continue
		}
		dst = appendRecord(dst, &recs[i], ref[recs[i].tag], now)
	}
	return dst
}

// appendStreamHead appends a stream's header, its rule sets at now (set
// i by reference where byRef[i]) and its record count: what precedes the
// records.
func appendStreamHead(dst []byte, part uint32, sets []*ruleSet, byRef []bool, records int, now int64) []byte {
	dst = append(dst, streamMagic...)
	format := byte(streamVersion)
	if slices.Contains(byRef, true) {
		format = streamRefVersion
	}
	dst = append(dst, format)
	dst = binary.AppendUvarint(dst, uint64(part))
	dst = binary.AppendUvarint(dst, uint64(len(sets)))
	for i, s := range sets {
		dst = binary.AppendUvarint(dst, s.version)
		switch {
		case format == streamVersion:
		case byRef[i]:
			dst = append(dst, setByRef)
			continue
		default:
			dst = append(dst, setInFull)
		}
		dst = appendSetBody(dst, s, now)
	}
	return binary.AppendUvarint(dst, uint64(records))
}

// appendRecord appends record r, of the stream's set number set, at now.
func appendRecord(dst []byte, r *exportRec, set uint64, now int64) []byte {
	dst = appendRecordHead(dst, r, set)
	switch r.kind {
	case kindTAT:
		dst = binary.AppendUvarint(dst, delta(int64(r.tat), now))
	case kindWindow:
		dst = binary.AppendUvarint(dst, delta(r.win.DeadAt, now))
		dst = binary.AppendUvarint(dst, r.win.Counts)
	case kindLog:
		dst = binary.AppendUvarint(dst, uint64(r.log.n))
		for i := range int(r.log.n) {
			le := r.log.at(i)
			dst = binary.AppendUvarint(dst, delta(le.exp, now))
			dst = binary.AppendUvarint(dst, uint64(le.cost))
		}
	}
	return dst
}

// maxCoarseLog is the most entries a sliding log has in a coarse export
// (ExportChanges, for a backup copy).
const maxCoarseLog = 64

// appendCoarseLog appends log record r as appendRecord does, its entries
// merged into at most maxCoarseLog: the log's span (oldest to newest
// expiry) is cut into maxCoarseLog equal bins, and each bin's entries
// become one, of their summed cost, expiring with the bin's newest.
//
// A backup copy is pushed every few milliseconds and, exact, carried
// every entry of every changed log each time: a log of a 10,000-per-hour
// rule is ~70 KB, and 3,000 busy keys of one such rule held the owners
// of a 3-member cluster at both cores (1.1–1.3 s of backup lag, the
// leader stepping down, 86,555 degraded answers in 100 s). Coarsened,
// a log costs at most ~64 × 8 bytes and O(64 log n) to write (a
// weighted log, whose costs are summed, O(n) additions). The copy
// then admits less than the owner's log, never more: every admission it
// holds is forgotten at the latest expiry of its bin, at most span / 64
// (≤ the rule's period / 64) later than the owner forgets it; so a
// crash's promoted copy may deny up to 1/64 of a period longer. The
// hand-offs and the bucket file (Export) stay exact.
func appendCoarseLog(dst []byte, r *exportRec, set uint64, now int64) []byte {
	l := r.log
	n := int(l.n)
	first, last := l.at(0).exp, l.at(n-1).exp
	width := (last-first)/maxCoarseLog + 1 // maxCoarseLog bins cover the span
	// The ring buffer's entries, oldest first, as its two runs.
	run1 := l.exps[l.head:min(int(l.head)+n, len(l.exps))]
	run2 := l.exps[:n-len(run1)]
	var bins [maxCoarseLog]logEntry
	nb := 0
	for i := 0; i < n; nb++ {
		// The bin of entry i ends before the first entry at or past its
		// boundary; entries are in expiry order.
		bound := first + (((l.at(i).exp-first)/width)+1)*width
		var j int
		if i < len(run1) && run1[len(run1)-1] >= bound {
			k, _ := slices.BinarySearch(run1[i:], bound)
			j = i + k
		} else {
			from := max(i-len(run1), 0)
			k, _ := slices.BinarySearch(run2[from:], bound)
			j = len(run1) + from + k
		}
		cost := int64(j - i)
		if l.costs != nil { // a weighted log: summed, run by run
			cost = sumCosts(l.costs[l.head:int(l.head)+len(run1)], i, j) + sumCosts(l.costs[:len(run2)], i-len(run1), j-len(run1))
		}
		bins[nb] = logEntry{exp: l.exps[l.slot(j-1)], cost: cost}
		i = j
	}
	dst = appendRecordHead(dst, r, set)
	dst = binary.AppendUvarint(dst, uint64(nb))
	for _, b := range bins[:nb] {
		dst = binary.AppendUvarint(dst, delta(b.exp, now))
		dst = binary.AppendUvarint(dst, uint64(b.cost))
	}
	return dst
}

// sumCosts is the sum of run[i:j], i and j clamped to the run.
func sumCosts(run []uint16, i, j int) int64 {
	lo, hi := min(max(i, 0), len(run)), min(max(j, 0), len(run))
	sum := int64(0)
	for _, c := range run[lo:max(hi, lo)] {
		sum += int64(c)
	}
	return sum
}

// appendRecordHead appends what precedes record r's payload: its key,
// kind and set number.
func appendRecordHead(dst []byte, r *exportRec, set uint64) []byte {
	n := len(dst)
	dst = binary.LittleEndian.AppendUint64(dst, r.key>>8)[:n+keyBytes]
	dst = append(dst, r.kind)
	return binary.AppendUvarint(dst, set)
}

// appendSetBody appends what follows a set's version when it is written
// in full: its age at now and its rules.
func appendSetBody(dst []byte, s *ruleSet, now int64) []byte {
	age := uint64(0)
	if s.since < now {
		age = min(uint64(now)-uint64(s.since), uint64(maxDelta))
	}
	dst = binary.AppendUvarint(dst, age)
	dst = binary.AppendUvarint(dst, uint64(len(s.rules)))
	for _, name := range s.names {
		r := s.rules[name]
		dst = binary.AppendUvarint(dst, uint64(len(name)))
		dst = append(dst, name...)
		dst = append(dst, byte(r.Algorithm))
		dst = binary.AppendUvarint(dst, uint64(r.Limit))
		dst = binary.AppendUvarint(dst, uint64(r.Period))
		dst = binary.AppendUvarint(dst, uint64(r.Burst))
	}
	return dst
}

// delta is at − now for a time of a live state, clamped to [1, maxDelta].
//
// A state of the newest rule set is live only while its times are after
// now; one of an older set stays live while it still matters what it
// carries over to the next set, at that set's coming into force (see
// droppable), though its own times may be past by now. The stream cannot
// say "in the past", so such a time is written 1 ns ahead: a later time
// carries over to at least as much as the state held (more debt, or
// admissions counted longer), never less.
func delta(at, now int64) uint64 {
	if at <= now {
		return 1
	}
	return min(uint64(at)-uint64(now), uint64(maxDelta))
}

// Import merges a stream made by Export (from any node, at any now of its
// own clock) into partition part, and returns the number of states it
// held. The whole stream is decoded and validated before the partition is
// touched: on error nothing changes. The error wraps ErrPartition when part
// is out of range or differs from the stream's partition, ErrCorrupt when
// the stream is invalid, ErrUnknownSet when it names by reference a set
// the table does not hold.
//
// The stream's rule sets that the table does not hold are registered, as
// having come into force when the exporter says (now − their age); a set
// the table holds keeps its own time. Imported states then carry over to
// newer rules on their next check like any other.
//
// A state already held under the same key is merged conservatively when
// both were made under the same rule set, so that importing never admits
// more than either side would: for a TAT the later one; for a Window the
// later DeadAt and the larger of each count; for a Log the upper
// envelope of the two (see mergeLogs), which holds, at every future
// instant, as much as the heavier of them. When the sets differ, the
// state of the newer set is kept.
func (t *Table) Import(part uint32, src []byte, now int64) (n int, err error) {
	return t.importStream(part, src, now, false)
}

// importStream is Import; with replace, a state of the stream takes the
// place of the one held under the same key, whatever either holds (see
// ImportChanges).
func (t *Table) importStream(part uint32, src []byte, now int64, replace bool) (n int, err error) {
	if err := t.checkPart(part); err != nil {
		return 0, err
	}
	recs, err := decodeStream(src, part, now)
	if err != nil {
		return 0, err
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	tags := make([]uint8, len(recs.sets)+1)
	tags[0] = legacyTag
	// The sets registered here carry no state until the merge below:
	// pinned, so that registering a later one does not release their
	// tags (and hand them on) meanwhile. Was: released, and the merge
	// panicked on a tag naming no set, or stored states under it. A set
	// for which no tag can be freed has its states taken as unversioned
	// (adopted, as the oldest set's are when every tag is live).
	var pinned [maxTags]bool
	for i, s := range recs.sets {
		if !s.ref {
			continue
		}
		// Resolved, and pinned, before any set is registered: nothing
		// changes when one is not held.
		rs := t.sets.Load().lookup(s.version)
		if rs == nil {
			return 0, fmt.Errorf("%w: version %d (partition %d)", ErrUnknownSet, s.version, part)
		}
		tags[i+1], pinned[rs.tag] = rs.tag, true
	}
	t.registerInFull(recs, tags, &pinned)
	t.pass.note(tags) // a partition swept already may now carry them
	g := t.sets.Load()
	newer := func(a, b uint8) bool { return g.byTag[a].version > g.byTag[b].version }
	p := &t.parts[part]
	p.mu.Lock()
	defer p.mu.Unlock()
	// The stream's times are relative to now (decodeStream), so a late
	// Import keeps its own now; growing the stores may drop states at it,
	// though, so later checks run no earlier (see clock).
	p.last = max(p.last, now)
	p.tats.reserve(len(recs.tats), now, g)
	for _, e := range recs.tats {
		tag := tags[e.set]
		switch ps := p.tats.find(e.key); {
		case ps == nil:
			p.tats.insert(e.key, tag, e.val, now, g)
		case replace:
			ps.val, ps.key = e.val, e.key|uint64(tag)
		case ps.tag() == tag:
			ps.val = max(ps.val, e.val)
		case newer(tag, ps.tag()):
			ps.val, ps.key = e.val, e.key|uint64(tag)
		}
	}
	p.wins.reserve(len(recs.wins), now, g)
	for _, e := range recs.wins {
		tag := tags[e.set]
		switch ps := p.wins.find(e.key); {
		case ps == nil:
			p.wins.insert(e.key, tag, e.val, now, g)
		case replace:
			ps.val, ps.key = e.val, e.key|uint64(tag)
		case ps.tag() == tag:
			ps.val = mergeWindow(ps.val, e.val)
		case newer(tag, ps.tag()):
			ps.val, ps.key = e.val, e.key|uint64(tag)
		}
	}
	if len(recs.logs) > 0 && p.logs == nil {
		p.logs = make(map[uint64]*Log, len(recs.logs))
	}
	for _, e := range recs.logs {
		e.l.tag = tags[e.set]
		switch old, ok := p.logs[e.key]; {
		case replace || !ok || newer(e.l.tag, old.tag):
			p.logs[e.key] = e.l
		case old.tag == e.l.tag:
			old.expire(now) // the stream's entries are all live at now
			p.logs[e.key] = mergeLogs(old, e.l)
		}
	}
	return recs.count, nil
}

// registerInFull registers the sets of recs written in full, pinning
// each (see importStream), and sets tags[i+1] to set i's tag: legacyTag
// when no tag could be freed for it. Sets by reference are left as they
// are. t.regMu must be held.
func (t *Table) registerInFull(recs *decoded, tags []uint8, pinned *[maxTags]bool) {
	for i, s := range recs.sets {
		if s.ref {
			continue
		}
		tags[i+1] = legacyTag
		if rs := t.register(s.version, s.rules, s.since, false, pinned); rs != nil {
			tags[i+1], pinned[rs.tag] = rs.tag, true
		}
	}
}

// RegisterSets registers the rule sets that stream src (of any
// partition) carries in full, as Import would, and takes none of its
// states: what a backup member does with a part of a push it does not
// take (not its partition to back up, or a delta without a whole copy),
// so that later parts of the same push, which name those sets by
// reference, find them. Errors are Import's ErrCorrupt.
func (t *Table) RegisterSets(src []byte, now int64) error {
	part, err := streamPartition(src)
	if err != nil {
		return err
	}
	recs, err := decodeStream(src, part, now)
	if err != nil {
		return err
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	var pinned [maxTags]bool
	t.registerInFull(recs, make([]uint8, len(recs.sets)+1), &pinned)
	return nil
}

// mergeWindow keeps the window state that admits less: the later DeadAt,
// and the larger of each count. Without the rule it cannot tell whether
// the two are in the same window (DeadAt also holds Last, see Window);
// when they are not, the merged state over-counts the later window by
// what the earlier one held, which never admits more.
func mergeWindow(a, b Window) Window {
	hi := max(a.Counts>>32, b.Counts>>32)
	lo := max(a.Counts&math.MaxUint32, b.Counts&math.MaxUint32)
	return Window{DeadAt: max(a.DeadAt, b.DeadAt), Counts: hi<<32 | lo}
}

// mergeLogs returns the log that admits less than both a and b at every
// instant: their upper envelope. With C(t) the cost of a log's entries
// still in the window at t (those expiring after t), the merged log has
// C(t) = max(C_a(t), C_b(t)) for every t. Its sum is max(a.sum, b.sum),
// within the limit both keep, so it holds at most that many entries (and
// at most a.n + b.n). Merging a log with itself, or with an older copy of
// itself from the same clock (both rid of the entries expired at the same
// now), returns the same entries. a and b are neither changed nor shared
// with the result.
//
// The envelope only steps down at an expiry of a or b: walking the
// expiries in order, each step becomes entries of the merged log. Where
// a (or b) is the envelope on both sides of the step, its entries at that
// expiry are copied (a's first), so a comes back as it is when it holds
// at least as much as b at every instant; otherwise a step of unit-cost
// logs becomes unit entries (for unit costs the merged log is the
// element-wise max of the two newest-first expiry lists), and any other
// step one entry of its size, which fits a cost (see below).
func mergeLogs(a, b *Log) *Log {
	ents := make([]logEntry, 0, max(a.n, b.n))
	unit := a.costs == nil && b.costs == nil
	ra, rb := int64(a.sum), int64(b.sum) // C_a, C_b just before the next expiry
	i, j := 0, 0
	for i < int(a.n) || j < int(b.n) {
		e := int64(math.MaxInt64)
		if i < int(a.n) {
			e = a.at(i).exp
		}
		if j < int(b.n) {
			e = min(e, b.at(j).exp)
		}
		i0, j0 := i, j
		ga, gb := int64(0), int64(0) // the cost of a's and b's entries expiring at e
		for ; i < int(a.n) && a.at(i).exp == e; i++ {
			ga += a.at(i).cost
		}
		for ; j < int(b.n) && b.at(j).exp == e; j++ {
			gb += b.at(j).cost
		}
		before, after := max(ra, rb), max(ra-ga, rb-gb)
		switch {
		case before == after:
		case ra == before && ra-ga == after: // a is the envelope around e
			for k := i0; k < i; k++ {
				ents = append(ents, a.at(k))
			}
		case rb == before && rb-gb == after:
			for k := j0; k < j; k++ {
				ents = append(ents, b.at(k))
			}
		case unit:
			for range before - after {
				ents = append(ents, logEntry{exp: e, cost: 1})
			}
		default:
			ents = append(ents, logEntry{exp: e, cost: before - after})
		}
		ra, rb = ra-ga, rb-gb
	}
	l := logFrom(ents, int64(max(a.sum, b.sum)))
	l.tag = a.tag
	return l
}

// A Log keeps costs as uint16, and a step of mergeLogs may be as large as
// a log's sum: this fails to compile if MaxLogLimit outgrows a cost.
const _ uint16 = MaxLogLimit

// reserve makes room for k more entries, sweeping or growing once rather
// than on the way.
func (s *slots[V]) reserve(k int, now int64, g *ruleSets) {
	if k > 0 && overMax(s.n+k, len(s.ents)) {
		s.makeRoom(k, now, g)
	}
}

// decoded is a validated stream, with absolute times on the importer's
// clock.
type decoded struct {
	count int
	sets  []decodedSet
	tats  []decodedRec[TAT]
	wins  []decodedRec[Window]
	logs  []decodedRec[*Log]
}

type decodedSet struct {
	version uint64
	since   int64
	rules   map[string]*Rule
	ref     bool // named by reference: no since, no rules
}

type decodedRec[V any] struct {
	key uint64 // slot key
	set int    // 0: unversioned; i: sets[i-1]
	val V
	l   *Log // logs only
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

func (d *decoder) key() (uint64, error) {
	if d.rest() < keyBytes {
		return 0, d.fail("truncated key")
	}
	var b [8]byte
	copy(b[:], d.b[d.off:d.off+keyBytes])
	d.off += keyBytes
	return binary.LittleEndian.Uint64(b[:]) << 8, nil
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

// format reads a stream's magic and format version.
func (d *decoder) format() (byte, error) {
	if len(d.b) < len(streamMagic) || string(d.b[:len(streamMagic)]) != streamMagic {
		return 0, d.fail("no %q magic", streamMagic)
	}
	d.off = len(streamMagic)
	v, err := d.byte1("version")
	if err != nil {
		return 0, err
	}
	if v != streamVersion && v != streamRefVersion {
		d.off--
		return 0, d.fail("format version %d, want %d or %d", v, streamVersion, streamRefVersion)
	}
	return v, nil
}

// decodeStream validates a whole stream for partition part and decodes it
// at the importer's now.
func decodeStream(src []byte, part uint32, now int64) (*decoded, error) {
	d := &decoder{b: src}
	format, err := d.format()
	if err != nil {
		return nil, err
	}
	sp, err := d.uvarint("partition", math.MaxUint32)
	if err != nil {
		return nil, err
	}
	if sp != uint64(part) {
		return nil, fmt.Errorf("%w: stream holds partition %d, importing into %d", ErrPartition, sp, part)
	}
	out := &decoded{}
	off := d.off
	nsets, err := d.uvarint("set count", maxTags)
	if err != nil {
		return nil, err
	}
	if nsets > uint64(d.rest()/3) {
		d.off = off
		return nil, d.fail("set count %d, but only %d bytes follow", nsets, d.rest())
	}
	byRef := false
	for i := range nsets {
		s, err := d.set(now, format)
		if err != nil {
			return nil, err
		}
		if i > 0 && s.version <= out.sets[i-1].version {
			return nil, d.fail("set of version %d after version %d", s.version, out.sets[i-1].version)
		}
		byRef = byRef || s.ref
		out.sets = append(out.sets, s)
	}
	if format == streamRefVersion && !byRef {
		return nil, d.fail("format %d, but no set by reference", format)
	}
	var usedBuf [maxTags + 1]bool // nsets ≤ maxTags
	used := usedBuf[:nsets+1]
	off = d.off
	count, err := d.uvarint("record count", math.MaxInt32)
	if err != nil {
		return nil, err
	}
	if count > uint64(d.rest()/minRecord) {
		d.off = off
		return nil, d.fail("record count %d, but only %d bytes follow", count, d.rest())
	}
	out.count = int(count)
	lastKind, lastKey := byte(0), uint64(0)
	for i := range count {
		off := d.off
		k, err := d.key()
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
		if kind < lastKind || kind == lastKind && k <= lastKey {
			d.off = off
			return nil, d.fail("record (kind %d, key %#x) out of order or duplicate", kind, k>>8)
		}
		lastKind, lastKey = kind, k
		set, err := d.uvarint("set", nsets)
		if err != nil {
			return nil, err
		}
		used[set] = true
		switch kind {
		case kindTAT:
			v, err := d.at("TAT delta", now)
			if err != nil {
				return nil, err
			}
			if out.tats == nil {
				out.tats = make([]decodedRec[TAT], 0, count-i) // the rest, at most
			}
			out.tats = append(out.tats, decodedRec[TAT]{k, int(set), TAT(v), nil})
		case kindWindow:
			w, err := d.window(now)
			if err != nil {
				return nil, err
			}
			if out.wins == nil {
				out.wins = make([]decodedRec[Window], 0, count-i)
			}
			out.wins = append(out.wins, decodedRec[Window]{k, int(set), w, nil})
		case kindLog:
			l, err := d.log(now)
			if err != nil {
				return nil, err
			}
			out.logs = append(out.logs, decodedRec[*Log]{k, int(set), l, l})
		}
	}
	if d.rest() != 0 {
		return nil, d.fail("%d bytes after the last record", d.rest())
	}
	for i := 1; i < len(used); i++ {
		if !used[i] {
			return nil, d.fail("set %d (version %d) used by no record", i, out.sets[i-1].version)
		}
	}
	return out, nil
}

// set reads a set of a stream of the given format.
func (d *decoder) set(now int64, format byte) (decodedSet, error) {
	var s decodedSet
	off := d.off
	v, err := d.uvarint("rules version", math.MaxUint64)
	if err != nil {
		return s, err
	}
	if v == 0 {
		d.off = off
		return s, d.fail("rules version 0 in a set")
	}
	if format == streamRefVersion {
		form, err := d.byte1("set form")
		if err != nil {
			return s, err
		}
		switch form {
		case setByRef:
			s.version, s.ref = v, true
			return s, nil
		case setInFull:
		default:
			d.off--
			return s, d.fail("set form %d", form)
		}
	}
	off = d.off
	age, err := d.uvarint("set age", uint64(maxDelta))
	if err != nil {
		return s, err
	}
	if now < math.MinInt64+int64(age) {
		d.off = off
		return s, d.fail("set age %d overflows the importer's clock at %d", age, now)
	}
	off = d.off
	n, err := d.uvarint("rule count", math.MaxInt32)
	if err != nil {
		return s, err
	}
	if n > uint64(d.rest()/minRule) {
		d.off = off
		return s, d.fail("rule count %d, but only %d bytes follow", n, d.rest())
	}
	s.version, s.since, s.rules = v, now-int64(age), make(map[string]*Rule, n)
	last := ""
	for i := range n {
		off := d.off
		r, err := d.rule()
		if err != nil {
			return s, err
		}
		if i > 0 && r.Name <= last {
			d.off = off
			return s, d.fail("rule %q after %q", r.Name, last)
		}
		last = r.Name
		s.rules[r.Name] = &r
	}
	return s, nil
}

func (d *decoder) rule() (Rule, error) {
	var r Rule
	off := d.off
	n, err := d.uvarint("rule name length", MaxNameLen)
	if err != nil {
		return r, err
	}
	if uint64(d.rest()) < n {
		return r, d.fail("truncated rule name")
	}
	r.Name = string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	a, err := d.byte1("algorithm")
	if err != nil {
		return r, err
	}
	r.Algorithm = Algorithm(a)
	lim, err := d.uvarint("limit", MaxLimit)
	if err != nil {
		return r, err
	}
	per, err := d.uvarint("period", uint64(MaxPeriod))
	if err != nil {
		return r, err
	}
	burst, err := d.uvarint("burst", MaxLimit)
	if err != nil {
		return r, err
	}
	r.Limit, r.Period, r.Burst = int64(lim), time.Duration(per), int64(burst)
	if err := r.Validate(); err != nil {
		d.off = off
		return r, d.fail("%v", err)
	}
	return r, nil
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
// sum ≤ MaxLogLimit.
func logFrom(ents []logEntry, sum int64) *Log {
	l := &Log{exps: make([]int64, len(ents)), n: int32(len(ents)), sum: int32(sum)}
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
