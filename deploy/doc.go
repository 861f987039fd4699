// Package deploy holds no code: it is the home of the container image,
// Compose and Kubernetes manifests and the Grafana dashboard, and of the
// tests that hold them to the binary (deploy_test.go: every manifest
// decodes strictly and names only flags, ports, paths, rules and metrics
// the binary has; compose_test.go: the Compose cluster, built and run).
package deploy
