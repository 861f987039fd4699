package node

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
)

// A restart over the data dir of a member that left is refused with a
// clear error instead of waiting for a leader that sends it nothing:
// replayLocal finds the member listed, then removed, in the local log.
// A member never listed (a new one that crashed before its join reached
// its log), one listed at the end, and one that left and joined again are
// not taken for members that left.
func TestReplayLocalFindsALeave(t *testing.T) {
	cmd := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	member := func(id string) fsm.Member {
		return fsm.Member{ID: id, HTTP: id + ":1", Raft: id + ":2", Peer: id + ":3", State: fsm.Active}
	}
	init := cmd(fsm.Init(fsm.Config{Partitions: 16, ReplicationFactor: 2, Load: 1.25, Seed: 1}))
	for _, tc := range []struct {
		name string
		log  [][]byte
		left map[string]bool // id → want left
	}{
		{"leave", [][]byte{init, cmd(fsm.AddMember(member("a"))), cmd(fsm.AddMember(member("b"))), cmd(fsm.RemoveMember("b"))},
			map[string]bool{"a": false, "b": true, "c": false}},
		{"left and joined again", [][]byte{init, cmd(fsm.AddMember(member("a"))), cmd(fsm.AddMember(member("b"))), cmd(fsm.RemoveMember("b")), cmd(fsm.AddMember(member("b")))},
			map[string]bool{"a": false, "b": false}},
		{"marked dead is still a member", [][]byte{init, cmd(fsm.AddMember(member("a"))), cmd(fsm.AddMember(member("b"))), cmd(fsm.SetMemberState("b", fsm.Dead))},
			map[string]bool{"b": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := raft.NewInmemStore()
			for i, b := range tc.log {
				if err := logs.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: b}); err != nil {
					t.Fatal(err)
				}
			}
			for id, want := range tc.left {
				h := replayLocal(logs, raft.NewInmemSnapshotStore(), id)
				known, left := h.known, h.left
				if left != want {
					t.Errorf("%s: left = %v, want %v", id, left, want)
				}
				if _, ok := known["a"]; !ok {
					t.Errorf("%s: known = %v, want a listed", id, known)
				}
			}
		})
	}
}

// openRaft refuses the data dir of a member that left, wrapping
// ErrDataDir and saying what to do.
func TestRestartAfterLeaveIsRefused(t *testing.T) {
	logs := raft.NewInmemStore()
	init, _ := fsm.Init(fsm.Config{Partitions: 16, ReplicationFactor: 2, Load: 1.25, Seed: 1})
	add, _ := fsm.AddMember(fsm.Member{ID: "b", HTTP: "b:1", Raft: "b:2", Peer: "b:3", State: fsm.Active})
	rm, _ := fsm.RemoveMember("b")
	for i, b := range [][]byte{init, add, rm} {
		if err := logs.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: b}); err != nil {
			t.Fatal(err)
		}
	}
	if err := logs.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("b:2")
	cfg := Config{ID: "b", RaftAdvertise: "b:2", LogStore: logs, StableStore: logs, SnapshotStore: raft.NewInmemSnapshotStore(), RaftTransport: trans,
		Logger: slog.New(slog.DiscardHandler), RaftTimeout: time.Second}
	_, err := openRaft(&cfg, fsm.New(), nil)
	if !errors.Is(err, ErrDataDir) {
		t.Fatalf("openRaft over a log holding the member's removal: %v, want an error wrapping ErrDataDir", err)
	}
	t.Log(err)
}

// openRaft refuses a data dir whose log never named the member, in the
// cluster's state nor in a Raft configuration: another member's, copied
// for a new one, which waited for a leader for ever. One whose Raft
// configuration names it (a join cut short before the cluster listed it)
// opens.
func TestAnotherMembersDataDirIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		servers []string // the Raft configuration in the log
		refused bool
	}{
		{"never named", []string{"a", "b"}, true},
		{"named in raft only", []string{"a", "b", "c"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := raft.NewInmemStore()
			var conf raft.Configuration
			for _, id := range tc.servers {
				conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":2"), Suffrage: raft.Voter})
			}
			init, _ := fsm.Init(fsm.Config{Partitions: 16, ReplicationFactor: 2, Load: 1.25, Seed: 1})
			addA, _ := fsm.AddMember(fsm.Member{ID: "a", HTTP: "a:1", Raft: "a:2", Peer: "a:3", State: fsm.Active})
			addB, _ := fsm.AddMember(fsm.Member{ID: "b", HTTP: "b:1", Raft: "b:2", Peer: "b:3", State: fsm.Active})
			entries := []*raft.Log{
				{Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(conf)},
				{Type: raft.LogCommand, Data: init}, {Type: raft.LogCommand, Data: addA}, {Type: raft.LogCommand, Data: addB},
			}
			for i, l := range entries {
				l.Index, l.Term = uint64(i+1), 1
			}
			if err := logs.StoreLogs(entries); err != nil {
				t.Fatal(err)
			}
			if err := logs.SetUint64([]byte("CurrentTerm"), 1); err != nil {
				t.Fatal(err)
			}
			_, trans := raft.NewInmemTransport("c:2")
			cfg := Config{ID: "c", RaftAdvertise: "c:2", DataDir: "/data/c", LogStore: logs, StableStore: logs, SnapshotStore: raft.NewInmemSnapshotStore(), RaftTransport: trans,
				Logger: slog.New(slog.DiscardHandler), RaftTimeout: time.Second}
			parts, err := openRaft(&cfg, fsm.New(), nil)
			if !tc.refused {
				if err != nil {
					t.Fatalf("openRaft: %v", err)
				}
				parts.close()
				return
			}
			if !errors.Is(err, ErrDataDir) || !strings.Contains(err.Error(), `never had a member "c" (its members: a, b)`) {
				t.Fatalf("openRaft over another member's log: %v, want ErrDataDir naming its members", err)
			}
		})
	}
}
