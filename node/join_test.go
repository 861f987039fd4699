package node

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/ringlimit/ringlimit/fsm"
)

// The states a member that joined as n3 replays, when an earlier n3
// joined at 4 and left at 9, and this one joined at 12.
var (
	oldN3   = &fsm.State{Initialized: true, MembershipIndex: 4, Members: []fsm.Member{{ID: "n1", Since: 2}, {ID: "n3", Since: 4}}}
	leftN3  = &fsm.State{Initialized: true, MembershipIndex: 9, Members: []fsm.Member{{ID: "n1", Since: 2}}}
	n1Moved = &fsm.State{Initialized: true, MembershipIndex: 11, Members: []fsm.Member{{ID: "n1", Since: 11}}}
	newN3   = &fsm.State{Initialized: true, MembershipIndex: 12, Members: []fsm.Member{{ID: "n1", Since: 11}, {ID: "n3", Since: 12}}}
	laterN3 = &fsm.State{Initialized: true, MembershipIndex: 15, Members: []fsm.Member{{ID: "n1", Since: 11}, {ID: "n3", Since: 12}, {ID: "n4", Since: 15}}}
	goneN3  = &fsm.State{Initialized: true, MembershipIndex: 20, Members: []fsm.Member{{ID: "n1", Since: 11}, {ID: "n4", Since: 15}}}
)

// A member acts on a state of its log (caughtUpTo) and counts itself
// listed in it (sawSelf) from its own join on, once its join's answer
// has named it; before the answer, on none. A member that did not join
// with an empty data dir, or whose answer had no epoch (an older
// leader), acts on every state, as before.
func TestJoinEpochGatesTheLog(t *testing.T) {
	for _, tt := range []struct {
		epoch     uint64
		st        *fsm.State
		acts, saw bool
	}{
		{joinPending, oldN3, false, false},
		{joinPending, newN3, false, false},
		{12, oldN3, false, false},
		{12, leftN3, false, false},
		{12, n1Moved, false, false},
		{12, newN3, true, true},
		{12, laterN3, true, true},
		{12, goneN3, true, true}, // listed at 12, removed since
		{0, oldN3, true, true},
		{0, leftN3, true, false},
		{0, goneN3, true, false},
	} {
		n := &Node{cfg: Config{ID: "n3"}, fsm: fsm.New()}
		n.joinEpoch.Store(tt.epoch)
		if acts, saw := n.caughtUpTo(tt.st), n.sawSelf(tt.st); acts != tt.acts || saw != tt.saw {
			t.Errorf("join epoch %s, state at %d: caughtUpTo %v, sawSelf %v; want %v, %v", epochName(tt.epoch), tt.st.MembershipIndex, acts, saw, tt.acts, tt.saw)
		}
	}
}

func epochName(e uint64) string {
	if e == joinPending {
		return "pending"
	}
	return fmt.Sprint(e)
}

// Only the first answer to a pending join sets the epoch: a later
// registration's answer does not move it (the member would stop acting
// on its log until it applied that far), and a member that did not join
// with an empty data dir keeps 0.
func TestNoteJoinTakesTheFirstAnswer(t *testing.T) {
	for _, tt := range []struct {
		start   uint64
		answers []uint64
		want    uint64
	}{
		{joinPending, []uint64{12, 30}, 12},
		{joinPending, []uint64{0, 30}, 0}, // an older leader's answer: as before
		{0, []uint64{12}, 0},
	} {
		n := &Node{cfg: Config{ID: "n3"}, fsm: fsm.New(), log: slog.New(slog.DiscardHandler)}
		n.joinEpoch.Store(tt.start)
		for _, a := range tt.answers {
			n.noteJoin(a)
		}
		if got := n.joinEpoch.Load(); got != tt.want {
			t.Errorf("join epoch %s after answers %v = %s, want %s", epochName(tt.start), tt.answers, epochName(got), epochName(tt.want))
		}
	}
}
