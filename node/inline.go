package node

import (
	"strings"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
	"github.com/ringlimit/ringlimit/transport"
)

// inlineRule returns the rule a check carries inline (Envoy RLS
// descriptor limits, which exist only in the sender's configuration), or
// nil when it is not acceptable. The data plane is a trust boundary, so
// the rule is validated here as a written rule would be, and its name
// must carry rules.InlinePrefix: an inline rule can then never share
// buckets with a written rule.
//
// Its buckets' salt (view.Salt) covers the name and the algorithm, as for
// written rules, so a sender that changes a descriptor's limit keeps its
// keys' state and one that changes its algorithm starts fresh buckets.
func inlineRule(c *transport.Check) *limiter.Rule {
	in := &c.Inline
	r := &limiter.Rule{
		Name: c.Rule, Algorithm: limiter.Algorithm(in.Algorithm), FailureMode: limiter.FailureMode(in.FailureMode),
		Limit: in.Limit, Period: in.Period, Burst: in.Burst,
	}
	if !strings.HasPrefix(r.Name, rules.InlinePrefix) || r.Validate() != nil {
		return nil
	}
	return r
}
