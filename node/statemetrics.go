package node

import (
	"errors"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/fsm"
)

// memberStates are the states ringlimit_members reports, each always
// present (0 included) so that a query for one needs no "or vector(0)".
var memberStates = [...]fsm.MemberState{fsm.Active, fsm.Draining, fsm.Down, fsm.Dead}

// membersByState counts st's members in each of memberStates, in that
// order; a nil st (no view yet) counts none.
func membersByState(st *fsm.State) [len(memberStates)]int {
	var out [len(memberStates)]int
	if st == nil {
		return out
	}
	for _, m := range st.Members {
		for i, s := range memberStates {
			if m.State == s {
				out[i]++
			}
		}
	}
	return out
}

// leaseSeconds is ringlimit_lease_seconds_remaining for a LeaseRemaining
// answer: +Inf when the member needs no lease (it may always answer), so
// that "lease_seconds_remaining > 0" reads "may answer" in every case.
func leaseSeconds(o *Owner) float64 {
	if o == nil {
		return 0 // no view yet: it cannot answer
	}
	d, needed := o.LeaseRemaining()
	if !needed {
		return math.Inf(1)
	}
	return d.Seconds()
}

// membersCollector is ringlimit_members{state}, read from the cluster
// state this member holds (its latest applied view) at each scrape.
type membersCollector struct {
	n    *Node
	desc *prometheus.Desc
}

func (c membersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c membersCollector) Collect(ch chan<- prometheus.Metric) {
	var st *fsm.State
	if s := c.n.snap.Load(); s != nil {
		st = s.st
	}
	counts := membersByState(st)
	for i, s := range memberStates {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[i]), string(s))
	}
}

// stateCollectors are the member's gauges of what it can answer and what
// it holds: its lease, the members by state and the rules version in its
// view.
func (n *Node) stateCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_lease_seconds_remaining",
			Help: "Seconds this member may still answer for its partitions under the lease its leader granted; 0 when it has none; +Inf when it needs none (a single member)."},
			func() float64 { return leaseSeconds(n.owner.Load()) }),
		membersCollector{n: n, desc: prometheus.NewDesc("ringlimit_members",
			"Members of the cluster by state (active, draining, down, dead), as this member's view has them.", []string{"state"}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_rules_version",
			Help: "Version (raft index of the write) of the rules in force in this member's view; 0 for the built-in rules only."},
			func() float64 {
				if v := n.View(); v != nil {
					return float64(v.RulesVersion)
				}
				return 0
			}),
	}
}

// registerRulesFileMetrics registers the rules file's series: only a
// member that watches a file has them, so a member without --rules shows
// no failed load. A second watch reuses the series.
func (n *Node) registerRulesFileMetrics() error {
	reg := n.cfg.Registerer
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{n.m.rulesFileLoads, n.m.rulesFileOK} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// rulesFileLoaded records the end of a load of the rules file: ok, or
// refused (unreadable or invalid: the rules in force stay).
func (m *nodeMetrics) rulesFileLoaded(ok bool) {
	if ok {
		m.rulesFileLoads.WithLabelValues("ok").Inc()
		m.rulesFileOK.Set(1)
		return
	}
	m.rulesFileLoads.WithLabelValues("error").Inc()
	m.rulesFileOK.Set(0)
}
