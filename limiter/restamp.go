package limiter

import (
	"maps"
	"math"
	"slices"
)

// Restamp appends to dst the partition stream src, which this table
// exported (Export, ExportChanges) at from, as Export would write the
// same states at to, and returns the extended slice. from and to are
// nanoseconds on this table's clock; a to before from is taken as from
// (a clock that ran backwards ages nothing).
//
// A stream is normalised to its exporter's now: times are deltas from
// it, and the importer adds its own now on arrival. A stream kept and
// sent later, or sent again (a hand-off retried, readdressed or taken
// back), therefore arrives to − from younger than its states are:
// tokens spent more recently than they were, admissions still counted in
// windows and logs they have left. Restamped at each send, it arrives as
// old as it is.
//
// Every time delta shrinks by to − from and every rule set's age grows by
// it (at most maxDelta), and what Export would leave out at to is left
// out: the states dead at to (droppable, under this table's rule sets as
// they are when Restamp runs), the log entries expired at to, and the
// sets no record uses any more. A state of an older set, live though its
// own time has passed, is written 1 ns ahead, as Export does (see delta).
// A set this table does not hold (the stream came from another table, or
// the set was released since) counts as older than all it holds, and its
// states are kept whatever their times: what they carry over to is not
// known here, and keeping them never admits more. So for a stream of
// this table, restamped while its sets are registered, Restamp(src, from,
// to) is Export at to of the states Export had at from.
//
// The stream's partition is not checked against the table's. An invalid
// stream returns dst and an error wrapping ErrCorrupt.
func (t *Table) Restamp(dst, src []byte, from, to int64) ([]byte, error) {
	part, err := streamPartition(src)
	if err != nil {
		return dst, err
	}
	recs, err := decodeStream(src, part, from)
	if err != nil {
		return dst, err
	}
	to = max(to, from)

	// Each set's life in this table; a set it does not hold is never
	// dropped (until −∞: no state is idle then; dropAt +∞).
	g := t.sets.Load()
	lives := make([]tagLife, len(recs.sets)+1)
	lives[0] = g.life[legacyTag]
	for i, s := range recs.sets {
		lives[i+1] = tagLife{until: math.MinInt64, dropAt: forever.dropAt}
		if rs := g.lookup(s.version); rs != nil {
			lives[i+1] = g.life[rs.tag]
		}
	}

	// The records live at to, in stream order (by kind, then key), each
	// with its set's number in src.
	type liveRec struct {
		exportRec
		set int
	}
	live := make([]liveRec, 0, recs.count)
	for _, e := range recs.tats {
		if l := lives[e.set]; to < l.dropAt[lifeTAT] && !e.val.idle(min(to, l.until)) {
			live = append(live, liveRec{exportRec{kind: kindTAT, key: e.key, tat: e.val}, e.set})
		}
	}
	for _, e := range recs.wins {
		if l := lives[e.set]; to < l.dropAt[lifeWindow] && !e.val.idle(min(to, l.until)) {
			live = append(live, liveRec{exportRec{kind: kindWindow, key: e.key, win: e.val}, e.set})
		}
	}
	for _, e := range recs.logs {
		if l := lives[e.set]; to < l.dropAt[lifeLog] && !e.l.Dead(min(to, l.until)) { // expires the entries dead at to
			live = append(live, liveRec{exportRec{kind: kindLog, key: e.key, log: e.l}, e.set})
		}
	}

	// The sets still used, numbered afresh from 1 in their stream order.
	ref := make([]uint64, len(recs.sets)+1)
	for _, r := range live {
		ref[r.set] = 1
	}
	var sets []*ruleSet
	var byRef []bool // a set named by reference stays so
	for i, s := range recs.sets {
		if ref[i+1] != 0 {
			sets = append(sets, &ruleSet{version: s.version, since: s.since, rules: s.rules, names: slices.Sorted(maps.Keys(s.rules))})
			byRef = append(byRef, s.ref)
			ref[i+1] = uint64(len(sets))
		}
	}
	ref[0] = 0

	dst = slices.Grow(dst, len(src))
	dst = appendStreamHead(dst, part, sets, byRef, len(live), to)
	for i := range live {
		dst = appendRecord(dst, &live[i].exportRec, ref[live[i].set], to)
	}
	return dst, nil
}

// streamPartition reads the partition number of a stream's header.
func streamPartition(src []byte) (uint32, error) {
	d := &decoder{b: src}
	if _, err := d.format(); err != nil {
		return 0, err
	}
	p, err := d.uvarint("partition", math.MaxUint32)
	return uint32(p), err
}
