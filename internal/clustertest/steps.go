package clustertest

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/node"
)

// stepTransport is a member's Raft transport under Options.StepAppends.
// Every AppendEntries call that carries several entries reaches the
// member's Raft as one call per entry, a millisecond of virtual time
// apart, each committing no further than its own entry, and then as
// itself (whose entries are all stored by then), whose answer is the
// one the leader gets. The calls for single entries are answered here;
// the first one Raft refuses ends them. So a member catching up on the
// log applies one entry at a time, and everything that runs on it
// between two entries (its view, say) has run before the next one, as
// though the leader's batches ended between any two entries.
type stepTransport struct {
	*raft.InmemTransport
	ch chan raft.RPC // what the member's Raft consumes
}

// stepAppends wraps t; its goroutine ends with ctx.
func stepAppends(ctx context.Context, t *raft.InmemTransport) *stepTransport {
	s := &stepTransport{InmemTransport: t, ch: make(chan raft.RPC)}
	go s.run(ctx)
	return s
}

// Consumer is the stepped calls' channel.
func (s *stepTransport) Consumer() <-chan raft.RPC { return s.ch }

func (s *stepTransport) run(ctx context.Context) {
	in := s.InmemTransport.Consumer()
	for {
		var rpc raft.RPC
		select {
		case <-ctx.Done():
			return
		case rpc = <-in:
		}
		if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && len(req.Entries) > 1 && !s.step(ctx, req) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case s.ch <- rpc:
		}
	}
}

// step hands Raft each of req's entries but the last in a call of its
// own. It reports false when ctx ended.
func (s *stepTransport) step(ctx context.Context, req *raft.AppendEntriesRequest) bool {
	prev, prevTerm := req.PrevLogEntry, req.PrevLogTerm
	for _, e := range req.Entries[:len(req.Entries)-1] {
		one := *req
		one.PrevLogEntry, one.PrevLogTerm = prev, prevTerm
		one.Entries = []*raft.Log{e}
		one.LeaderCommitIndex = min(req.LeaderCommitIndex, e.Index)
		answer := make(chan raft.RPCResponse, 1)
		select {
		case <-ctx.Done():
			return false
		case s.ch <- raft.RPC{Command: &one, RespChan: answer}:
		}
		var r raft.RPCResponse
		select {
		case <-ctx.Done():
			return false
		case r = <-answer:
		}
		if resp, _ := r.Response.(*raft.AppendEntriesResponse); r.Error != nil || resp == nil || !resp.Success {
			return true // the call itself gets the same refusal
		}
		// Virtual time moves on only once everything the entry set off
		// (its apply, the view) has run.
		time.Sleep(time.Millisecond)
		prev, prevTerm = e.Index, e.Term
	}
	return true
}

// guardTransport is a member's Raft transport under Options.GuardRaft:
// it refuses the calls the TCP path's guard refuses (node.AllowRPC),
// given the member's latest Raft configuration.
type guardTransport struct {
	raft.Transport
	in <-chan raft.RPC
	ch chan raft.RPC // what the member's Raft consumes
}

// guardRaft wraps t; config reads the member's configuration (false
// before its Raft runs); its goroutine ends with ctx.
func guardRaft(ctx context.Context, t raft.Transport, config func() (raft.Configuration, bool)) *guardTransport {
	g := &guardTransport{Transport: t, in: t.Consumer(), ch: make(chan raft.RPC)}
	go func() {
		for {
			var rpc raft.RPC
			select {
			case <-ctx.Done():
				return
			case rpc = <-g.in:
			}
			if err := node.AllowRPC(rpc.Command, config); err != nil {
				rpc.Respond(nil, err)
				continue
			}
			select {
			case <-ctx.Done():
				// Answered, so that the sender's next write into the
				// request it reuses comes after our read of it (the
				// in-memory transport hands the request itself over): a
				// sender left to time out raced it (-race, 1 in ~15 runs
				// of the seed tests under load).
				rpc.Respond(nil, errors.New("clustertest: member stopped"))
				return
			case g.ch <- rpc:
			}
		}
	}()
	return g
}

// Consumer is the calls the guard lets through.
func (g *guardTransport) Consumer() <-chan raft.RPC { return g.ch }
