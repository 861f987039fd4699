package node

import (
	"bytes"
	"os"
	"testing"

	"github.com/hashicorp/raft"
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
