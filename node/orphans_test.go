package node

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
)

// A voter that is no member is due for removal once it has been one for
// its grace (the dead-after and a margin); a non-voter for orphanGrace; this node only once removed; a server
// that becomes a member (its join finished) is forgotten.
func TestOrphanWatch(t *testing.T) {
	st := &fsm.State{Members: []fsm.Member{{ID: "a"}, {ID: "b"}}}
	servers := []raft.Server{
		{ID: "a", Suffrage: raft.Voter},
		{ID: "b", Suffrage: raft.Voter},
		{ID: "left", Suffrage: raft.Voter},
		{ID: "joining", Suffrage: raft.Nonvoter},
		{ID: "self", Suffrage: raft.Voter},
	}
	t0 := time.Unix(1000, 0)
	w := orphanWatch{}
	const voterGrace = 7 * time.Second
	for _, tc := range []struct {
		at      time.Duration
		removed bool
		want    []raft.ServerID
	}{
		{0, false, nil},
		{voterGrace - time.Millisecond, false, nil},
		{voterGrace, false, []raft.ServerID{"left"}},
		{orphanGrace - time.Millisecond, false, []raft.ServerID{"left"}},
		{orphanGrace, false, []raft.ServerID{"left", "joining"}},
		{orphanGrace, true, []raft.ServerID{"left", "joining"}}, // self: an orphan from now on
		{orphanGrace + voterGrace, true, []raft.ServerID{"left", "joining", "self"}},
	} {
		got := w.update(st, servers, "self", tc.removed, t0.Add(tc.at), voterGrace)
		if !slices.Equal(got, tc.want) {
			t.Fatalf("at %v (removed %v): due %v, want %v", tc.at, tc.removed, got, tc.want)
		}
	}
	st.Members = append(st.Members, fsm.Member{ID: "joining"})
	w.update(st, servers, "self", false, t0.Add(orphanGrace), voterGrace)
	if _, ok := w["joining"]; ok {
		t.Fatal("a server that became a member is still watched")
	}
}
