package node

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/internal/repeats"
)

// hclogger is an hclog.Logger that writes through a slog.Handler, so the
// lines of hashicorp/raft, its network transport and its snapshot store
// come out as the node's own: the same handler (JSON in `ringlimit
// serve`), the same keys (time, level, msg), the same level.
//
// Levels: hclog's Trace and Debug are slog's Debug; Info, Warn and Error
// are slog's. Whether a level is logged is the handler's call (Enabled);
// SetLevel can only raise it (a handler at Info drops Debug whatever
// SetLevel says), and, as in hclog, applies to every logger derived by
// With and Named. GetLevel and the Is methods say what is logged.
//
// Three kinds of line are logged at another level than hashicorp/raft's
// (lineLevel):
//   - A line whose error is raft.ErrTransportShutdown is at Debug,
//     whatever its level: the network transport returns it only once
//     this member closed it, and logs it at Error ("failed to decode
//     incoming command") for each RPC a peer had in flight then — at
//     every normal shutdown of a member whose peers still run.
//   - An error about another member (a line that names a peer, see
//     below: "failed to heartbeat to", "failed to appendEntries to",
//     "failed to make requestVote RPC", ...) is a Warn. This member's
//     Raft works on without that peer (a quorum suffices); a peer that
//     stopped — gracefully, too: it stays a member — is unreachable as
//     one that crashed is; whether it is dead is the failure detector's
//     call, which logs it at Warn ("member marked dead"); and a peer's
//     own failure is logged at Error by that peer. Errors of this
//     member's own (its log store, snapshots, decoding) keep Error.
//   - The Warn lines of a member catching up (catchUp) are Info.
//
// Names (Named, ResetNamed) are the "module" attr ("raft", "raft-net",
// "snapshot"); With's args and each line's args are attrs, written
// as hclogAttrs says.
//
// Warnings and errors that name a peer (an arg "peer", "server-id" or
// "target": hashicorp/raft's "failed to heartbeat to", "failed to
// appendEntries to", "failed to make requestVote RPC", ...) are
// throttled: the first of a message about one peer is logged, repeats
// within repeatWindow are counted, and when the window ends with repeats
// held, the last of them is logged as "msg (N more in 30s)" with an attr
// "repeats": N, which starts the next window (repeats.Repeats). The end of a
// window is a timer of the time package (time.AfterFunc), whatever now
// says: a burst that stops is summed up 30s after its first line, with
// no later line needed; a steady stream comes out as one line per
// window. A summary due after the process exits is lost.
//
// An hclogger is safe for concurrent use.
type hclogger struct {
	h       slog.Handler // the node's, with the module and implied attrs
	base    slog.Handler // the node's, bare: With and Named start from it
	name    string
	implied []any // With's args, in order
	*hclogShared
}

var _ hclog.Logger = (*hclogger)(nil)

// hclogShared is what an hclogger shares with every logger derived from
// it.
type hclogShared struct {
	floor atomic.Int32     // hclog.Level set by SetLevel; NoLevel: the handler alone decides
	now   func() time.Time // the lines' time and the throttle's clock
	epoch time.Time        // the throttle's origin (monotonic with time.Now)
	taken map[string]bool  // keys a line has already: an arg's is renamed

	mu      sync.Mutex
	rep     *repeats.Repeats     // guarded by mu
	pending map[string]*heldLine // guarded by mu: by repeats key, the last line held back in a window that a timer will end
}

// heldLine is a line the throttle held back, to be logged by l as the
// summary of its window.
type heldLine struct {
	l     *hclogger
	level hclog.Level
	msg   string
	args  []any
}

// repeatWindow is how long repeats of a message about one peer are
// counted before the next one is logged; repeatKeys is how many messages
// and peers are remembered at most.
const (
	repeatWindow = 30 * time.Second
	repeatKeys   = 1024
)

// throttledBy are the arg keys that name a peer in hashicorp/raft's lines.
var throttledBy = []string{"peer", "server-id", "target"}

// newHclogger returns an hclogger writing through log's handler (with its
// attrs), at now's time (time.Now in production). taken are the keys of
// the attrs log adds: an arg with one of them is renamed (hclogAttrs).
func newHclogger(log *slog.Logger, now func() time.Time, taken ...string) *hclogger {
	sh := &hclogShared{now: now, epoch: now(), rep: repeats.New(repeatWindow, repeatKeys), pending: make(map[string]*heldLine)}
	sh.taken = map[string]bool{slog.TimeKey: true, slog.LevelKey: true, slog.MessageKey: true, slog.SourceKey: true, "module": true}
	for _, k := range taken {
		sh.taken[k] = true
	}
	return &hclogger{h: log.Handler(), base: log.Handler(), hclogShared: sh}
}

// derive returns a logger sharing l's level and throttle, named name with
// implied args implied.
func (l *hclogger) derive(name string, implied []any) *hclogger {
	h := l.base
	if name != "" {
		h = h.WithAttrs([]slog.Attr{slog.String("module", name)})
	}
	if len(implied) > 0 {
		h = h.WithAttrs(l.hclogAttrs(implied))
	}
	return &hclogger{h: h, base: l.base, name: name, implied: implied, hclogShared: l.hclogShared}
}

// slogLevel maps an hclog level to slog's; false for Off and beyond.
// NoLevel on a line is hclog's default, Info.
func slogLevel(level hclog.Level) (slog.Level, bool) {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug, true
	case hclog.NoLevel, hclog.Info:
		return slog.LevelInfo, true
	case hclog.Warn:
		return slog.LevelWarn, true
	case hclog.Error:
		return slog.LevelError, true
	}
	return 0, false
}

func (l *hclogger) enabled(level hclog.Level) bool {
	sl, ok := slogLevel(level)
	if !ok || level < hclog.Level(l.floor.Load()) {
		return false
	}
	return l.h.Enabled(context.Background(), sl)
}

// log writes one line; pcSkip is what runtime.Callers skips to reach the
// caller of the exported method (0: no source).
func (l *hclogger) log(pcSkip int, level hclog.Level, msg string, args []any) {
	level = lineLevel(level, msg, args)
	if !l.enabled(level) {
		return
	}
	now := l.now()
	if level >= hclog.Warn {
		if peer, ok := peerArg(args); ok {
			key := l.name + "\x00" + msg + "\x00" + peer
			l.mu.Lock()
			at := now.Sub(l.epoch)
			logged, held := l.rep.SeeAt(key, at)
			if logged {
				delete(l.pending, key) // its held count is reported here
			} else {
				p := l.pending[key]
				if p == nil {
					p = &heldLine{}
					l.pending[key] = p
					time.AfterFunc(l.rep.Left(key, at), func() { l.endWindow(key, p) })
				}
				*p = heldLine{l: l, level: level, msg: msg, args: args}
			}
			l.mu.Unlock()
			if !logged {
				return
			}
			msg, args = summary(msg, args, held)
		}
	}
	var pc uintptr
	if pcSkip > 0 {
		var pcs [1]uintptr
		runtime.Callers(pcSkip+1, pcs[:]) // +1: log itself
		pc = pcs[0]
	}
	l.write(now, level, msg, args, pc)
}

// write writes one line at now; pc is its source (0: none).
func (l *hclogger) write(now time.Time, level hclog.Level, msg string, args []any, pc uintptr) {
	sl, _ := slogLevel(level)
	r := slog.NewRecord(now, sl, msg, pc)
	r.AddAttrs(l.hclogAttrs(args)...)
	_ = l.h.Handle(context.Background(), r)
}

// summary returns a line's msg and args as logged when held lines like
// it were held back before it: "msg (N more in 30s)", "repeats": N.
func summary(msg string, args []any, held int) (string, []any) {
	return repeats.Summary(msg, args, held, repeatWindow)
}

// endWindow is the timer of the window of key in which p was held back:
// unless a line of key logged since reported the count, it logs p's
// last line as the summary of the window (repeats.endAt).
func (l *hclogger) endWindow(key string, p *heldLine) {
	l.mu.Lock()
	if l.pending[key] != p {
		l.mu.Unlock()
		return
	}
	now := l.now()
	held, left := l.rep.EndAt(key, now.Sub(l.epoch))
	if left > 0 { // now says the window is not over yet
		time.AfterFunc(left, func() { l.endWindow(key, p) })
		l.mu.Unlock()
		return
	}
	delete(l.pending, key)
	line := *p
	l.mu.Unlock()
	if held > 0 {
		msg, args := summary(line.msg, line.args, held)
		line.l.write(now, line.level, msg, args, 0)
	}
}

// lineLevel is the level a line at level with args is logged at: Debug
// if one of its values is an error that is raft.ErrTransportShutdown
// (the network transport says so only of RPCs it dropped because this
// member closed it; a decode error proper keeps its level); Warn for an
// Error that names a peer, or whose error is a connection the other side
// reset; level otherwise.
func lineLevel(level hclog.Level, msg string, args []any) hclog.Level {
	switch level {
	case hclog.NoLevel, hclog.Info, hclog.Warn, hclog.Error:
	default: // already Debug or below; or Off
		return level
	}
	if level == hclog.Warn && catchUp(msg, args) {
		return hclog.Info
	}
	for i := 1; i < len(args); i += 2 {
		if err, ok := args[i].(error); ok && errors.Is(err, raft.ErrTransportShutdown) {
			return hclog.Debug
		}
	}
	for i := 1; i < len(args); i += 2 {
		if err, ok := args[i].(error); ok && level == hclog.Error && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			// The other side dropped the connection: a peer that stopped
			// (its Raft RPCs in flight are reset at its exit), as below.
			return hclog.Warn
		}
	}
	if _, ok := peerArg(args); ok && level == hclog.Error {
		return hclog.Warn
	}
	return level
}

// catchUp reports whether a Warn line of hashicorp/raft's is the normal
// course of a member catching up rather than a fault, logged at Info: a
// follower whose log lacks the leader's previous entry ("failed to get
// previous log") and the leader then sending older entries
// ("appendEntries rejected, sending older logs") at every join and
// restart, a voter refusing a pre-vote to a candidate behind it (every
// election of a cluster restarted together), and the first election of a member that never had a leader
// (a bootstrap: "heartbeat timeout reached, starting election" with no
// last leader), and a joining member's Raft, configured by nobody yet,
// declining to stand ("no known peers, aborting election", once per
// start of every member started together with the first). A new user
// took them for trouble on a healthy cluster.
func catchUp(msg string, args []any) bool {
	switch msg {
	case "failed to get previous log", "appendEntries rejected, sending older logs",
		"rejecting pre-vote request since our last term is greater",
		"rejecting pre-vote request since our last index is greater",
		"no known peers, aborting election":
		return true
	case "heartbeat timeout reached, starting election":
		for i := 0; i+1 < len(args); i += 2 {
			if k, ok := args[i].(string); ok && k == "last-leader-addr" {
				return fmt.Sprint(args[i+1]) == ""
			}
		}
	}
	return false
}

// peerArg returns the value of the first arg that names a peer, as text.
func peerArg(args []any) (string, bool) {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok {
			for _, t := range throttledBy {
				if k == t {
					return fmt.Sprint(args[i+1]), true
				}
			}
		}
	}
	return "", false
}

// hclogAttrs turns hclog's alternating keys and values into attrs, as
// hclog itself would write them: a key that is not a string is printed;
// a last value without a key is "EXTRA_VALUE_AT_END" (a stack trace
// "stacktrace"); a key a line has already (slog's time, level, msg and
// source, the module, newHclogger's taken) is "arg.<key>", so that no line
// has a key twice (Raft's "time" of "failed to contact", its "node" of
// "entering candidate state"). Values are hclogValue's.
func (sh *hclogShared) hclogAttrs(args []any) []slog.Attr {
	out := make([]slog.Attr, 0, (len(args)+1)/2)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			if st, ok := args[i].(hclog.CapturedStacktrace); ok {
				out = append(out, slog.String("stacktrace", string(st)))
			} else {
				out = append(out, slog.Any("EXTRA_VALUE_AT_END", hclogValue(args[i])))
			}
			break
		}
		k, ok := args[i].(string)
		if !ok {
			k = fmt.Sprint(args[i])
		}
		if sh.taken[k] {
			k = "arg." + k
		}
		out = append(out, slog.Any(k, hclogValue(args[i+1])))
	}
	return out
}

// hclogValue is how a value is written: hclog's Fmt, Hex, Octal, Binary
// and Quote as hclog writes them; a fmt.Stringer that has no JSON or text
// form of its own by its String (a time.Duration as "1.5s", as ringlimit
// writes durations, Raft's *Raft as "Node at ..."); anything else as slog
// writes it (an error by its Error).
func hclogValue(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) > 0 {
			if f, ok := v[0].(string); ok {
				return fmt.Sprintf(f, v[1:]...)
			}
		}
		return fmt.Sprint([]any(v)...)
	case hclog.Hex:
		return "0x" + strconv.FormatInt(int64(v), 16)
	case hclog.Octal:
		return "0" + strconv.FormatInt(int64(v), 8)
	case hclog.Binary:
		return "0b" + strconv.FormatInt(int64(v), 2)
	case hclog.Quote:
		return strconv.Quote(string(v))
	case error, slog.LogValuer, json.Marshaler, encoding.TextMarshaler:
		return v
	case fmt.Stringer:
		return v.String()
	}
	return v
}

// Log writes msg at level.
func (l *hclogger) Log(level hclog.Level, msg string, args ...any) {
	l.log(2, level, msg, args)
}

func (l *hclogger) Trace(msg string, args ...any) { l.log(2, hclog.Trace, msg, args) }
func (l *hclogger) Debug(msg string, args ...any) { l.log(2, hclog.Debug, msg, args) }
func (l *hclogger) Info(msg string, args ...any)  { l.log(2, hclog.Info, msg, args) }
func (l *hclogger) Warn(msg string, args ...any)  { l.log(2, hclog.Warn, msg, args) }
func (l *hclogger) Error(msg string, args ...any) { l.log(2, hclog.Error, msg, args) }

func (l *hclogger) IsTrace() bool { return l.enabled(hclog.Trace) }
func (l *hclogger) IsDebug() bool { return l.enabled(hclog.Debug) }
func (l *hclogger) IsInfo() bool  { return l.enabled(hclog.Info) }
func (l *hclogger) IsWarn() bool  { return l.enabled(hclog.Warn) }
func (l *hclogger) IsError() bool { return l.enabled(hclog.Error) }

// ImpliedArgs returns With's args.
func (l *hclogger) ImpliedArgs() []any { return l.implied }

// With returns a logger that adds args to every line.
func (l *hclogger) With(args ...any) hclog.Logger {
	return l.derive(l.name, append(l.implied[:len(l.implied):len(l.implied)], args...))
}

// Name returns the module name.
func (l *hclogger) Name() string { return l.name }

// Named returns a logger whose module is name under l's ("raft.snapshot").
func (l *hclogger) Named(name string) hclog.Logger {
	if l.name != "" {
		name = l.name + "." + name
	}
	return l.derive(name, l.implied)
}

// ResetNamed returns a logger whose module is name.
func (l *hclogger) ResetNamed(name string) hclog.Logger { return l.derive(name, l.implied) }

// SetLevel raises the level below which nothing is logged, for l and
// every logger derived from the same newHclogger; NoLevel leaves it to
// the handler again.
func (l *hclogger) SetLevel(level hclog.Level) { l.floor.Store(int32(level)) }

// GetLevel returns the lowest level logged; Off when none is.
func (l *hclogger) GetLevel() hclog.Level {
	for lv := max(hclog.Trace, hclog.Level(l.floor.Load())); lv <= hclog.Error; lv++ {
		if l.enabled(lv) {
			return lv
		}
	}
	return hclog.Off
}

// StandardLogger returns a log.Logger whose lines go through l.
func (l *hclogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(l.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer whose writes are lines through l, each
// at the level opts says (as hclog's: ForceLevel, else with InferLevels
// a "[WARN]"-style prefix, else Info). Its lines carry no source.
func (l *hclogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	if opts == nil {
		opts = &hclog.StandardLoggerOptions{}
	}
	return &hclogWriter{l: l, opts: *opts}
}

type hclogWriter struct {
	l    *hclogger
	opts hclog.StandardLoggerOptions
}

// Write logs p, without trailing blanks, as one line.
func (w *hclogWriter) Write(p []byte) (int, error) {
	s := strings.TrimRight(string(p), " \t\n")
	level := hclog.Info
	switch {
	case w.opts.ForceLevel != hclog.NoLevel:
		_, s = levelPrefix(s)
		level = w.opts.ForceLevel
	case w.opts.InferLevels:
		if w.opts.InferLevelsWithTimestamp {
			s = strings.TrimLeft(s, "0123456789 :/.+-TZ")
		}
		level, s = levelPrefix(s)
	}
	w.l.log(0, level, s, nil)
	return len(p), nil
}

// levelPrefix splits a "[LEVEL] " prefix off s, as hclog does; Info when
// there is none.
func levelPrefix(s string) (hclog.Level, string) {
	for _, p := range []struct {
		prefix string
		level  hclog.Level
	}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn}, {"[ERROR]", hclog.Error}, {"[ERR]", hclog.Error}} {
		if rest, ok := strings.CutPrefix(s, p.prefix); ok {
			return p.level, strings.TrimSpace(rest)
		}
	}
	return hclog.Info, s
}
