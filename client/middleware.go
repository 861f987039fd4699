package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/identity"
)

// Checker decides one check; *Client (HTTP) and *Ring (data plane)
// implement it.
type Checker interface {
	Check(ctx context.Context, rule, key string, cost int64) (api.Decision, error)
}

var (
	_ Checker = (*Client)(nil)
	_ Checker = (*Ring)(nil)
)

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Rule is the rule every request is checked against (required).
	Rule string
	// Key tells clients apart; nil = KeyByIP. An error (or an empty key)
	// answers 401 unauthorized with its text as the message (KeyByHeader:
	// "missing NAME header"), and the request is not checked.
	Key func(*http.Request) (string, error)
	// Cost is what a request costs; nil = 1. A request that costs 0 is
	// free: it goes to next unchecked, with no rate-limit headers (a
	// cost-0 check is a query, which a spent budget would answer 429).
	Cost func(*http.Request) int64
	// Timeout bounds each check: a limiter that does not answer within it
	// is one that could not decide (OnError). 0 = 1s; negative = none but
	// the request's own context. The check sits inline on every request,
	// and an *http.Client (New) has no timeout of its own: was none, so a
	// limiter that accepted connections and never answered held every
	// request until its client gave up, and OnError never ran.
	Timeout time.Duration
	// Window is the rule's period, for RateLimit-Policy's w; 0 = read it
	// from a Ring's view, else 1s.
	Window time.Duration
	// OnError answers when the limiter could not decide: it could not be
	// reached, or Rule is not a rule of the cluster (err says which).
	// nil = 503 unavailable "rate limiter unavailable", with err logged
	// nowhere: set it to log err, or call next.ServeHTTP in it to fail
	// open. A check the limiter refuses as bad (a cost below 0 or above
	// what the rule can ever allow) is answered 400 with the limiter's
	// message, never by OnError: failing open there would let any cost
	// through. A request whose client has gone (its context canceled) is
	// not answered at all; one whose context's deadline passed (an outer
	// timeout) is OnError's to answer.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// Now is the clock of X-RateLimit-Reset; nil = time.Now.
	Now func() time.Time
}

// Middleware returns net/http middleware that checks each request before
// it reaches next, with the gateway's headers (SetHeaders on allowed
// answers, WriteDenied's 429 on denied ones). A decision with a delay
// (leaky_bucket) holds the request that long, and drops it if the client
// leaves meanwhile. next finds the decision with FromContext.
func Middleware(c Checker, cfg MiddlewareConfig) func(http.Handler) http.Handler {
	if cfg.Key == nil {
		cfg.Key = KeyByIP
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := cfg.Key(r)
			if err == nil && key == "" {
				err = errors.New("client: the request's key is empty")
			}
			if err != nil {
				WriteError(w, http.StatusUnauthorized, api.CodeUnauthorized, err.Error())
				return
			}
			cost := int64(1)
			if cfg.Cost != nil {
				cost = cfg.Cost(r)
			}
			if cost == 0 {
				next.ServeHTTP(w, r)
				return
			}
			ctx := r.Context()
			if cfg.Timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
				defer cancel()
			}
			d, err := c.Check(ctx, cfg.Rule, key, cost)
			if err != nil {
				// Was: any end of the request's context counted as the
				// client leaving, so an outer timeout's deadline answered
				// an empty 200, neither OnError nor next.
				if errors.Is(r.Context().Err(), context.Canceled) {
					return // the client left: nobody to answer, nothing to let through
				}
				if e, ok := errors.AsType[*api.Error](err); ok && e.Status == http.StatusBadRequest {
					WriteError(w, http.StatusBadRequest, api.CodeBadRequest, e.Message)
					return
				}
				if cfg.OnError != nil {
					cfg.OnError(w, r, err)
					return
				}
				WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "rate limiter unavailable")
				return
			}
			rl := RateLimit{Policy: cfg.Rule, Window: window(c, cfg), Decision: d}
			if !d.Allowed {
				WriteDenied(w, rl, cfg.Now())
				return
			}
			SetHeaders(w.Header(), rl, cfg.Now())
			r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, rl))
			if d.DelayMs > 0 {
				t := time.NewTimer(time.Duration(d.DelayMs) * time.Millisecond)
				defer t.Stop()
				select {
				case <-t.C:
				case <-r.Context().Done():
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

type decisionKey struct{}

// FromContext returns the decision Middleware made for the request whose
// context is ctx, as next sees it: ok is false for a request it did not
// check (a cost of 0). An admission with Decision.Degraded set was let
// through by the rule's failure_mode open while the key's owner could not
// be asked: next may log it, or do less for such a request.
func FromContext(ctx context.Context) (rl RateLimit, ok bool) {
	rl, ok = ctx.Value(decisionKey{}).(RateLimit)
	return rl, ok
}

func window(c Checker, cfg MiddlewareConfig) time.Duration {
	if cfg.Window > 0 {
		return cfg.Window
	}
	if p, ok := c.(interface {
		Period(string) (time.Duration, bool)
	}); ok {
		if d, ok := p.Period(cfg.Rule); ok {
			return d
		}
	}
	return time.Second
}

// KeyByIP keys a request by its peer's IP address, "ip:ADDR" as the
// gateway keys it (an IPv4-mapped IPv6 address as IPv4, no zone), with no
// X-Forwarded-For: put the gateway, which knows trusted proxies, in front
// for that.
func KeyByIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return "", errors.New("client: no peer address")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().WithZone("").String()
	}
	return "ip:" + host, nil
}

// KeyByHeader keys a request by a header's value (an API key), as the
// gateway keys it: "key:VALUE", or "keyh:" and its SHA-256 for a value
// over 1 KiB or not UTF-8. A request without the header, or with it
// twice (one value keyed, the other read by the handler), gets 401.
//
// The value is not verified (the handler after the middleware does
// that): a caller that sends a new value per request gets a new budget
// each time. Where a limit must hold against such callers (a login),
// wrap the handler in a second Middleware keyed by KeyByIP, outermost,
// with a rule of its own, or key by what your authentication verified.
func KeyByHeader(name string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		vs := r.Header.Values(name)
		switch {
		case len(vs) == 0 || vs[0] == "":
			return "", errors.New("missing " + name + " header")
		case len(vs) > 1:
			return "", errors.New("more than one " + http.CanonicalHeaderKey(name) + " header")
		}
		return identity.Key("key", vs[0]), nil
	}
}

// WriteError answers status with the contract's JSON error body {"error": code,
// "message": msg}, not cacheable.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(jsonLine(api.Error{Code: code, Message: msg}))
}
