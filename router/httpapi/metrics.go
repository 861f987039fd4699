package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// endpointMetrics are one endpoint's series, looked up once in New so
// that a request only indexes them.
type endpointMetrics struct {
	requests *prometheus.CounterVec // curried with the endpoint: method, code
	duration prometheus.Observer
	// common holds the counters of the common codes per method, made on
	// first use (so that only the methods an endpoint is called with
	// show up): a *prometheus.Counter in each.
	common [numMethods][len(commonCodes)]atomic.Pointer[prometheus.Counter]
}

var commonCodes = [6]int{200, 400, 404, 413, 503, 500}

// The methods counted apart; any other is counted as "other", so that a
// caller cannot make series of its own.
const (
	mGet = iota
	mHead
	mPost
	mPut
	mOther
	numMethods
)

var methodNames = [numMethods]string{mGet: "GET", mHead: "HEAD", mPost: "POST", mPut: "PUT", mOther: "other"}

func methodOf(m string) int {
	switch m {
	case http.MethodGet:
		return mGet
	case http.MethodHead:
		return mHead
	case http.MethodPost:
		return mPost
	case http.MethodPut:
		return mPut
	}
	return mOther
}

// newMetrics registers the HTTP metrics on reg (or takes the ones already
// there, when several handlers share a registry) and sets each
// endpoint's series in eps.
func newMetrics(reg prometheus.Registerer, eps *[numEndpoints]endpointMetrics) {
	requests := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_http_requests_total",
		Help: "HTTP requests answered, by endpoint, method (GET, HEAD, POST, PUT, other) and status code.",
	}, []string{"endpoint", "method", "code"}))
	duration := register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ringlimit_http_request_duration_seconds",
		Help:    "Time to answer an HTTP request, by endpoint.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"endpoint"}))
	for i, name := range endpointNames {
		m := &eps[i]
		m.requests = requests.MustCurryWith(prometheus.Labels{"endpoint": name})
		m.duration = duration.WithLabelValues(name)
		// The 200s of the endpoint's methods read 0 from the start, so
		// that rates over them do not begin with a gap.
		for _, method := range strings.Split(endpointAllow[i], ", ") {
			if mi := methodOf(method); method != "" && mi != mHead {
				m.counter(mi, 0)
			}
		}
	}
}

// counter returns the counter of method mi and commonCodes[j], made on
// first use.
func (m *endpointMetrics) counter(mi, j int) prometheus.Counter {
	c := m.common[mi][j].Load()
	if c == nil {
		made := m.requests.WithLabelValues(methodNames[mi], strconv.Itoa(commonCodes[j]))
		m.common[mi][j].CompareAndSwap(nil, &made) // one series either way
		c = m.common[mi][j].Load()
	}
	return *c
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

// observe records one answer to a request of method. A handler that
// wrote nothing answered 200.
func (m *endpointMetrics) observe(method string, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	m.duration.Observe(d.Seconds())
	mi := methodOf(method)
	for j, code := range commonCodes {
		if code == status {
			m.counter(mi, j).Inc()
			return
		}
	}
	m.requests.WithLabelValues(methodNames[mi], strconv.Itoa(status)).Inc()
}
