package server

import (
	"context"
	"math"
	"testing"
)

// In a settled 3-member cluster every member reports 3 active members,
// a current lease (finite: leases are needed), and the same rules
// version; the leader's GET /v1/cluster gives the other members'
// silence, a follower's none.
func TestMemberStateMetricsAndSilence(t *testing.T) {
	ss := startCluster(t, 3)
	gauge := func(s *Server, name, state string) (float64, bool) {
		mf, err := s.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range mf {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				if state == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == state) {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	eventually(t, "every member leased, seeing 3 active members and one rules version", func() bool {
		var version float64
		for i, s := range ss {
			active, _ := gauge(s, "ringlimit_members", "active")
			dead, okDead := gauge(s, "ringlimit_members", "dead")
			lease, _ := gauge(s, "ringlimit_lease_seconds_remaining", "")
			v, okV := gauge(s, "ringlimit_rules_version", "")
			if active != 3 || !okDead || dead != 0 || lease <= 0 || math.IsInf(lease, 1) || !okV || (i > 0 && v != version) {
				return false
			}
			version = v
		}
		return true
	})
	for _, s := range ss {
		if _, ok := gauge(s, "ringlimit_rules_file_last_load_ok", ""); ok {
			t.Errorf("%s: ringlimit_rules_file_last_load_ok without --rules", s.Node.ID())
		}
	}
	eventually(t, "the leader reporting its followers' silence", func() bool {
		for _, s := range ss {
			c, err := s.Node.Cluster(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range c.Members {
				switch {
				case s.Node.ID() != c.Leader && m.SilentMS != nil:
					t.Fatalf("follower %s reports %s silent for %d ms", s.Node.ID(), m.ID, *m.SilentMS)
				case s.Node.ID() == c.Leader && (m.ID == c.Leader) != (m.SilentMS == nil):
					return false
				case m.SilentMS != nil && *m.SilentMS > 1000:
					t.Errorf("leader reports %s silent for %d ms in a healthy cluster", m.ID, *m.SilentMS)
				}
			}
		}
		return true
	})
}
