package limiter

import "slices"

// Delta exports. An owner pushes its changed partitions to their backup
// every few milliseconds; a whole export costs O(states of the partition)
// per push even when a handful changed, and under load every partition
// changes in every round. A table that tracks changes (TrackChanges)
// keeps, per partition, the slot keys of the states that checks wrote
// since the last ExportChanges, and ExportChanges streams only those. The
// importer replaces its states with them (ImportChanges), which is right
// for a copy that only ever receives from the one owner, in order.
//
// The list is bounded: past 1/changedShare of the partition's states (and
// at least minChanged keys) the partition is marked changed whole and the
// list is let go, so tracking never holds more than 2 bytes per state and
// a push never costs more than a whole export. A key checked many times
// is listed many times until the export sorts the list.
const (
	changedShare = 4
	minChanged   = 64
)

// TrackChanges makes checks note which states they write, for
// ExportChanges. Call it before the table is used.
func (t *Table) TrackChanges() {
	for i := range t.parts {
		t.parts[i].track = true
	}
}

// noteChanged records that a check wrote the state of slot key k. The
// caller holds p.mu.
func (p *partition) noteChanged(k uint64) {
	if p.changedAll {
		return
	}
	if len(p.changed) >= max(minChanged, (p.tats.n+p.wins.n+len(p.logs))/changedShare) {
		p.changedAll, p.changed = true, nil
		return
	}
	p.changed = append(p.changed, k)
}

// ExportChanges appends to dst the stream (as Export, but for its
// sliding logs, which are coarse: appendCoarseLog) of the states of
// partition part that checks wrote since the previous ExportChanges and
// that are live at now, and forgets them. The stream is a backup copy,
// which admits no more than the owner. It exports the whole partition,
// and reports whole, when all is set, when the table does not track
// changes, or when too many changed to be listed. A state written and
// then dropped as idle is not in the stream: the importer's older copy of
// it is idle too. The sets refs knows are named by reference (nil: none,
// every set in full).
func (t *Table) ExportChanges(dst []byte, part uint32, now int64, all bool, refs SetRefs) (stream []byte, whole bool) {
	p := t.part(part)
	p.mu.Lock()
	defer p.mu.Unlock()
	g := t.sets.Load() // under the lock: see freeTag
	if all || !p.track || p.changedAll {
		p.changedAll, p.changed = false, p.changed[:0]
		return t.appendLive(dst, part, p, g, now, refs, true), true
	}
	// The keys sorted once (8 bytes each, a key listed twice once), then
	// looked up kind by kind: the records come out in stream order, and
	// under churn (states that die between checks) a dead one costs a
	// lookup and nothing more.
	keys := p.changed
	slices.Sort(keys)
	keys = slices.Compact(keys)
	scratch := t.scratch()
	defer t.release(scratch)
	recs := slices.Grow(*scratch, len(keys))
	for _, k := range keys {
		if e := p.tats.find(k); e != nil && !droppable(e.val, e.tag(), now, g) {
			recs = append(recs, exportRec{kind: kindTAT, key: k, tag: e.tag(), tat: e.val})
		}
	}
	if p.wins.n > 0 {
		for _, k := range keys {
			if e := p.wins.find(k); e != nil && !droppable(e.val, e.tag(), now, g) {
				recs = append(recs, exportRec{kind: kindWindow, key: k, tag: e.tag(), win: e.val})
			}
		}
	}
	if len(p.logs) > 0 {
		for _, k := range keys {
			if l, ok := p.logs[k]; ok && !droppableLog(l, now, g) {
				recs = append(recs, exportRec{kind: kindLog, key: k, tag: l.tag, log: l})
			}
		}
	}
	p.changed = p.changed[:0]
	*scratch = recs // released grown, and cleared
	return appendStream(dst, part, recs, g, now, refs, true), false
}

// ImportChanges takes a stream made by ExportChanges (or Export) into
// partition part as Import does, except that each state of the stream
// replaces the one held under the same key instead of merging with it:
// the exporter's state is the newer one. Errors are Import's; on error
// nothing changes.
func (t *Table) ImportChanges(part uint32, src []byte, now int64) (n int, err error) {
	return t.importStream(part, src, now, true)
}
