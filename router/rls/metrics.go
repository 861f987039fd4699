package rls

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Descriptor results, the "result" label of ringlimit_rls_descriptors_total.
const (
	resultWithin    = "within_limit"
	resultOver      = "over_limit"
	resultShadow    = "shadow_mode" // over the limit, answered OK: a would-be denial
	resultUnlimited = "unlimited"
)

// metrics are the service's Prometheus series. Labels come from the
// config only (the key of a matched descriptor, with its value when
// detailed_metric asks for it), never from an unknown domain or an
// unmatched descriptor, so a client cannot grow them.
type metrics struct {
	calls         *prometheus.CounterVec // code: ok, over_limit, error
	descriptors   *prometheus.CounterVec // key, result
	degraded      prometheus.Counter
	unmatched     prometheus.Counter
	unknownDomain prometheus.Counter
	reloads       *prometheus.CounterVec // result: ok, error
	configOK      prometheus.Gauge
	limits        prometheus.Gauge

	cached sync.Map // [2]string{key, result} → prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_rls_calls_total", Help: "ShouldRateLimit calls, by overall code (ok, over_limit) or error.",
		}, []string{"code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_rls_descriptors_total",
			Help: "Descriptors that matched a limit, by config key and result (within_limit, over_limit, shadow_mode = over the limit but answered OK, unlimited).",
		}, []string{"key", "result"}),
		degraded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_rls_degraded_total", Help: "Descriptor limits answered by their failure mode: the owner could not be reached in time.",
		}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_rls_unmatched_descriptors_total", Help: "Descriptors of a known domain that matched no limit (answered OK).",
		}),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_rls_unknown_domain_total", Help: "Calls for a domain the config does not define (answered OK).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_rls_config_loads_total", Help: "Loads of a changed envoy config, by result (ok, error: refused, the previous config stays).",
		}, []string{"result"}),
		configOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_rls_config_last_load_ok", Help: "1 when the last load of the envoy config succeeded, 0 when it was refused.",
		}),
		limits: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_rls_config_limits", Help: "Descriptor limits in the envoy config in force.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.calls, m.descriptors, m.degraded, m.unmatched, m.unknownDomain, m.reloads, m.configOK, m.limits} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// descriptor counts one descriptor result.
func (m *metrics) descriptor(key, result string) {
	k := [2]string{key, result}
	c, ok := m.cached.Load(k)
	if !ok {
		c, _ = m.cached.LoadOrStore(k, m.descriptors.WithLabelValues(key, result))
	}
	c.(prometheus.Counter).Inc()
}
