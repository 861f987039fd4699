package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// A member's bucket state lives in memory, and in a cluster its backups
// keep it over a restart. The last active member has nobody to hand its
// partitions to, so when it stops gracefully it writes them to
// bucketFile in its data dir, and when it starts again it reads them back
// as its backup copies (which it promotes, as it would a backup's) and
// removes the file. A crash leaves no file: a single member's state does
// not survive a crash.
//
// The file: magic, u64 the bucket clock at export (Unix ns), uvarint n,
// n × (uvarint partition, uvarint length, limiter export stream; length 0:
// a partition held with no state), and
// (version 2) the CRC-32C of all that, u32. Streams hold times relative
// to the export; they are imported at the export's instant, so the time
// the member was down counts as time passed — an export instant later
// than the loading member's clock (a clock stepped back) is taken as now.
// Was (version 1, still read): no checksum, so a flipped bit in the
// export time or a key loaded silently and lost a spent budget, and a
// future export time made states last for years.
const (
	bucketFile    = "buckets.rlsnap"
	bucketMagic   = "RLSNAP2\n"
	bucketMagicV1 = "RLSNAP1\n"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// saveBuckets writes the partitions this member still serves under its
// current view, and the hand-offs it could not deliver (left, as
// exported), to dir/bucketFile (atomically: a temporary file renamed
// over it) and returns how many of those partitions hold states; it
// writes no file when it has no partition at all (a partition served
// empty is written, as an empty stream, so that the next start knows
// this member held nothing of it). Each partition it serves stops
// serving as it is written (checks that come later are answered by
// their rule's failure mode, as at an old owner after a hand-off), so no
// spend is made after its state was saved; and the owner is sealed
// first, so it refuses every hand-off that comes later (a ring it learns
// of after the save may still give it partitions: their senders keep
// them, see takeHandoff).
func (o *Owner) saveBuckets(dir string, left []Outgoing) (int, error) {
	v := o.cell.Load()
	if v == nil || dir == "" {
		return 0, nil
	}
	o.sealed.Store(true)
	now := o.now()
	type saved struct {
		p      uint32
		stream []byte
	}
	var parts []saved
	for _, p := range v.Ring.PartitionsOf(o.self) {
		g := &o.moving[p]
		g.Lock()
		if o.getState(p) == partServing {
			o.setState(p, partAway) // fenced first: no check is decided after its export
			// Empty ones too, as an empty stream: the file then says this
			// member held nothing of them, and the owners it hands them
			// to at its next start (handOffLoaded) serve them at once,
			// not after the hand-off wait for a hand-off nobody else can
			// send.
			var stream []byte
			if o.table.PartitionLen(p) > 0 {
				stream = o.table.Export(nil, p, now)
			}
			parts = append(parts, saved{p, stream})
		}
		g.Unlock()
	}
	// The undelivered hand-offs that hold state, as of now. Not a stand-in
	// (Outgoing.standIn): the member that served its partition hands the
	// state on itself, or keeps it in its own file, and at the next start
	// the stand-in, handed again, would end the wait of an owner that
	// awaits that state (an empty one: its keys served from nothing until
	// the state came).
	var kept []transport.PushPart
	for _, og := range left {
		p := og.Part.Partition
		if og.Part.Lost || og.standIn || len(og.Part.Data) == 0 ||
			slices.ContainsFunc(parts, func(s saved) bool { return s.p == p && len(s.stream) > 0 }) ||
			slices.ContainsFunc(kept, func(k transport.PushPart) bool { return k.Partition == p }) {
			continue
		}
		kept = append(kept, o.sendable(og, now))
	}
	// A partition served empty whose undelivered hand-off holds states
	// is saved as that hand-off.
	parts = slices.DeleteFunc(parts, func(s saved) bool {
		return len(s.stream) == 0 && slices.ContainsFunc(kept, func(k transport.PushPart) bool { return k.Partition == s.p })
	})
	if len(parts)+len(kept) == 0 {
		return 0, nil
	}
	b := append([]byte(bucketMagic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.LittleEndian.PutUint64(b[len(bucketMagic):], uint64(now))
	b = binary.AppendUvarint(b, uint64(len(parts)+len(kept)))
	add := func(p uint32, stream []byte) {
		b = binary.AppendUvarint(b, uint64(p))
		b = binary.AppendUvarint(b, uint64(len(stream)))
		b = append(b, stream...)
	}
	held := len(kept)
	for _, s := range parts {
		add(s.p, s.stream)
		if len(s.stream) > 0 {
			held++
		}
	}
	for _, k := range kept {
		add(k.Partition, k.Data)
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if err := writeFileAtomic(dir, bucketFile, b, 0o600); err != nil {
		return 0, fmt.Errorf("node: saving bucket state: %w", err)
	}
	return held, nil
}

// writeFileAtomic replaces dir/name with data (mode perm) so that a crash
// leaves the old content or the new, whole: written to a temporary file,
// synced, renamed over name, and the directory synced so that the rename
// itself survives a power loss. On error the temporary file is removed
// and dir/name is as it was.
func writeFileAtomic(dir, name string, data []byte, perm fs.FileMode) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs directory dir, making the renames and removals in it
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// loadBuckets reads dir/bucketFile, if there is one, into the backup
// table, removes it, and returns how many partitions it held. A file that
// does not decode is an error and is left in place (renamed with a
// ".bad" suffix) for inspection; nothing of it is taken.
func (o *Owner) loadBuckets(dir string) (int, error) {
	if dir == "" {
		return 0, nil
	}
	path := filepath.Join(dir, bucketFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		// Set aside as a damaged one is: left in place, the next stop's
		// save replaced it, and the budgets in it were gone for good.
		bad := setAside(path)
		return 0, fmt.Errorf("node: reading %s (kept as %s, not loaded): %w", path, filepath.Base(bad), err)
	}
	n, err := o.takeBuckets(b)
	if err != nil {
		bad := setAside(path)
		return 0, fmt.Errorf("node: %s (kept as %s, not loaded): %w", path, filepath.Base(bad), err)
	}
	// Durably gone: a file still there after a crash would be loaded
	// again at the next start, its budgets older than those spent since.
	if err := os.Remove(path); err != nil {
		return n, fmt.Errorf("node: removing %s after loading it: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return n, fmt.Errorf("node: removing %s after loading it: %w", path, err)
	}
	return n, nil
}

// setAside renames a bucket file that cannot be loaded to path.bad, or
// path.bad.<n> when that exists (an earlier one is never overwritten),
// and returns the new name.
func setAside(path string) string {
	bad := path + ".bad"
	for i := 1; ; i++ {
		if _, err := os.Lstat(bad); errors.Is(err, fs.ErrNotExist) {
			break
		}
		bad = fmt.Sprintf("%s.bad.%d", path, i)
	}
	if err := os.Rename(path, bad); err != nil {
		return path
	}
	return bad
}

// takeBuckets decodes a bucket file and imports its partitions into the
// backup table, which is empty at start-up: on error it is left empty
// (Import takes a partition whole or not at all, and the partitions
// taken before the error are dropped again).
func (o *Owner) takeBuckets(b []byte) (int, error) {
	switch {
	case bytes.HasPrefix(b, []byte(bucketMagic)) && len(b) >= len(bucketMagic)+8+4:
		body := b[:len(b)-4]
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
			return 0, errors.New("checksum mismatch: the file is damaged")
		}
		b = body
	case bytes.HasPrefix(b, []byte(bucketMagicV1)) && len(b) >= len(bucketMagicV1)+8:
		// written by the release before: no checksum
	default:
		return 0, errors.New("not a bucket state file")
	}
	at := int64(binary.LittleEndian.Uint64(b[len(bucketMagic):]))
	if now := o.now(); at > now {
		o.log.Warn("bucket state file exported later than this member's clock says it is now (a clock stepped back?): loaded as of now", "exported_ns", at, "now_ns", now)
		at = now
	}
	r := b[len(bucketMagic)+8:]
	next := func() (uint64, error) {
		v, k := binary.Uvarint(r)
		if k <= 0 {
			return 0, errors.New("truncated")
		}
		r = r[k:]
		return v, nil
	}
	n, err := next()
	if err != nil {
		return 0, err
	}
	type part struct {
		p      uint32
		stream []byte
	}
	var parts []part
	seen := map[uint64]bool{}
	for range n {
		p, err := next()
		if err != nil {
			return 0, err
		}
		l, err := next()
		if err != nil {
			return 0, err
		}
		if p >= uint64(len(o.moving)) || l > uint64(len(r)) {
			return 0, fmt.Errorf("partition %d of %d bytes: out of range", p, l)
		}
		if seen[p] { // a save writes each once: the later would replace the earlier
			return 0, fmt.Errorf("partition %d listed twice", p)
		}
		seen[p] = true
		parts = append(parts, part{uint32(p), r[:l]})
		r = r[l:]
	}
	if len(r) != 0 {
		return 0, errors.New("bytes after the last partition")
	}
	held := 0
	for k, pt := range parts {
		o.dropBackup(pt.p)
		if len(pt.stream) == 0 {
			continue // held nothing: an empty copy
		}
		held++
		if _, err := o.backup.Import(pt.p, pt.stream, at); err != nil {
			for _, taken := range parts[:k] { // nothing of a damaged file is kept
				o.dropBackup(taken.p)
			}
			return 0, fmt.Errorf("partition %d: %w", pt.p, err)
		}
	}
	for _, pt := range parts {
		o.loaded = append(o.loaded, pt.p)
	}
	if o.log.Enabled(context.Background(), slog.LevelDebug) {
		var d strings.Builder
		for _, pt := range parts {
			fmt.Fprintf(&d, "%d:%dB/%d ", pt.p, len(pt.stream), o.backup.PartitionLen(pt.p))
		}
		o.log.Debug("bucket file read", "at", at, "parts", d.String())
	}
	return held, nil
}

// handOffLoaded returns, once, the hand-offs of the partitions a bucket
// file loaded at start-up (loadBuckets) that v, the first ring this
// member sees that lists any member, gives to other members. A whole
// cluster stopped together leaves every budget with the member that
// stopped last (or, when the last could not be told apart, with several:
// the ring may then list nobody until one joins again); when it starts
// again the others may own most partitions: those of its copies go to
// their owners, which take them as any hand-off (awaited, or merged into
// what they serve) instead of serving them afresh. The copies this member
// owns it keeps (promoted, or merged with the hand-off it awaits:
// takeHandoff). Those it neither owns nor backs up under v it keeps too,
// for a while (dropLoadedAway): the ring may give the partition to this
// member before its hand-off has landed (members rejoining one after
// another), and it is then merged into what the previous owner hands
// over, rather than arriving later, chasing the partition from owner to
// owner, while they serve it without it (a spent key admitted again).
func (o *Owner) handOffLoaded(v *view.View) []Outgoing {
	if len(v.Ring.Members()) == 0 {
		return nil // kept for a ring with an owner in it
	}
	parts := o.loaded
	o.loaded = nil
	now := o.now()
	var out []Outgoing
	for _, p := range parts {
		owner, ok := v.Ring.Owner(p)
		if !ok || owner.ID == o.self {
			continue
		}
		data := o.backup.Export(nil, p, now)
		if b, ok := v.Ring.Backup(p); !ok || b.ID != o.self {
			o.loadedAway = append(o.loadedAway, p)
		}
		out = append(out, Outgoing{To: owner, Part: transport.PushPart{Partition: p, Data: data}, At: now, src: o.backup})
	}
	return out
}

// takeLoadedAway returns, once, the partitions whose loaded copies
// handOffLoaded handed to other owners and kept.
func (o *Owner) takeLoadedAway() []uint32 {
	parts := o.loadedAway
	o.loadedAway = nil
	return parts
}

// dropLoadedAway drops the kept loaded copies (handOffLoaded) of those
// of parts that this member neither owns nor backs up under its view now.
func (o *Owner) dropLoadedAway(parts []uint32) {
	v := o.cell.Load()
	if v == nil {
		return
	}
	for _, p := range parts {
		g := &o.moving[p]
		g.Lock()
		owner, _ := v.Ring.Owner(p)
		if b, ok := v.Ring.Backup(p); owner.ID != o.self && (!ok || b.ID != o.self) {
			o.dropBackup(p)
		}
		g.Unlock()
	}
}
