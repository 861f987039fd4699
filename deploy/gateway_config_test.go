package deploy

import (
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

// checkGatewayConfig validates a `ringlimit gateway --config` file as the
// gateway does in --cluster mode: its rules: and routes: parse, and every
// route's limits name a rule of the cluster (the built-in default plus
// clusterRules, the members' rules file).
func checkGatewayConfig(config, clusterRules []byte) error {
	if _, err := rules.Parse(config); err != nil {
		return err
	}
	routes, err := rules.ParseRoutes(config)
	if err != nil {
		return err
	}
	written, err := rules.Parse(clusterRules)
	if err != nil {
		return err
	}
	return rules.CheckRoutes(routes, append([]limiter.Rule{rules.Default()}, written...))
}
