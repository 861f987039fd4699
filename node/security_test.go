package node

import (
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/ringlimit/ringlimit/api"
)

// goodRaftDB writes a real raft.db with some log entries and returns its
// path.
func goodRaftDB(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "raft.db")
	s, err := raftboltdb.NewBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	for i := uint64(1); i <= 200; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(strings.Repeat("x", 100))})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// Each damaged raft.db is refused with an error naming the file, never a
// panic or a crash; a sound one passes.
func TestCheckRaftDB(t *testing.T) {
	pageSize := int64(os.Getpagesize())
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
		want   string // in the message; "" = accepted
	}{
		{"sound", func(*testing.T, string) {}, ""},
		{"missing", func(t *testing.T, p string) { must(t, os.Remove(p)) }, ""},
		{"empty", func(t *testing.T, p string) { must(t, os.Truncate(p, 0)) }, "empty (0 bytes)"},
		{"truncated to half", func(t *testing.T, p string) {
			fi, err := os.Stat(p)
			must(t, err)
			must(t, os.Truncate(p, fi.Size()/2))
		}, "truncated"},
		{"truncated inside the first meta page", func(t *testing.T, p string) { must(t, os.Truncate(p, 100)) }, "truncated"},
		{"truncated to 40 bytes", func(t *testing.T, p string) { must(t, os.Truncate(p, 40)) }, "not a valid bolt database"},
		{"garbage", func(t *testing.T, p string) {
			must(t, os.WriteFile(p, []byte(strings.Repeat("garbage!", 4096)), 0o600))
		}, "not a valid bolt database"},
		{"both meta pages corrupt", func(t *testing.T, p string) {
			overwrite(t, p, boltPageHeader+20, []byte{1, 2, 3, 4})
			overwrite(t, p, pageSize+boltPageHeader+20, []byte{1, 2, 3, 4})
		}, "checksum"},
		{"every data page overwritten", func(t *testing.T, p string) {
			fi, err := os.Stat(p)
			must(t, err)
			for off := 2 * pageSize; off < fi.Size(); off += pageSize {
				overwrite(t, p, off, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x10, 0, 0xff, 0xff})
			}
		}, "corrupt"},
		// What raft itself trusts (it panicked, or hung, on these).
		{"a log entry missing", func(t *testing.T, p string) {
			inBolt(t, p, func(tx *bbolt.Tx) error { return tx.Bucket([]byte("logs")).Delete(logKey(100)) })
		}, "skips from entry 99 to 101"},
		{"the last key damaged", func(t *testing.T, p string) {
			inBolt(t, p, func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("logs"))
				v := slices.Clone(b.Get(logKey(200)))
				must(t, b.Delete(logKey(200)))
				return b.Put(logKey(1<<56+200), v)
			})
		}, "skips from entry 199 to"},
		{"an entry that does not decode", func(t *testing.T, p string) {
			inBolt(t, p, func(tx *bbolt.Tx) error { return tx.Bucket([]byte("logs")).Put(logKey(50), []byte{0xc1, 0xde, 0xad}) })
		}, "entry 50 does not decode"},
		{"an entry under another index", func(t *testing.T, p string) {
			inBolt(t, p, func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("logs"))
				return b.Put(logKey(50), slices.Clone(b.Get(logKey(51))))
			})
		}, "stored as 50 says it is 51"},
		{"a short term", func(t *testing.T, p string) {
			inBolt(t, p, func(tx *bbolt.Tx) error { return tx.Bucket([]byte("conf")).Put([]byte("CurrentTerm"), []byte{0, 1}) })
		}, "CurrentTerm is 2 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := goodRaftDB(t)
			tc.damage(t, path)
			err := checkRaftDB(filepath.Dir(path))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrDataDir) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want ErrDataDir naming %s and saying %q", err, path, tc.want)
			}
		})
	}
}

// inBolt runs f in a write transaction of the bolt file at path.
func inBolt(t *testing.T, path string, f func(tx *bbolt.Tx) error) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	must(t, err)
	defer db.Close()
	must(t, db.Update(f))
}

// logKey is raft-boltdb's key of log entry i.
func logKey(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

// A log that begins after the entry just past the newest snapshot (here:
// no snapshot, entries 1 to 10 gone) is refused at Open, naming what is
// lost; raft panicked ("log not found").
func TestOpenRefusesALogThatDoesNotFollowItsSnapshot(t *testing.T) {
	path := goodRaftDB(t)
	inBolt(t, path, func(tx *bbolt.Tx) error {
		for i := uint64(1); i <= 10; i++ {
			if err := tx.Bucket([]byte("logs")).Delete(logKey(i)); err != nil {
				return err
			}
		}
		return nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	_, err = Open(Config{ID: "n1", HTTPAddr: "127.0.0.1:1", RaftAdvertise: ln.Addr().String(), PeerAddr: "127.0.0.1:2",
		DataDir: filepath.Dir(path), Forward: nopForwarder{}, DataPlane: nopDataPlane{}}, ln)
	if !errors.Is(err, ErrDataDir) || !strings.Contains(err.Error(), "begins at entry 11") {
		t.Fatalf("Open = %v, want ErrDataDir saying the log begins at entry 11", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	must(t, err)
}

// Open with an empty raft.db stops: it never bootstraps a new cluster
// over lost state.
func TestOpenRefusesEmptyRaftDB(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "raft.db"), nil, 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	_, err = Open(Config{ID: "n1", HTTPAddr: "127.0.0.1:1", RaftAdvertise: ln.Addr().String(), PeerAddr: "127.0.0.1:2",
		DataDir: dir, Forward: nopForwarder{}, DataPlane: nopDataPlane{}}, ln)
	if !errors.Is(err, ErrDataDir) {
		t.Fatalf("Open = %v, want ErrDataDir", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "raft.db")); fi.Size() != 0 {
		t.Fatal("raft.db was rewritten")
	}
}

type nopForwarder struct{ Forwarder }

type nopDataPlane struct{ DataPlane }

func TestAllowRPC(t *testing.T) {
	cfg := raft.Configuration{Servers: []raft.Server{
		{ID: "n1", Address: "10.0.0.1:8081"}, {ID: "n2", Address: "10.0.0.2:8081"},
	}}
	withN3 := raft.Configuration{Servers: append(append([]raft.Server(nil), cfg.Servers...), raft.Server{ID: "n3", Address: "10.0.0.3:8081"})}
	known := func() (raft.Configuration, bool) { return cfg, true }
	hdr := func(id, addr string) raft.RPCHeader { return raft.RPCHeader{ID: []byte(id), Addr: []byte(addr)} }
	for _, tc := range []struct {
		name   string
		cmd    any
		config func() (raft.Configuration, bool)
		ok     bool
	}{
		{"member", &raft.AppendEntriesRequest{RPCHeader: hdr("n2", "10.0.0.2:8081"), Term: 3}, known, true},
		{"unknown id", &raft.AppendEntriesRequest{RPCHeader: hdr("evil", "10.0.0.2:8081"), Term: 3}, known, false},
		{"unknown address", &raft.RequestVoteRequest{RPCHeader: hdr("n2", "10.6.6.6:8081"), Term: 3}, known, false},
		{"one member's id at another's address", &raft.RequestVoteRequest{RPCHeader: hdr("n2", "10.0.0.1:8081"), Term: 3}, known, false},
		{"no header", &raft.TimeoutNowRequest{}, known, false},
		{"huge term", &raft.AppendEntriesRequest{RPCHeader: hdr("n2", "10.0.0.2:8081"), Term: 1<<64 - 1}, known, false},
		{"huge pre-vote term", &raft.RequestPreVoteRequest{RPCHeader: hdr("n2", "10.0.0.2:8081"), Term: 1 << 63}, known, false},
		{"joining node: empty configuration", &raft.AppendEntriesRequest{RPCHeader: hdr("n9", "10.0.0.9:8081"), Term: 3},
			func() (raft.Configuration, bool) { return raft.Configuration{}, true }, true},
		{"before raft runs", &raft.AppendEntriesRequest{RPCHeader: hdr("n9", "10.0.0.9:8081"), Term: 3},
			func() (raft.Configuration, bool) { return raft.Configuration{}, false }, true},
		{"new leader we have not heard of, bringing its configuration", &raft.AppendEntriesRequest{RPCHeader: hdr("n3", "10.0.0.3:8081"), Term: 4,
			Entries: []*raft.Log{{Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(withN3)}}}, known, true},
		{"a configuration not listing its sender", &raft.AppendEntriesRequest{RPCHeader: hdr("n3", "10.0.0.3:8081"), Term: 4,
			Entries: []*raft.Log{{Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(cfg)}}}, known, false},
		{"a configuration entry that does not decode", &raft.AppendEntriesRequest{RPCHeader: hdr("n3", "10.0.0.3:8081"), Term: 4,
			Entries: []*raft.Log{{Type: raft.LogConfiguration, Data: []byte{0xc1, 0xff}}}}, known, false},
	} {
		if err := AllowRPC(tc.cmd, tc.config); (err == nil) != tc.ok {
			t.Errorf("%s: AllowRPC = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestValidateJoin(t *testing.T) {
	good := api.JoinRequest{ID: "n2", HTTP: "127.0.0.1:8080", Raft: "node-2.ringlimit.svc:8081", Peer: "[::1]:8082"}
	if err := validateJoin(good); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	for _, bad := range []func(r *api.JoinRequest){
		func(r *api.JoinRequest) { r.Peer = "%%%" },
		func(r *api.JoinRequest) { r.HTTP = "host" },
		func(r *api.JoinRequest) { r.Raft = "host:0" },
		func(r *api.JoinRequest) { r.Raft = "host:65536" },
		func(r *api.JoinRequest) { r.Raft = ":8081" },
		func(r *api.JoinRequest) { r.Raft = "0.0.0.0:8081" },
		func(r *api.JoinRequest) { r.Raft = "a..b:8081" },
		func(r *api.JoinRequest) { r.Raft = "a b:8081" },
		func(r *api.JoinRequest) { r.ID = "" },
		func(r *api.JoinRequest) { r.ID = "n\x00" },
		func(r *api.JoinRequest) { r.ID = "\xff" },
		func(r *api.JoinRequest) { r.ID = strings.Repeat("n", 129) },
	} {
		r := good
		bad(&r)
		if err := validateJoin(r); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("validateJoin(%+v) = %v, want a bad request", r, err)
		}
	}
}

// After the guard closes, a heartbeat is answered with the transport's
// shutdown error and never reaches Raft's handler, whose store the caller
// closes next.
func TestRaftGuardHeartbeatAfterClose(t *testing.T) {
	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g := newRaftGuard(nt, func() (raft.Configuration, bool) { return raft.Configuration{}, false }, slog.New(slog.DiscardHandler))
	calls := 0
	hb := g.heartbeats(func(rpc raft.RPC) { calls++; rpc.Respond(nil, nil) })
	send := func() error {
		resp := make(chan raft.RPCResponse, 1)
		hb(raft.RPC{Command: &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n2"), Addr: []byte("10.0.0.2:8081")}, Term: 1}, RespChan: resp})
		return (<-resp).Error
	}
	if err := send(); err != nil || calls != 1 {
		t.Fatalf("open guard: err %v, %d calls; want nil and 1", err, calls)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := send(); !errors.Is(err, raft.ErrTransportShutdown) || calls != 1 {
		t.Fatalf("closed guard: err %v, %d calls; want ErrTransportShutdown and still 1", err, calls)
	}
}

// A first start whose raft.db cannot be written (a full disk; here a
// file size limit) leaves no raft.db behind: the empty or short file it
// left was refused as damaged at every later start, the disk freed or
// not. The start runs in a child process, which alone has the limit.
func TestFailedFirstStartLeavesNoRaftDB(t *testing.T) {
	dir := os.Getenv("RINGLIMIT_TEST_FSIZE_DIR")
	if dir == "" {
		dir = t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestFailedFirstStartLeavesNoRaftDB$")
		cmd.Env = append(os.Environ(), "RINGLIMIT_TEST_FSIZE_DIR="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if _, err := os.Lstat(filepath.Join(dir, "raft.db")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("after a start that could not write raft.db: %v, want no raft.db\n%s", err, out)
		}
		return
	}
	signal.Ignore(syscall.SIGXFSZ) // a write past the limit fails with EFBIG instead
	must(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 4096, Max: 4096}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	_, err = Open(Config{ID: "n1", HTTPAddr: "127.0.0.1:1", RaftAdvertise: ln.Addr().String(), PeerAddr: "127.0.0.1:2",
		DataDir: dir, Forward: nopForwarder{}, DataPlane: nopDataPlane{}}, ln)
	if err == nil || !strings.Contains(err.Error(), "raft store") {
		t.Fatalf("Open with raft.db limited to 4 KiB = %v, want a raft store error", err)
	}
	t.Log(err)
}
