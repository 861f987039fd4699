package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// ErrDataDir is wrapped by the errors of a data directory that cannot be
// used as it is (a corrupt, truncated or empty raft.db). Such a node must
// stop: never crash, never start a new cluster over lost state.
var ErrDataDir = errors.New("node: data dir unusable")

// bolt's on-disk layout (go.etcd.io/bbolt, file format version 2): pages
// 0 and 1 are meta pages, each a 16-byte page header then the meta.
const (
	boltPageHeader = 16
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	boltMetaSize   = 64 // magic … txid, checksum
	boltMetaFlag   = 0x04
)

// checkRaftDB refuses a raft.db that bolt would crash on (SIGBUS on a
// truncated file, a slice-bounds panic on a corrupt page) or silently
// re-create (0 bytes). A missing file is fine: a new member. It reads the
// meta pages itself, then walks every bucket and key read-only with
// memory faults turned into panics and recovered.
func checkRaftDB(dir string) error {
	path := filepath.Join(dir, "raft.db")
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		// A dangling symlink is no new member's missing file (was taken for
		// one, which then started a cluster of its own).
		if _, lerr := os.Lstat(path); lerr == nil {
			return fmt.Errorf("%w: %s: a symlink to a file that does not exist (a volume not mounted?)", ErrDataDir, path)
		}
		// A new member, unless the data dir holds what a member that ran
		// here left: its Raft state is gone, and starting afresh would
		// bootstrap a new cluster and load the old one's budgets.
		for _, name := range []string{bucketFile, appliedFile} {
			if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
				return fmt.Errorf("%w: %s is missing, but the data dir holds %s of a member that ran here: restore raft.db from a backup, or remove the whole data dir to join the cluster again as a new member", ErrDataDir, path, name)
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDataDir, path, err)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s; restore it from a backup, or remove the data dir to join the cluster again as a new member",
			ErrDataDir, path, fmt.Sprintf(format, a...))
	}
	if !fi.Mode().IsRegular() {
		return bad("not a regular file")
	}
	size := fi.Size()
	if size == 0 {
		return bad("the file is empty (0 bytes): the Raft log and state are lost")
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDataDir, path, err)
	}
	defer f.Close()
	m, err := readBoltMeta(f, size)
	if err != nil {
		return bad("%v", err)
	}
	if need := int64(m.pgid) * int64(m.pageSize); size < need {
		return bad("truncated: %d bytes, its header needs %d (%d pages of %d)", size, need, m.pgid, m.pageSize)
	}
	if err := checkFreelist(f, size, m); err != nil {
		return bad("%v", err)
	}
	if err := walkBolt(path); errors.Is(err, errLocked) {
		return fmt.Errorf("%w: %s: %w", ErrDataDir, path, err) // nothing to restore: another process holds it
	} else if err != nil {
		return bad("%v", err)
	}
	return nil
}

// errLocked: another process holds raft.db open.
var errLocked = errors.New("locked: is another ringlimit running on this data dir?")

// boltFreelistFlag marks a freelist page; pgidNoFreelist is the meta's
// freelist when none is kept.
const (
	boltFreelistFlag = 0x10
	pgidNoFreelist   = ^uint64(0)
)

// checkFreelist reads the freelist page m names and checks its header
// and every page id in it, which bolt reads only when it opens the file
// for writing (the read-only walk does not): a damaged count or id there
// crashed serve in bbolt's freelist load (SIGSEGV, or "cannot free page
// 0 or 1") instead of refusing the file.
func checkFreelist(r io.ReaderAt, size int64, m boltMeta) error {
	if m.freelist == pgidNoFreelist {
		return nil
	}
	if m.freelist < 2 || m.freelist >= m.pgid {
		return fmt.Errorf("corrupt: freelist page %d outside pages 2 to %d", m.freelist, m.pgid-1)
	}
	off := int64(m.freelist) * int64(m.pageSize)
	var h [boltPageHeader + 8]byte
	if off+int64(len(h)) > size {
		return fmt.Errorf("corrupt: freelist page %d beyond the end of the file", m.freelist)
	}
	if _, err := r.ReadAt(h[:], off); err != nil {
		return fmt.Errorf("freelist page %d: %w", m.freelist, err)
	}
	if flags := binary.LittleEndian.Uint16(h[8:]); flags&boltFreelistFlag == 0 {
		return fmt.Errorf("corrupt: freelist page %d has flags %#x", m.freelist, flags)
	}
	count := uint64(binary.LittleEndian.Uint16(h[10:]))
	overflow := uint64(binary.LittleEndian.Uint32(h[12:]))
	start := off + boltPageHeader
	if count == 0xFFFF { // the count is the first element
		count = binary.LittleEndian.Uint64(h[boltPageHeader:])
		start += 8
	}
	end := off + int64(overflow+1)*int64(m.pageSize)
	if overflow >= m.pgid || end > size || count > uint64(end-start)/8 {
		return fmt.Errorf("corrupt: freelist page %d claims %d ids in %d pages", m.freelist, count, overflow+1)
	}
	ids := make([]byte, count*8)
	if _, err := r.ReadAt(ids, start); err != nil {
		return fmt.Errorf("freelist page %d: %w", m.freelist, err)
	}
	for i := uint64(0); i < count; i++ {
		if id := binary.LittleEndian.Uint64(ids[i*8:]); id < 2 || id >= m.pgid {
			return fmt.Errorf("corrupt: the freelist names page %d, outside pages 2 to %d", id, m.pgid-1)
		}
	}
	return nil
}

type boltMeta struct {
	pageSize uint32
	freelist uint64
	pgid     uint64
	txid     uint64
}

// readBoltMeta returns the newest valid meta page, as bolt would use it.
func readBoltMeta(r io.ReaderAt, size int64) (boltMeta, error) {
	var best boltMeta
	var errs []error
	pageSize := int64(os.Getpagesize())
	for i := int64(0); i < 2; i++ {
		off := i * pageSize
		var b [boltPageHeader + boltMetaSize]byte
		if off+int64(len(b)) > size {
			errs = append(errs, fmt.Errorf("meta page %d: beyond the end of the file (%d bytes)", i, size))
			continue
		}
		if _, err := r.ReadAt(b[:], off); err != nil {
			errs = append(errs, fmt.Errorf("meta page %d: %w", i, err))
			continue
		}
		m, err := parseBoltMeta(b[:])
		if err != nil {
			errs = append(errs, fmt.Errorf("meta page %d: %w", i, err))
			continue
		}
		if i == 0 {
			pageSize = int64(m.pageSize) // bolt finds page 1 with page 0's size
		}
		if m.txid >= best.txid || best.pageSize == 0 {
			best = m
		}
	}
	if best.pageSize == 0 {
		return best, fmt.Errorf("not a valid bolt database: %w", errors.Join(errs...))
	}
	return best, nil
}

func parseBoltMeta(b []byte) (boltMeta, error) {
	if flags := binary.LittleEndian.Uint16(b[8:]); flags&boltMetaFlag == 0 {
		return boltMeta{}, fmt.Errorf("page flags %#x are not a meta page's", flags)
	}
	m := b[boltPageHeader:]
	if binary.LittleEndian.Uint32(m[0:]) != boltMagic {
		return boltMeta{}, errors.New("bad magic")
	}
	if v := binary.LittleEndian.Uint32(m[4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if sum := binary.LittleEndian.Uint64(m[56:]); sum != 0 && sum != h.Sum64() {
		return boltMeta{}, errors.New("checksum mismatch")
	}
	out := boltMeta{pageSize: binary.LittleEndian.Uint32(m[8:]), freelist: binary.LittleEndian.Uint64(m[32:]),
		pgid: binary.LittleEndian.Uint64(m[40:]), txid: binary.LittleEndian.Uint64(m[48:])}
	if out.pageSize < 512 || out.pageSize > 1<<20 || out.pageSize&(out.pageSize-1) != 0 {
		return boltMeta{}, fmt.Errorf("page size %d", out.pageSize)
	}
	if out.pgid < 2 {
		return boltMeta{}, fmt.Errorf("high-water page %d", out.pgid)
	}
	return out, nil
}

// walkBolt opens the database read-only and reads every bucket and key,
// on a goroutine of its own where a memory fault on the mapping is a
// panic, which it recovers and reports.
func walkBolt(path string) error {
	errc := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if p := recover(); p != nil {
				errc <- fmt.Errorf("corrupt: reading it fails: %v", p)
			}
		}()
		errc <- walkBoltUnsafe(path)
	}()
	return <-errc
}

func walkBoltUnsafe(path string) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bbolt.ErrTimeout) {
			return errLocked
		}
		return fmt.Errorf("cannot open: %w", err)
	}
	defer db.Close()
	var touched byte // every value's last byte, so that its pages are read
	err = db.View(func(tx *bbolt.Tx) error {
		if err := tx.ForEach(func(name []byte, b *bbolt.Bucket) error { return walkBucket(b, &touched) }); err != nil {
			return err
		}
		return checkRaftBuckets(tx)
	})
	_ = touched
	return err
}

// checkLogFollowsSnapshot refuses a data dir whose Raft log begins after
// the entry just past its newest snapshot (none: entry 1), which raft
// needs at start: entries were lost between them (a snapshot removed or
// damaged, so that raft skips it, after the log was compacted past it).
// raft panicked with "log not found" instead.
func checkLogFollowsSnapshot(logs raft.LogStore, snaps raft.SnapshotStore, dir string) error {
	first, err := logs.FirstIndex()
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDataDir, filepath.Join(dir, "raft.db"), err)
	}
	if first == 0 {
		return nil // no log
	}
	var newest uint64
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		newest = metas[0].Index
	}
	if first > newest+1 {
		return fmt.Errorf("%w: %s: the Raft log begins at entry %d, and the newest snapshot in %s ends at entry %d (0: none readable): the entries between are lost; restore the data dir from a backup, or remove it to join the cluster again as a new member",
			ErrDataDir, filepath.Join(dir, "raft.db"), first, filepath.Join(dir, "snapshots"), newest)
	}
	return nil
}

// checkRaftBuckets checks what hashicorp/raft reads of raft.db and
// trusts (raft-boltdb's buckets): the log's entries follow each other
// from its first index to its last (raft panicked at start on a gap:
// "log not found"; a damaged last key made the replay at start count up
// to it, 10^16 entries, silently), each decodes as a raft.Log of its own
// index (raft panicked on one that did not), and the stable store's terms
// are 8 bytes (raft-boltdb indexed past a short one). Seen in an audit of
// damaged data dirs.
func checkRaftBuckets(tx *bbolt.Tx) error {
	if b := tx.Bucket([]byte("logs")); b != nil {
		var prev uint64
		seen := false
		h := &codec.MsgpackHandle{}
		err := b.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("corrupt: a Raft log key of %d bytes, want 8", len(k))
			}
			i := binary.BigEndian.Uint64(k)
			if seen && i != prev+1 {
				return fmt.Errorf("corrupt: the Raft log skips from entry %d to %d", prev, i)
			}
			var l raft.Log
			if err := codec.NewDecoderBytes(v, h).Decode(&l); err != nil {
				return fmt.Errorf("corrupt: Raft log entry %d does not decode: %v", i, err)
			}
			if l.Index != i {
				return fmt.Errorf("corrupt: the Raft log entry stored as %d says it is %d", i, l.Index)
			}
			prev, seen = i, true
			return nil
		})
		if err != nil {
			return err
		}
	}
	if b := tx.Bucket([]byte("conf")); b != nil {
		for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
			if v := b.Get([]byte(k)); v != nil && len(v) != 8 {
				return fmt.Errorf("corrupt: Raft's %s is %d bytes, want 8", k, len(v))
			}
		}
	}
	return nil
}

func walkBucket(b *bbolt.Bucket, touched *byte) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if sub := b.Bucket(k); sub != nil {
				return walkBucket(sub, touched)
			}
			return nil
		}
		if len(v) > 0 {
			*touched ^= v[0] ^ v[len(v)-1]
		}
		return nil
	})
}
