package node

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// Rules returns the rules in force, default first.
func (n *Node) Rules() []limiter.Rule {
	if v := n.View(); v != nil {
		return v.List
	}
	return rules.Effective(nil)
}

// PutRules replaces the written rules through Raft and returns the set
// then in force. Invalid rules fail with an error wrapping rules.ErrInvalid.
//
// It answers by ctx's deadline: both of its waits honour ctx, the Raft
// write (apply: up to applyTimeout for Raft to take it, then
// commitTimeout) or the leader's answer to the forwarded write, and then
// the wait for the rules to be in force here (awaitRules, up to
// rulesWait). Without a deadline the worst case is their sum, more than
// an HTTP server's write timeout (the HTTP handler sets one). When ctx
// ends first the error wraps api.ErrUnavailable and says whether the
// write's outcome is unknown or it is written but not in force here yet.
func (n *Node) PutRules(ctx context.Context, written []limiter.Rule) ([]limiter.Rule, error) {
	if err := rules.Validate(written); err != nil {
		return nil, err
	}
	written = canonicalRules(written)
	if !n.isLeader() {
		addr, err := n.forwardTo(ctx)
		if err != nil {
			return nil, err
		}
		set, version, err := n.cfg.Forward.PutRules(ctx, addr, written)
		if err != nil {
			return nil, err
		}
		// Read your writes: answer once this node decides under the
		// leader's version once the write was in force there (the write,
		// or one after it). Was: once its rules equalled the set, which
		// a write that landed after this one in the same update never
		// showed: 5 s, then 503 (an audit: 8 of 1,350 racing PUTs). A
		// leader of an earlier release says no version: the set, then.
		ok := func(v *view.View) bool { return slices.Equal(v.List, set) }
		if version > 0 {
			ok = func(v *view.View) bool { return v.RulesVersion >= version }
		}
		if err := n.awaitRules(ctx, ok); err != nil {
			return nil, err
		}
		return set, nil
	}
	st, err := n.writeRules(ctx, written)
	if err != nil {
		return nil, err
	}
	if err := n.awaitRules(ctx, func(v *view.View) bool { return v.RulesVersion >= st.RulesIndex }); err != nil {
		return nil, err
	}
	return rules.Effective(st.Rules), nil
}

// RulesVersion is the rules version of this member's view: the Raft
// index of the rules write in force here (0 before the first).
func (n *Node) RulesVersion() uint64 {
	if s := n.snap.Load(); s != nil {
		return s.v.RulesVersion
	}
	return 0
}

// writeRules writes the canonical rules written through Raft, on the
// leader, and returns the state after it; rules equal to those in force
// are not written again (every member of a cluster given one rules file
// applies it, mostly at the same instant: three writes, three versions,
// for one change). Writes are serialised so that the comparison holds.
func (n *Node) writeRules(ctx context.Context, written []limiter.Rule) (*fsm.State, error) {
	if err := n.rulesWrite.lockCtx(ctx); err != nil {
		return nil, fmt.Errorf("%w: waiting for another rules write to finish, nothing written: %w", api.ErrUnavailable, err)
	}
	defer n.rulesWrite.unlock()
	// Never written (RulesIndex 0): written, even if empty, so that the
	// rules are on record. Was: an empty list was never a repeat.
	if st := n.fsm.State(); st.RulesIndex > 0 && sameInForce(st.Rules, written) {
		return st, nil
	}
	cmd, err := fsm.PutRules(written)
	if err != nil {
		return nil, err
	}
	if err := n.apply(ctx, cmd); err != nil {
		return nil, err
	}
	return n.fsm.State(), nil
}

// canonicalRules returns a copy of written in the form the cluster state
// stores: burst spelled out (it is the capacity), so that a rule reads
// the same whichever way it was written or forwarded.
func canonicalRules(written []limiter.Rule) []limiter.Rule {
	out := append([]limiter.Rule(nil), written...)
	for i := range out {
		out[i].Burst = out[i].Capacity()
	}
	return out
}

// sameInForce reports whether the written rule lists a and b put the
// same rules in force, in the same order. A list that spells out the
// built-in default is the list without it (GET /v1/rules lists default:
// PUT of its answer is no change). Was: compared as written, so a PUT of
// GET's answer was a new write and a new rules version.
func sameInForce(a, b []limiter.Rule) bool {
	return inForceFingerprint(a) == inForceFingerprint(b)
}

// inForceFingerprint fingerprints the rules in force given the written
// rules rs.
func inForceFingerprint(rs []limiter.Rule) string {
	return rules.Fingerprint(canonicalRules(rules.Effective(rs)))
}

// rulesWait bounds how long a rules write waits to be in force locally.
const rulesWait = 5 * time.Second

// awaitRules waits until this node's published view satisfies ok (the
// write is in force here), ctx ends or rulesWait passes.
func (n *Node) awaitRules(ctx context.Context, ok func(*view.View) bool) error {
	ctx, cancel := context.WithTimeout(ctx, rulesWait)
	defer cancel()
	if _, in := n.cell.AwaitFunc(ctx, func(v *view.View) bool { return v != nil && ok(v) }); !in {
		return fmt.Errorf("%w: the rules were written but are not in force on this node yet", api.ErrUnavailable)
	}
	return nil
}
