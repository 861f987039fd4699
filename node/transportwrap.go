package node

import "github.com/hashicorp/raft"

// innerTransport is what a wrapper of Raft's transport (termWatch,
// replicationRetry) embeds: every call it does not take passes through,
// and Close closes the wrapped transport when it can be closed
// (raft.WithClose).
type innerTransport struct{ raft.Transport }

func (t innerTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// offerPreVote returns w, a wrapper of inner, offering pre-vote exactly
// when inner does: Raft decides by type whether to pre-vote, so a
// wrapper must neither hide it nor claim it.
func offerPreVote(w, inner raft.Transport) raft.Transport {
	if pv, ok := inner.(raft.WithPreVote); ok {
		return preVoteTransport{innerTransport{w}, pv}
	}
	return w
}

// preVoteTransport is a wrapper (its innerTransport) over a transport that
// offers pre-vote: pre-votes go straight to it.
type preVoteTransport struct {
	innerTransport
	pv raft.WithPreVote
}

func (p preVoteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return p.pv.RequestPreVote(id, target, args, resp)
}
