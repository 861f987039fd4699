package router

import (
	"encoding/json"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// FuzzViewFromAPI: a view of any bytes that a router reads from a member
// (GET /v1/cluster/view) never panics it, and one it takes routes every
// partition to one of the view's members, under rules that include the
// built-in default.
func FuzzViewFromAPI(f *testing.F) {
	f.Add([]byte(`{"epoch":12,"partitions":64,"replication_factor":20,"load":1.25,"seed":"00000000000000ff",
		"members":[{"id":"n1","http":"a:1","raft":"a:2","peer":"a:3"},{"id":"n2","http":"b:1","raft":"b:2","peer":"b:3"}],
		"rules":[{"name":"login","algorithm":"gcra","limit":5,"period":"1m","burst":5,"failure_mode":"closed"}],"rules_version":7}`))
	f.Add([]byte(`{"epoch":1,"partitions":1,"replication_factor":2,"load":1.01,"seed":"0","members":[],"rules":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var av api.ClusterView
		if json.Unmarshal(b, &av) != nil {
			return
		}
		if len(av.Members) > 16 || av.Partitions > 1024 || av.ReplicationFactor > 256 {
			return // the same checks at a larger cost per input
		}
		v, err := ViewFromAPI(av)
		if err != nil {
			return
		}
		if v.Rules["default"] == nil {
			t.Fatalf("a view without the built-in default rule: %v", v.List)
		}
		listed := map[string]bool{}
		for _, m := range av.Members {
			listed[m.ID] = true
		}
		for p := range uint32(av.Partitions) {
			m, ok := v.Ring.Owner(p)
			if !ok {
				if len(av.Members) > 0 {
					t.Fatalf("partition %d has no owner among %d members", p, len(av.Members))
				}
				continue
			}
			if !listed[m.ID] {
				t.Fatalf("partition %d owned by %q, not a member of the view", p, m.ID)
			}
		}
	})
}
