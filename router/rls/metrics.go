package rls

import (
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

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
// config (the key of a matched descriptor), never from an unknown domain
// or an unmatched descriptor; the one label a client chooses is a
// detailed_metric descriptor's value, and those are bounded: at most
// MaxDetailedKeys of them in all, the values after that counted together
// under the key and "_<other>".
type metrics struct {
	calls         *prometheus.CounterVec // code: ok, over_limit, error
	descriptors   *prometheus.CounterVec // key, result
	degraded      prometheus.Counter
	unmatched     prometheus.Counter
	unknownDomain prometheus.Counter
	reloads       *prometheus.CounterVec // result: ok, error
	configOK      prometheus.Gauge
	limits        prometheus.Gauge

	cached   sync.Map     // [2]string{key, result} → prometheus.Counter
	detailed atomic.Int64 // distinct detailed keys in cached
	capped   atomic.Bool  // MaxDetailedKeys was reached (logged once)
}

// MaxDetailedKeys bounds the detailed_metric keys (a descriptor's config
// key with the request's value) that get series of their own.
const MaxDetailedKeys = 1000

// otherValues is the key suffix under which detailed_metric values past
// MaxDetailedKeys are counted.
const otherValues = "_<other>"

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
			Name: "ringlimit_rls_config_loads_total", Help: "Loads of the envoy config: the first at start, then each change; by result (ok, error: refused, the previous config stays).",
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

// descriptor counts one descriptor result under key; base is the key
// without a detailed_metric value ("" when key has none). It reports
// whether this call found MaxDetailedKeys reached for the first time.
func (m *metrics) descriptor(key, base, result string) (capped bool) {
	if !utf8.ValidString(key) {
		// A detailed_metric value that is not UTF-8 (Envoy sends a
		// header's bytes as they are): its invalid bytes become U+FFFD,
		// since Prometheus refuses such a label value. Was: a panic in
		// WithLabelValues, which ended the process.
		key = strings.ToValidUTF8(key, "\uFFFD")
	}
	k := [2]string{key, result}
	c, ok := m.cached.Load(k)
	if !ok && base != "" && m.detailed.Load() >= MaxDetailedKeys {
		k[0] = base + otherValues
		capped = !m.capped.Swap(true)
		c, ok = m.cached.Load(k)
	}
	if !ok {
		var loaded bool
		c, loaded = m.cached.LoadOrStore(k, m.descriptors.WithLabelValues(k[0], result))
		if !loaded && base != "" && k[0] == key {
			m.detailed.Add(1)
		}
	}
	c.(prometheus.Counter).Inc()
	return capped
}
