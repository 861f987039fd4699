package router

import (
	"context"
	"time"

	"github.com/ringlimit/ringlimit/internal/pause"
)

// ViewSource gives a router that is not a member the cluster's current
// view (client.ViewSource reads GET /v1/cluster/view from the members and
// fails over between them). It is the one thing Follow needs.
type ViewSource interface {
	// FetchView returns the cluster's current view, or an error when no
	// member could give one before ctx ends.
	FetchView(ctx context.Context) (*View, error)
}

// Follow keeps the router's view current until ctx ends: it fetches a
// view from src at once, then every period, and at once whenever an owner
// answers NOT_OWNER (the ring moved on); and every refetchGap while a
// check waits for a view with newer rules than the router's (restale: an
// owner had them, and the member read may not have applied the write
// yet). A view whose ring epoch is older than the one installed is
// ignored (a lagging member); one equal to it in epoch and rules changes
// nothing. A failed fetch keeps the view the router has and is retried
// at the next period (or refetchGap, as above). Asked at once again
// within refetchGap of a read that installed nothing, it waits for the
// rest of the gap: at most one read per refetchGap while an owner stays
// unreachable. Follow returns ctx's error.
//
// Follow is meant for a router with no local handler (a stateless router,
// a gateway, a client); a member's router is fed by its node instead.
func (r *Router) Follow(ctx context.Context, src ViewSource, every time.Duration) error {
	if every <= 0 {
		every = time.Second
	}
	r.following.Store(true)
	defer r.following.Store(false)
	t := time.NewTimer(0)
	defer t.Stop()
	lastNew := true // the last fetch installed a view
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-r.stale:
			// Asked again within refetchGap of a read that brought
			// nothing new: wait out the gap. Each check answered at once
			// for an owner found gone asks (the ring may have moved), and
			// a crashed owner, until it is marked dead, made every router
			// and Go client read the view back to back (a helper: ~70
			// reads/s per member, 22 MB/s of a 2,000-rule view).
			if !lastNew && r.waitGap(ctx) != nil {
				return ctx.Err()
			}
		}
		before := r.View()
		r.beginFetch()
		fctx, cancel := context.WithTimeout(ctx, every)
		v, err := src.FetchView(fctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.m.viewErrors.Inc()
				if r.View() == nil {
					r.cfg.Logger.Warn("router: could not fetch the cluster view; none yet, so checks answer unavailable", "err", err)
				} else {
					r.cfg.Logger.Warn("router: could not refresh the cluster view; keeping the one it has", "err", err)
				}
			}
		} else {
			r.install(v)
			r.lastViewOK.Store(time.Now().UnixNano())
		}
		r.fetched()
		lastNew = err == nil && r.View() != before
		if !t.Stop() {
			select { // drain a fire that raced with the stale signal
			case <-t.C:
			default:
			}
		}
		t.Reset(r.nextFetch(every))
	}
}

// install sets v as the view unless it is older than the current one (in
// ring epoch, or in rules version at the same epoch) or the same in epoch
// and rules.
func (r *Router) install(v *View) {
	if v == nil || v.Ring == nil {
		return
	}
	cur := r.View()
	if cur != nil && cur.Ring != nil {
		switch e, ce := v.Ring.Epoch(), cur.Ring.Epoch(); {
		case e < ce:
			return
		case e == ce && v.RulesVersion < cur.RulesVersion:
			return // a member that lags on the rules: was installed, and the rules went back
		case e == ce && v.Seed == cur.Seed && sameRules(v, cur):
			return
		}
	}
	r.SetView(v)
}

func sameRules(a, b *View) bool {
	if len(a.Rules) != len(b.Rules) {
		return false
	}
	for name, ra := range a.Rules {
		rb, ok := b.Rules[name]
		if !ok || *ra != *rb {
			return false
		}
	}
	return true
}

// Refresh asks Follow for a fetch now and waits until one has been done
// (whether or not it changed the view), or ctx ends. A caller that met a
// rule its view does not know calls it before retrying: the rule may be
// younger than the view. Without a Follow running it waits for ctx.
func (r *Router) Refresh(ctx context.Context) error {
	r.fetchMu.Lock()
	if r.fetchDone == nil {
		r.fetchDone = make(chan struct{})
	}
	done := r.fetchDone
	r.fetchMu.Unlock()
	r.markStale()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ViewAge is how long ago Follow last read a view (installed or, the
// same as the one in use, not); 0 before the first. A router whose reads
// keep failing (its members gone, or refusing it: a wrong admin token)
// routes by a view that ages.
func (r *Router) ViewAge() time.Duration {
	t := r.lastViewOK.Load()
	if t == 0 {
		return 0
	}
	return time.Since(time.Unix(0, t))
}

// fetchesBegun is how many fetches Follow has begun.
func (r *Router) fetchesBegun() uint64 {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	return r.fetchSeq
}

// refreshAfter waits until a fetch of Follow's other than the first
// begun ones (fetchesBegun) is done, asking for one when none has
// begun, or ctx ends: the callers that met an unknown rule at about the
// same time share one fetch, and none takes a fetch that began before it
// met the rule (which may predate the rule) for its own.
func (r *Router) refreshAfter(ctx context.Context, begun uint64) error {
	for {
		r.fetchMu.Lock()
		began := r.fetchSeq > begun
		if began && !r.fetching {
			r.fetchMu.Unlock()
			return nil
		}
		if r.fetchDone == nil {
			r.fetchDone = make(chan struct{})
		}
		done := r.fetchDone
		if !began {
			r.markStale() // under fetchMu: see beginFetch
		}
		r.fetchMu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// beginFetch marks a fetch of Follow's begun: the callers of Refresh
// and refreshAfter from now on wait for its end.
func (r *Router) beginFetch() {
	r.fetchMu.Lock()
	r.fetchSeq++
	r.fetching = true
	if r.fetchDone == nil {
		r.fetchDone = make(chan struct{})
	}
	// This fetch serves every ask made before it began: one made between
	// Follow's taking the last signal and now would fetch again at once.
	select {
	case <-r.stale:
	default:
	}
	r.fetchMu.Unlock()
}

// waitGap waits until refetchGap has passed since Follow's last fetch
// ended (at once when it has), or ctx ends (its error).
func (r *Router) waitGap(ctx context.Context) error {
	left := refetchGap - time.Since(time.Unix(0, r.lastFetch.Load()))
	if left <= 0 {
		return nil
	}
	return pause.For(ctx, left)
}

// fetched wakes the callers of Refresh waiting for this fetch.
func (r *Router) fetched() {
	r.lastFetch.Store(time.Now().UnixNano())
	r.fetchMu.Lock()
	r.fetching = false
	if r.fetchDone != nil {
		close(r.fetchDone)
		r.fetchDone = nil
	}
	r.fetchMu.Unlock()
}

// askRules has Follow read the view every refetchGap (rather than every
// period) while its view's rules are older than want, until the time
// until (restale's wait); markStale asks for the first read. Asks
// combine: the newest version, the latest end.
func (r *Router) askRules(want uint64, until time.Time) {
	r.fetchMu.Lock()
	r.wantRules = max(r.wantRules, want)
	if until.After(r.wantUntil) {
		r.wantUntil = until
	}
	r.fetchMu.Unlock()
}

// nextFetch is how long Follow waits before its next read: every, or
// refetchGap while a view with newer rules is asked for (askRules) and
// a read then would still come before the ask's end. It forgets an ask
// that is met or over.
func (r *Router) nextFetch(every time.Duration) time.Duration {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	if r.wantRules == 0 {
		return every
	}
	if v := r.View(); (v != nil && v.RulesVersion >= r.wantRules) || !time.Now().Add(refetchGap).Before(r.wantUntil) {
		r.wantRules, r.wantUntil = 0, time.Time{}
		return every
	}
	return min(every, refetchGap)
}

// markStale asks Follow for a refresh without blocking; signals coalesce.
func (r *Router) markStale() {
	select {
	case r.stale <- struct{}{}:
	default:
	}
}
