package node

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/transport"
)

// FuzzReadBoltMeta: the meta-page reader that stands between a damaged
// raft.db and bolt never panics, and what it accepts is sane.
func FuzzReadBoltMeta(f *testing.F) {
	page := os.Getpagesize()
	good := make([]byte, 2*page)
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readBoltMeta(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		if m.pageSize < 512 || m.pageSize&(m.pageSize-1) != 0 || m.pgid < 2 {
			t.Fatalf("accepted %+v", m)
		}
	})
}

// FuzzAllowRPC: a configuration entry of any bytes in an AppendEntries
// from an unknown sender never panics the guard, and never admits a
// sender the decoded configuration does not list.
func FuzzAllowRPC(f *testing.F) {
	f.Add(raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{ID: "x", Address: "a:1"}}}), "x", "a:1")
	f.Add([]byte{0xc1}, "x", "a:1")
	known := raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: "h:1"}}}
	cfg := func() (raft.Configuration, bool) { return known, true }
	f.Fuzz(func(t *testing.T, data []byte, id, addr string) {
		req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(id), Addr: []byte(addr)}, Term: 2,
			Entries: []*raft.Log{{Type: raft.LogConfiguration, Data: data}}}
		if AllowRPC(req, cfg) != nil {
			return
		}
		if listed(known, raft.ServerID(id), raft.ServerAddress(addr)) {
			return
		}
		c, ok := decodeConfiguration(data)
		if !ok || !listed(c, raft.ServerID(id), raft.ServerAddress(addr)) {
			t.Fatalf("admitted %q at %q with configuration %x", id, addr, data)
		}
	})
}

// FuzzTakeBuckets: a bucket file of any bytes never panics the loader,
// and one it refuses leaves nothing behind (no state in the backup
// table, no partition to hand on): a damaged file is taken whole or not
// at all. Version 1 files carry no checksum, so their bytes reach the
// parser and the table's importer as they are.
func FuzzTakeBuckets(f *testing.F) {
	// A file of several partitions with state: the parts after a
	// damaged one must not stay behind, nor those before it.
	a, v := testOwner(f, 1, "a", "b")
	for h := uint64(1); h < 200; h += 7 {
		p := v.Ring.Partition(h)
		if m, _ := v.Ring.Owner(p); m.ID == "a" {
			handle(a, 1, transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 1})
		}
	}
	dir := f.TempDir()
	if _, err := a.saveBuckets(dir, nil); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, bucketFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(append([]byte(bucketMagicV1), good[len(bucketMagic):len(good)-4]...))
	f.Add([]byte(bucketMagicV1 + "\x00\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		o := newOwner(t, "a")
		n, err := o.takeBuckets(b)
		if err != nil {
			if n != 0 || o.BackupTable().Len() != 0 || len(o.loaded) != 0 {
				t.Fatalf("refused (%v) but kept %d partitions, %d states, %d to hand on", err, n, o.BackupTable().Len(), len(o.loaded))
			}
			return
		}
		held := 0
		for _, p := range o.loaded {
			if o.BackupTable().PartitionLen(p) > 0 {
				held++
			}
		}
		if held > n || n > len(o.loaded) || n == 0 && o.BackupTable().Len() != 0 {
			t.Fatalf("took %d partitions: %d listed, %d holding states, %d states", n, len(o.loaded), held, o.BackupTable().Len())
		}
		if len(slices.Compact(slices.Sorted(slices.Values(o.loaded)))) != len(o.loaded) {
			t.Fatalf("a partition listed twice taken: %v", o.loaded)
		}
	})
}
