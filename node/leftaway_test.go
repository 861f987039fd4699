package node

import "testing"

// removedIn takes a member for removed only on the word of a member of
// the same cluster that has a leader and has applied the last change to
// the member's record that its own log holds, and does not list it.
func TestRemovedIn(t *testing.T) {
	h := localHistory{seed: 7, since: 40}
	others := []string{"n1", "n2"}
	for _, tc := range []struct {
		name string
		h    localHistory
		r    RemoteCluster
		want bool
	}{
		{"removed", h, RemoteCluster{Leader: "n1", Epoch: 57, Seed: 7, Members: others}, true},
		{"removed at the index of an entry its log lost", h, RemoteCluster{Leader: "n1", Epoch: 40, Seed: 7, Members: others}, true},
		{"still listed (dead, say)", h, RemoteCluster{Leader: "n1", Epoch: 57, Seed: 7, Members: []string{"n1", "n2", "n3"}}, false},
		{"no leader: amid an election, or cut off", h, RemoteCluster{Epoch: 57, Seed: 7, Members: others}, false},
		{"another cluster", h, RemoteCluster{Leader: "n1", Epoch: 57, Seed: 8, Members: others}, false},
		{"behind this member's join", h, RemoteCluster{Leader: "n1", Epoch: 39, Seed: 7, Members: others}, false},
		{"its own leadership", h, RemoteCluster{Leader: "n3", Epoch: 57, Seed: 7, Members: others}, false},
		{"a log with no Init", localHistory{since: 40}, RemoteCluster{Leader: "n1", Epoch: 57, Members: others}, false},
		{"a log that never listed it", localHistory{seed: 7}, RemoteCluster{Leader: "n1", Epoch: 57, Seed: 7, Members: others}, false},
	} {
		if got := removedIn(tc.h, "n3", tc.r); got != tc.want {
			t.Errorf("%s: removedIn(%+v, n3, %+v) = %v, want %v", tc.name, tc.h, tc.r, got, tc.want)
		}
	}
}
