package router

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series.
type metrics struct {
	decisions     *prometheus.CounterVec // rule, outcome
	latency       prometheus.Histogram
	batchSize     prometheus.Histogram
	forwarded     prometheus.Counter
	notOwner      prometheus.Counter
	forwardErrors prometheus.Counter
	degraded      *prometheus.CounterVec // rule
	viewErrors    prometheus.Counter     // Follow's failed fetches
	viewEpoch     prometheus.Gauge       // the ring epoch of the view in use

	perRule sync.Map // rule name → *ruleCounters
}

type ruleCounters struct{ allowed, denied, degraded prometheus.Counter }

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_decisions_total", Help: "Checks decided, by rule and outcome (allowed, denied).",
		}, []string{"rule", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ringlimit_check_duration_seconds", Help: "Time to decide one call of checks (single or batch), forwarding included.",
			// 5 µs to 0.75 s: past the default forward timeout (250 ms),
			// so answers given by the failure mode land in a bucket of
			// their own, not in +Inf with the quantiles stuck at the top.
			Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 14),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ringlimit_forward_batch_checks", Help: "Checks per batch sent to another owner.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 7),
		}),
		forwarded:     prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_forwarded_checks_total", Help: "Checks forwarded to another owner."}),
		notOwner:      prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_not_owner_total", Help: "Checks answered NOT_OWNER and retried on a newer ring."}),
		forwardErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_forward_errors_total", Help: "Batches to another owner that failed or timed out."}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_degraded_total", Help: "Checks answered by the rule's failure mode, by rule.",
		}, []string{"rule"}),
		viewErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_router_view_errors_total", Help: "Failed fetches of the cluster view by a following router."}),
		viewEpoch:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_router_view_epoch", Help: "Ring epoch of the view the router routes by (a member's, or the one a following router installed last)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.latency, m.batchSize, m.forwarded, m.notOwner, m.forwardErrors, m.degraded, m.viewErrors, m.viewEpoch} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// countAll records the decisions of one call, degraded ones included:
// one counter lookup and at most three atomic adds per run of checks on
// the same rule (a batch is usually one run), not one of each per check.
// Counted once the call is answered, a check is counted once however
// many times it was sent (a split group's query and spend), and not at
// all when the router closed under it. Was: counted degraded where each
// failure answer was made, so both of those counted.
func (m *metrics) countAll(reqs []Request, out []Result) {
	for i := 0; i < len(reqs); {
		rule := reqs[i].Rule
		var allowed, denied, degraded int
		j := i
		for ; j < len(reqs) && reqs[j].Rule == rule; j++ {
			if out[j].Allowed {
				allowed++
			} else {
				denied++
			}
			if out[j].Degraded {
				degraded++
			}
		}
		i = j
		c := m.counters(rule)
		if allowed > 0 {
			c.allowed.Add(float64(allowed))
		}
		if denied > 0 {
			c.denied.Add(float64(denied))
		}
		if degraded > 0 {
			c.degraded.Add(float64(degraded))
		}
	}
}

// counters returns a rule's counters, looked up once per rule (per run
// of a batch; per degraded check): a sync.Map load, no allocation.
func (m *metrics) counters(rule string) *ruleCounters {
	c, ok := m.perRule.Load(rule)
	if !ok {
		c, _ = m.perRule.LoadOrStore(rule, &ruleCounters{
			allowed: m.decisions.WithLabelValues(rule, "allowed"),
			denied:  m.decisions.WithLabelValues(rule, "denied"),
			// degraded is created with the others, so a rule's series
			// reads 0 from its first check, not absent until it degrades.
			degraded: m.degraded.WithLabelValues(rule),
		})
	}
	return c.(*ruleCounters)
}

// forget deletes the series of a rule that no longer exists, so that a
// cluster whose rules come and go does not export them for ever. A
// check decided under the old view at the same time may count on after
// the deletion (lost) or bring the series back until the next view
// change.
func (m *metrics) forget(rule string) {
	m.perRule.Delete(rule)
	m.decisions.DeleteLabelValues(rule, "allowed")
	m.decisions.DeleteLabelValues(rule, "denied")
	m.degraded.DeleteLabelValues(rule)
}
