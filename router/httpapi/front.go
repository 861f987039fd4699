package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/view"
)

// Front is what the check front door needs besides the Checker: the
// rules in force and readiness.
type Front interface {
	// Rules returns the set in force, default first; nil while there is
	// none (a router before its first view: GET /v1/rules answers 503).
	Rules() []limiter.Rule
	// Ready returns nil when checks can be decided, else an error
	// wrapping api.ErrUnavailable whose text is the reason.
	Ready() error
}

// NewFront returns the check front door alone, for a process that is not
// a member (ringlimit router): POST /v1/check, GET /v1/rules (read-only:
// PUT answers 405), /healthz, /readyz and /metrics. Every membership and
// admin path answers 404.
func NewFront(cfg Config, c Checker, f Front) http.Handler {
	h := New(cfg, c, frontAdmin{f}).(*handler)
	h.front = true
	return h
}

// frontRoute refuses what the front door does not serve; it reports
// whether route may go on.
func (h *handler) frontRoute(ep int, w http.ResponseWriter, r *http.Request) bool {
	switch ep {
	case epCheck, epHealthz, epReadyz, epMetrics:
		return true
	case epRules:
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return true
		}
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, &api.Error{Status: http.StatusMethodNotAllowed, Code: api.CodeMethod,
			Message: truncate(r.Method) + " /v1/rules: this router serves the rules read-only; write them to a member"})
		return false
	}
	writeError(w, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound,
		Message: "no endpoint " + truncate(r.Method) + " " + truncate(r.URL.Path) + " on a router (membership and admin are served by the members)"})
	return false
}

// frontAdmin is the Admin of a front door: only Rules and Ready are ever
// called (frontRoute stops the rest).
type frontAdmin struct{ Front }

var errNotServed = fmt.Errorf("%w: not served by a router", api.ErrNotFound)

func (frontAdmin) PutRules(context.Context, []limiter.Rule) ([]limiter.Rule, error) {
	return nil, errNotServed
}
func (frontAdmin) Cluster(context.Context) (view.Cluster, error) { return view.Cluster{}, errNotServed }
func (frontAdmin) Join(context.Context, api.JoinRequest) (uint64, error) {
	return 0, errNotServed
}
func (frontAdmin) Leave(context.Context, string) error            { return errNotServed }
func (frontAdmin) SetState(context.Context, string, string) error { return errNotServed }
func (frontAdmin) RouterView(context.Context) (*view.View, error) { return nil, errNotServed }
func (frontAdmin) Seed(context.Context) (api.SeedStatus, error) {
	return api.SeedStatus{}, errNotServed
}

// RouterFront is the Front of a router that follows the cluster: the
// rules of its view (default first, then as the members list them: in
// the order written), and ready as ready says (a process's: a router's
// Ring is ready while its view is recent, see cmd/ringlimit), or, when
// ready is nil, once it has a view.
func RouterFront(rt *router.Router, ready func() error) Front { return routerFront{rt, ready} }

type routerFront struct {
	rt    *router.Router
	ready func() error // nil: ready once there is a view
}

func (f routerFront) Rules() []limiter.Rule {
	v := f.rt.View()
	if v == nil {
		return nil
	}
	return slices.Clone(v.List)
}

func (f routerFront) Ready() error {
	if f.ready != nil {
		return f.ready()
	}
	if f.rt.View() == nil {
		return fmt.Errorf("%w: no cluster view yet", api.ErrUnavailable)
	}
	return nil
}
