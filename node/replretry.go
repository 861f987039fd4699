package node

import (
	"time"

	"github.com/hashicorp/raft"
)

// replicationRetry is Raft's transport with the leader's failed
// replication calls retried at a steady pace instead of after Raft's
// growing back-off.
//
// Why: hashicorp/raft (v1.7) pauses 10ms·2^(failures−2), at most 10.24s,
// before each new AppendEntries to a follower whose calls failed, and
// only a success resets the count; nothing (a new entry, the follower's
// heartbeats answering again) cuts a pause short. After ~5s of failed
// calls the pause is 5.12s, after ~10s it is 10.24s. A restarted member
// learns that it was marked dead or down, and becomes active again, only
// from those calls: a new user saw it active 8.7s after a restart that
// followed 35s down (hashicorp/raft#73; Raft caps its heartbeats' back-off
// at HeartbeatTimeout/2 since #494, not replication's).
//
// A failed replication call is retried here, the very request Raft made
// (never a response Raft did not get: a call either reached the follower
// or returns the last error), after a pause that doubles from
// retryFirstPause up to every, for as long as keep says the call still
// matters: this node leads at the call's term, and the latest
// configuration lists the target at that address. Raft sees a slow call
// rather than a failed one; a delayed message is one Raft tolerates
// anyway. Heartbeats (no entries, no previous entry, no commit index)
// pass through: Raft paces them itself, capped already.
// Closing stop ends every retry at once, so that Raft's shutdown, which
// waits for its replication goroutines, is not held up.
//
// InstallSnapshot is not retried (its data is a stream read once): a
// follower far enough behind to need a snapshot still meets Raft's
// back-off while it is down.
type replicationRetry struct {
	innerTransport
	keep  func(id raft.ServerID, target raft.ServerAddress, term uint64) bool
	every time.Duration
	stop  <-chan struct{}
}

// retryFirstPause is the first pause before a failed replication call is
// sent again (Raft's own failureWait).
const retryFirstPause = 10 * time.Millisecond

// retryReplication wraps t. Like watchTerms, it offers pre-vote only when
// t does, as Raft decides by type.
func retryReplication(t raft.Transport, every time.Duration, stop <-chan struct{}, keep func(id raft.ServerID, target raft.ServerAddress, term uint64) bool) raft.Transport {
	r := &replicationRetry{innerTransport: innerTransport{t}, keep: keep, every: max(every, retryFirstPause), stop: stop}
	return offerPreVote(r, t)
}

// isHeartbeat reports whether args is a heartbeat of Raft's: it carries
// a term and the leader's address, nothing about the log.
func isHeartbeat(args *raft.AppendEntriesRequest) bool {
	return len(args.Entries) == 0 && args.PrevLogEntry == 0 && args.PrevLogTerm == 0 && args.LeaderCommitIndex == 0
}

func (r *replicationRetry) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := r.Transport.AppendEntries(id, target, args, resp)
	if err == nil || isHeartbeat(args) {
		return err
	}
	pause := retryFirstPause
	for {
		t := time.NewTimer(pause)
		select {
		case <-r.stop:
			t.Stop()
			return err
		case <-t.C:
		}
		if !r.keep(id, target, args.Term) {
			return err
		}
		*resp = raft.AppendEntriesResponse{}
		if err = r.Transport.AppendEntries(id, target, args, resp); err == nil {
			return nil
		}
		pause = min(2*pause, r.every)
	}
}

// leadsAt returns the keep function of retryReplication for the Raft
// instance r returns (nil until it runs): r leads at term and its latest
// configuration lists id at target.
func leadsAt(r func() *raft.Raft) func(id raft.ServerID, target raft.ServerAddress, term uint64) bool {
	return func(id raft.ServerID, target raft.ServerAddress, term uint64) bool {
		rf := r()
		if rf == nil || rf.State() != raft.Leader || rf.CurrentTerm() != term {
			return false
		}
		cf := rf.GetConfiguration()
		if cf.Error() != nil {
			return false
		}
		for _, s := range cf.Configuration().Servers {
			if s.ID == id {
				return s.Address == target
			}
		}
		return false
	}
}
