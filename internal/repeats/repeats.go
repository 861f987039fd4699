// Package repeats throttles a stream of log lines by key: see Repeats.
// The node's Raft logger and the gateway use it, so that a line that
// comes again and again (a peer that is down, a client's request that
// fails the same way) is logged once per window with the count of those
// held back.
package repeats

import (
	"fmt"
	"time"
)

// Repeats decides which lines of a stream to log when the same one
// (by key: a message and the peer it is about) comes again and again:
// the first of a key is logged and starts a window; repeats within it
// are held back and counted. Its owner ends the window when it is over
// (EndAt, at Left): the count held is then reported and starts a new
// window. A line after a window that was not ended (its owner was late)
// is logged with the count (held) and starts a new window.
//
// Time is an argument: a monotonic offset from any origin. A time before
// the last logged one (a clock that went back) counts as within the
// window.
//
// It remembers at most max keys: a new key when full first forgets the
// keys whose window has passed with nothing held (those with lines held
// are about to be reported), and if none has, is logged and not
// remembered rather than grow the map.
//
// Not safe for concurrent use.
type Repeats struct {
	window time.Duration
	max    int
	seen   map[string]repeat
}

type repeat struct {
	since time.Duration // when the last line of the key was logged
	held  int           // lines of the key held back since
}

// New returns a Repeats of window and at most max keys.
func New(window time.Duration, max int) *Repeats {
	return &Repeats{window: window, max: max, seen: make(map[string]repeat)}
}

// SeeAt reports whether the line key seen at now is to be logged, and
// how many of it were held back since the last one logged.
func (r *Repeats) SeeAt(key string, now time.Duration) (log bool, held int) {
	e, ok := r.seen[key]
	switch {
	case !ok:
		if len(r.seen) >= r.max {
			r.forget(now)
			if len(r.seen) >= r.max {
				return true, 0
			}
		}
	case now-e.since < r.window: // and a clock that went back: negative
		e.held++
		r.seen[key] = e
		return false, 0
	}
	r.seen[key] = repeat{since: now}
	return true, e.held
}

// Left returns how long key's window has still to run at now: at most
// window (a clock that went back); 0 when it is over or key is unknown.
func (r *Repeats) Left(key string, now time.Duration) time.Duration {
	e, ok := r.seen[key]
	if !ok {
		return 0
	}
	return min(max(r.window-(now-e.since), 0), r.window)
}

// EndAt ends key's window at now if it is over: it returns the count of
// lines held back in it (0: none, or key is unknown) and, when some
// were, starts a new window at now, as a line logged at now would. If
// the window is not over, it changes nothing and returns how long it
// has still to run.
func (r *Repeats) EndAt(key string, now time.Duration) (held int, left time.Duration) {
	if left := r.Left(key, now); left > 0 {
		return 0, left
	}
	e, ok := r.seen[key]
	if !ok || e.held == 0 {
		return 0, 0
	}
	r.seen[key] = repeat{since: now}
	return e.held, 0
}

// forget drops the keys whose window has passed at now with nothing
// held back.
func (r *Repeats) forget(now time.Duration) {
	for k, e := range r.seen {
		if now-e.since >= r.window && e.held == 0 {
			delete(r.seen, k)
		}
	}
}

// Summary returns a line's msg and args as logged when held lines like
// it were held back in the window before it: "msg (N more in WINDOW)",
// and "repeats": N added to args; msg and args unchanged when held is 0.
func Summary(msg string, args []any, held int, window time.Duration) (string, []any) {
	if held == 0 {
		return msg, args
	}
	return fmt.Sprintf("%s (%d more in %s)", msg, held, window), append(args[:len(args):len(args)], "repeats", held)
}
