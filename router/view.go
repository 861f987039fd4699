package router

import (
	"fmt"
	"strconv"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/view"
)

// ViewFromAPI builds the view of a router that is not a member from what
// GET /v1/cluster/view returns. The ring is rebuilt from the members and
// the ring config, exactly as every member builds it.
func ViewFromAPI(v api.ClusterView) (*View, error) {
	seed, err := strconv.ParseUint(v.Seed, 16, 64)
	if err != nil {
		return nil, fmt.Errorf("router: view seed %q: %w", v.Seed, err)
	}
	members := make([]ring.Member, 0, len(v.Members))
	for _, m := range v.Members {
		members = append(members, ring.Member{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer})
	}
	r, err := ring.New(ring.Config{Partitions: v.Partitions, ReplicationFactor: v.ReplicationFactor, Load: v.Load}, v.Epoch, members)
	if err != nil {
		return nil, fmt.Errorf("router: view ring: %w", err)
	}
	written, err := RulesFromAPI(v.Rules)
	if err != nil {
		return nil, fmt.Errorf("router: view rules: %w", err)
	}
	return view.New(r, seed, rules.Effective(written), v.RulesVersion), nil
}

// RulesFromAPI reads a rule set as the HTTP API lists it (GET
// /v1/rules, the view) rule by rule and validates it as a whole. Unlike
// rules.Parse of the same list as a document, it takes a list longer
// than MaxDocumentSize: the API writes every field of every rule, so the
// list of a set written in a document under that size may be over it.
func RulesFromAPI(rs []api.Rule) ([]limiter.Rule, error) {
	out := make([]limiter.Rule, 0, len(rs))
	for _, av := range rs {
		r, err := rules.FromView(rules.RuleView(av))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rules.Validate(out); err != nil {
		return nil, err
	}
	return out, nil
}
