package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus series.
type metrics struct {
	requests  *prometheus.CounterVec // route, outcome
	shaped    prometheus.Histogram
	upstreams *prometheus.CounterVec // status: requests the upstream failed, by the gateway's answer (502, 504)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_gateway_requests_total",
			Help: "Requests by route and outcome (allowed, denied, unauthorized, unlimited, bad_request, error, gone).",
		}, []string{"route", "outcome"}),
		upstreams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_gateway_upstream_errors_total",
			Help: "Requests forwarded (allowed or unlimited) that the upstream failed, by the gateway's answer: status 502 (unreachable, or its answer cut off) or 504 (its response headers late).",
		}, []string{"status"}),
		shaped: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ringlimit_gateway_shaped_delay_seconds", Help: "How long shaped (leaky_bucket) requests were held.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
	}
	// Both series from the start, at 0: a rate() or an alert on one
	// sees it before its first failure.
	m.upstreams.WithLabelValues("502")
	m.upstreams.WithLabelValues("504")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.shaped, m.upstreams} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) outcome(route, outcome string) { m.requests.WithLabelValues(route, outcome).Inc() }
