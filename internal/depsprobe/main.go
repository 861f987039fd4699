package main

import (
	_ "github.com/buraksezer/consistent"
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/hashicorp/raft"
	_ "github.com/hashicorp/raft-boltdb/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "golang.org/x/time/rate"
	_ "sigs.k8s.io/yaml"
	_ "pgregory.net/rapid"
	_ "go.uber.org/goleak"
)

func main() {}
