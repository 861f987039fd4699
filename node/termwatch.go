package node

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// termWatch is Raft's transport with the answers to this node's
// AppendEntries calls (a leader's heartbeats and replication) watched:
// for each peer it keeps when the last call that the peer answered at the
// call's own term was sent, and it keeps the newest term of a call that
// was answered at a newer term. A peer that answers at the leader's term
// has not followed a newer leader yet, as of the answer; one that answers
// at a newer term has. The leader's lease takes this from Raft
// (leaderLease) because the pings of the data plane say only that a
// member is alive.
//
// Everything else passes through. A termWatch is safe for concurrent use.
type termWatch struct {
	innerTransport

	mu    sync.Mutex
	acked map[string]termAck // peer id → its last answer at the call's term; guarded by mu
	lost  uint64             // the newest term of a call answered at a newer term; guarded by mu
}

type termAck struct {
	term uint64
	sent time.Time // when the answered call was sent (a late answer extends nothing)
}

// watchTerms wraps t. The transport to give Raft is returned first: it
// offers pre-vote only when t does, as Raft decides by type.
func watchTerms(t raft.Transport) (raft.Transport, *termWatch) {
	w := &termWatch{innerTransport: innerTransport{t}, acked: map[string]termAck{}}
	return offerPreVote(w, t), w
}

func (w *termWatch) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	sent := time.Now()
	err := w.Transport.AppendEntries(id, target, args, resp)
	if err == nil {
		w.note(string(id), args.Term, resp.Term, sent)
	}
	return err
}

// note records that peer answered a call of term, sent at sent, at its
// own term answered.
func (w *termWatch) note(peer string, term, answered uint64, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if answered > term {
		w.lost = max(w.lost, term)
	}
	if answered == term {
		if a := w.acked[peer]; a.term < term || a.term == term && a.sent.Before(sent) {
			w.acked[peer] = termAck{term: term, sent: sent}
		}
	}
}

// acks fills into (cleared first) with the send time of each peer's last
// call of term that it answered at term, and reports whether a call of
// term was answered at a newer term (this node no longer leads at term,
// whatever Raft says yet).
func (w *termWatch) acks(term uint64, into map[string]time.Time) (superseded bool) {
	clear(into)
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, a := range w.acked {
		if a.term == term {
			into[id] = a.sent
		}
	}
	return w.lost >= term
}
