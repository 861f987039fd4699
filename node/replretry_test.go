package node

import (
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
)

// flakyTransport answers AppendEntries with the errors of fails, one per
// call, then with success; it records when each call was made.
type flakyTransport struct {
	raft.Transport
	fails []error
	calls []time.Duration // since start
	start time.Time
}

var errUnreachable = errors.New("connection refused")

func (f *flakyTransport) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, _ *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	f.calls = append(f.calls, time.Since(f.start))
	if len(f.calls) <= len(f.fails) {
		return f.fails[len(f.calls)-1]
	}
	resp.Success = true
	return nil
}

func fails(n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = errUnreachable
	}
	return out
}

const ms = time.Millisecond

// A failed replication call is sent again after 10ms, 20ms, 40ms… up to
// the given pause, while keep holds, and stop ends it at once; heartbeats
// and calls that succeed pass through untouched.
func TestReplicationRetry(t *testing.T) {
	replicate := &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 7, PrevLogTerm: 2, LeaderCommitIndex: 7, Entries: []*raft.Log{{Index: 8, Term: 3}}}
	commitOnly := &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 8, PrevLogTerm: 3, LeaderCommitIndex: 8}
	heartbeat := &raft.AppendEntriesRequest{Term: 3}
	for _, tc := range []struct {
		name      string
		args      *raft.AppendEntriesRequest
		fails     int
		keepCalls int // keep holds for this many retries (-1: always)
		stopAt    time.Duration
		wantErr   bool
		wantCalls []time.Duration
	}{
		{"success", replicate, 0, -1, 0, false, []time.Duration{0}},
		{"retried until it passes", replicate, 7, -1, 0, false, []time.Duration{0, 10 * ms, 30 * ms, 70 * ms, 150 * ms, 250 * ms, 350 * ms, 450 * ms}},
		{"a commit-index call too", commitOnly, 2, -1, 0, false, []time.Duration{0, 10 * ms, 30 * ms}},
		{"heartbeats are Raft's", heartbeat, 3, -1, 0, true, []time.Duration{0}},
		{"no longer worth it", replicate, 7, 2, 0, true, []time.Duration{0, 10 * ms, 30 * ms}},
		{"stopped", replicate, 100, -1, 100 * ms, true, []time.Duration{0, 10 * ms, 30 * ms, 70 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &flakyTransport{fails: fails(tc.fails), start: time.Now()}
				stop := make(chan struct{})
				if tc.stopAt > 0 {
					time.AfterFunc(tc.stopAt, func() { close(stop) })
				}
				kept := 0
				keep := func(id raft.ServerID, target raft.ServerAddress, term uint64) bool {
					if id != "b" || target != "b:1" || term != 3 {
						t.Errorf("keep(%s, %s, %d), want keep(b, b:1, 3)", id, target, term)
					}
					kept++
					return tc.keepCalls < 0 || kept <= tc.keepCalls
				}
				tr := retryReplication(f, 100*ms, stop, keep)
				var resp raft.AppendEntriesResponse
				err := tr.AppendEntries("b", "b:1", tc.args, &resp)
				if (err != nil) != tc.wantErr || err == nil && !resp.Success {
					t.Errorf("AppendEntries = %v (success %v), want error %v", err, resp.Success, tc.wantErr)
				}
				if !slices.Equal(f.calls, tc.wantCalls) {
					t.Errorf("calls at %v, want %v", f.calls, tc.wantCalls)
				}
			})
		})
	}
}

// The retry keeps the transport's pre-vote, and claims none it lacks.
func TestRetryReplicationKeepsPreVote(t *testing.T) {
	_, inmem := raft.NewInmemTransport("a")
	never := func(raft.ServerID, raft.ServerAddress, uint64) bool { return false }
	if got := retryReplication(inmem, time.Second, nil, never); !implementsPreVote(got) {
		t.Error("the retry hides the in-memory transport's pre-vote")
	}
	if got := retryReplication(struct{ raft.Transport }{inmem}, time.Second, nil, never); implementsPreVote(got) {
		t.Error("the retry claims pre-vote for a transport without it")
	}
	if got, _ := watchTerms(inmem); !implementsPreVote(retryReplication(got, time.Second, nil, never)) {
		t.Error("the retry over the term watch hides pre-vote")
	}
}
