package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// endpointMetrics are one endpoint's series, looked up once in New so
// that a request only indexes them.
type endpointMetrics struct {
	requests *prometheus.CounterVec // curried with the endpoint: code
	duration prometheus.Observer
	common   [6]prometheus.Counter // codes 200, 400, 404, 413, 503, 500
}

var commonCodes = [6]int{200, 400, 404, 413, 503, 500}

// newMetrics registers the HTTP metrics on reg (or takes the ones already
// there, when several handlers share a registry) and returns each
// endpoint's series.
func newMetrics(reg prometheus.Registerer) [numEndpoints]endpointMetrics {
	requests := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_http_requests_total",
		Help: "HTTP requests answered, by endpoint and status code.",
	}, []string{"endpoint", "code"}))
	duration := register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ringlimit_http_request_duration_seconds",
		Help:    "Time to answer an HTTP request, by endpoint.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"endpoint"}))
	var eps [numEndpoints]endpointMetrics
	for i, name := range endpointNames {
		m := &eps[i]
		m.requests = requests.MustCurryWith(prometheus.Labels{"endpoint": name})
		m.duration = duration.WithLabelValues(name)
		for j, code := range commonCodes {
			m.common[j] = m.requests.WithLabelValues(strconv.Itoa(code))
		}
	}
	return eps
}

// register registers c, or returns the equal collector already on reg.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("httpapi: registering metrics: " + err.Error())
	}
	return c
}

// observe records one answer. A handler that wrote nothing answered 200.
func (m *endpointMetrics) observe(status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	m.duration.Observe(d.Seconds())
	for j, code := range commonCodes {
		if code == status {
			m.common[j].Inc()
			return
		}
	}
	m.requests.WithLabelValues(strconv.Itoa(status)).Inc()
}
