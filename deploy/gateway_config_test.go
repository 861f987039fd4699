package deploy

import "github.com/ringlimit/ringlimit/rules"

// checkGatewayConfig validates a `ringlimit gateway --config` file.
func checkGatewayConfig(data []byte) error {
	_, err := rules.Parse(data)
	return err
}
