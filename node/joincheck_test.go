package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/fsm"
)

// voterFlagFixes corrects the flags of active members to their suffrage
// in Raft and leaves the others for their next join. Members are written
// "id:state:flag", servers "id:v" (voter) or "id:n" (non-voter); the
// fixes come out as "id=flag".
func TestVoterFlagFixes(t *testing.T) {
	for _, tc := range []struct {
		name             string
		members, servers []string
		want             []string
	}{
		{"agree", []string{"a:active:true", "b:active:true", "c:active:false"}, []string{"a:v", "b:v", "c:n"}, nil},
		{"promoted, flag lost", []string{"a:active:true", "b:active:false", "c:active:false"}, []string{"a:v", "b:v", "c:v"}, []string{"b=true", "c=true"}},
		{"promoted, flag lost, down since", []string{"a:active:true", "b:down:false", "c:dead:false"}, []string{"a:v", "b:v", "c:v"}, nil},
		{"flag says voter, raft says not", []string{"a:active:true", "b:active:true"}, []string{"a:v", "b:n"}, []string{"b=false"}},
		{"flag says voter, not in raft", []string{"a:active:true", "b:active:true"}, []string{"a:v"}, []string{"b=false"}},
		{"in raft, not a member (a leave cut short)", []string{"a:active:true"}, []string{"a:v", "z:v"}, nil},
		{"no configuration", []string{"a:active:false"}, nil, nil},
	} {
		st := &fsm.State{Initialized: true}
		for _, s := range tc.members {
			f := strings.Split(s, ":")
			st.Members = append(st.Members, fsm.Member{ID: f[0], HTTP: f[0] + ":1", Raft: f[0] + ":2", Peer: f[0] + ":3", State: fsm.MemberState(f[1]), Voter: f[2] == "true"})
		}
		servers := raftServers(tc.servers, ":2")
		var got []string
		for _, m := range voterFlagFixes(st, servers) {
			if want, _ := st.Member(m.ID); m.HTTP != want.HTTP || m.Raft != want.Raft || m.Peer != want.Peer {
				t.Errorf("%s: fix of %s has addresses %s %s %s, want its own", tc.name, m.ID, m.HTTP, m.Raft, m.Peer)
			}
			got = append(got, fmt.Sprintf("%s=%v", m.ID, m.Voter))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: voterFlagFixes = %v, want %v", tc.name, got, tc.want)
		}
	}
}
