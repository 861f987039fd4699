package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// jsonLogger returns an hclogger over a JSON handler at level into a
// buffer, and a function that parses the lines written so far.
// The logger's own attrs are "node": "n1".
func jsonLogger(t *testing.T, level slog.Level, now func() time.Time) (*hclogger, func() []map[string]any) {
	t.Helper()
	var buf logbuf.Buffer // the throttle's timers write too
	h := slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level, AddSource: true})
	return newHclogger(slog.New(h).With("node", "n1"), now, "node"), func() []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSuffix(buf.Take(), "\n"), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("not JSON: %q: %v", line, err)
			}
			if keys := jsonKeys(t, line); len(keys) != len(m) {
				t.Fatalf("a key twice: %q", line)
			}
			out = append(out, m)
		}
		return out
	}
}

func TestHclogLevels(t *testing.T) {
	levels := []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error}
	for _, tc := range []struct {
		handler slog.Level
		want    []string // the slog level of each of levels' lines; "" = not logged
	}{
		{slog.LevelDebug, []string{"DEBUG", "DEBUG", "INFO", "WARN", "ERROR"}},
		{slog.LevelInfo, []string{"", "", "INFO", "WARN", "ERROR"}},
		{slog.LevelWarn, []string{"", "", "", "WARN", "ERROR"}},
		{slog.LevelError, []string{"", "", "", "", "ERROR"}},
		{slog.LevelError + 1, []string{"", "", "", "", ""}},
	} {
		l, lines := jsonLogger(t, tc.handler, time.Now)
		for i, lv := range levels {
			l.Log(lv, "m")
			got := ""
			if ls := lines(); len(ls) == 1 {
				got = ls[0]["level"].(string)
			}
			if got != tc.want[i] {
				t.Errorf("handler %v: Log(%v) wrote level %q, want %q", tc.handler, lv, got, tc.want[i])
			}
		}
		// The named methods write as Log does.
		for i, f := range []func(string, ...any){l.Trace, l.Debug, l.Info, l.Warn, l.Error} {
			f("m")
			if n := len(lines()); (n == 1) != (tc.want[i] != "") {
				t.Errorf("handler %v: %v method wrote %d lines, want %q", tc.handler, levels[i], n, tc.want[i])
			}
		}
	}
}

// GetLevel and the Is methods say what is logged: the handler's level,
// raised by SetLevel, which derived loggers share.
func TestHclogGetSetLevel(t *testing.T) {
	type is [5]bool // IsTrace .. IsError
	check := func(t *testing.T, l hclog.Logger, want hclog.Level, wantIs is) {
		t.Helper()
		if got := l.GetLevel(); got != want {
			t.Errorf("GetLevel() = %v, want %v", got, want)
		}
		if got := (is{l.IsTrace(), l.IsDebug(), l.IsInfo(), l.IsWarn(), l.IsError()}); got != wantIs {
			t.Errorf("IsTrace..IsError = %v, want %v", got, wantIs)
		}
	}
	debug, _ := jsonLogger(t, slog.LevelDebug, time.Now)
	check(t, debug, hclog.Trace, is{true, true, true, true, true})

	l, _ := jsonLogger(t, slog.LevelInfo, time.Now)
	named := l.Named("raft").With("k", "v")
	check(t, l, hclog.Info, is{false, false, true, true, true})
	l.SetLevel(hclog.Debug) // below the handler's: no change
	check(t, l, hclog.Info, is{false, false, true, true, true})
	named.SetLevel(hclog.Warn) // shared with l
	check(t, l, hclog.Warn, is{false, false, false, true, true})
	check(t, named, hclog.Warn, is{false, false, false, true, true})
	l.SetLevel(hclog.Off)
	check(t, named, hclog.Off, is{})
	l.SetLevel(hclog.NoLevel) // the handler decides again
	check(t, named, hclog.Info, is{false, false, true, true, true})
}

func TestHclogArgsToAttrs(t *testing.T) {
	l, lines := jsonLogger(t, slog.LevelDebug, time.Now)
	peer := raft.Server{Suffrage: raft.Voter, ID: "n2", Address: "10.0.0.2:8081"}
	l.Info("m",
		"peer", peer,
		"error", errors.New("boom"),
		"backoff time", 1500*time.Millisecond,
		"time", 2*time.Second, // slog's own key
		"node", "Node at a:1 [Follower]", // the logger's
		"module", "m", // the adapter's
		"addr", raft.ServerAddress("a:1"),
		"fmt", hclog.Fmt("%d-%s", 7, "x"),
		"hex", hclog.Hex(255),
		"quote", hclog.Quote(`a"b`),
		"n", 3,
		"ok", true,
		42, "non-string key",
		"dangling",
	)
	ls := lines()
	if len(ls) != 1 {
		t.Fatalf("%d lines, want 1", len(ls))
	}
	got := ls[0]
	want := map[string]any{
		"msg":                "m",
		"level":              "INFO",
		"peer":               map[string]any{"Suffrage": 0.0, "ID": "n2", "Address": "10.0.0.2:8081"},
		"error":              "boom",
		"backoff time":       "1.5s",
		"arg.time":           "2s",
		"node":               "n1",
		"arg.node":           "Node at a:1 [Follower]",
		"arg.module":         "m",
		"addr":               "a:1",
		"fmt":                "7-x",
		"hex":                "0xff",
		"quote":              `"a\"b"`,
		"n":                  3.0,
		"ok":                 true,
		"42":                 "non-string key",
		"EXTRA_VALUE_AT_END": "dangling",
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if _, ok := got["time"].(string); !ok {
		t.Errorf("time = %#v, want slog's timestamp", got["time"])
	}
	// The source is the caller's, not the adapter's.
	if src, _ := got["source"].(map[string]any); src == nil || filepath.Base(src["file"].(string)) != "raftlog_test.go" {
		t.Errorf("source = %v, want this file", got["source"])
	}
}

func TestHclogWithAndNamed(t *testing.T) {
	l, lines := jsonLogger(t, slog.LevelDebug, time.Now)
	raftLog := l.Named("raft")
	snap := raftLog.Named("snapshot").With("path", "/d", "id", "s1")
	snap2 := snap.With("n", 2)
	reset := snap2.ResetNamed("other")
	for _, tc := range []struct {
		l           hclog.Logger
		name        string
		wantImplied []any
		wantAttrs   map[string]any
	}{
		{l, "", nil, map[string]any{}},
		{raftLog, "raft", nil, map[string]any{"module": "raft"}},
		{snap, "raft.snapshot", []any{"path", "/d", "id", "s1"}, map[string]any{"module": "raft.snapshot", "path": "/d", "id": "s1"}},
		{snap2, "raft.snapshot", []any{"path", "/d", "id", "s1", "n", 2}, map[string]any{"module": "raft.snapshot", "path": "/d", "id": "s1", "n": 2.0}},
		{reset, "other", []any{"path", "/d", "id", "s1", "n", 2}, map[string]any{"module": "other", "n": 2.0}},
	} {
		if got := tc.l.Name(); got != tc.name {
			t.Errorf("Name() = %q, want %q", got, tc.name)
		}
		if got := tc.l.ImpliedArgs(); !reflect.DeepEqual(got, tc.wantImplied) {
			t.Errorf("%s: ImpliedArgs() = %v, want %v", tc.name, got, tc.wantImplied)
		}
		tc.l.Warn("m", "x", 1)
		ls := lines()
		if len(ls) != 1 {
			t.Fatalf("%s: %d lines, want 1", tc.name, len(ls))
		}
		for k, v := range tc.wantAttrs {
			if !reflect.DeepEqual(ls[0][k], v) {
				t.Errorf("%s: %s = %#v, want %#v", tc.name, k, ls[0][k], v)
			}
		}
		if _, ok := ls[0]["module"]; !ok && tc.name != "" {
			t.Errorf("%s: no module attr", tc.name)
		}
		if ls[0]["x"] != 1.0 {
			t.Errorf("%s: the line's own arg x = %v, want 1", tc.name, ls[0]["x"])
		}
	}
	// With does not change the logger it derives from.
	if got := snap.ImpliedArgs(); len(got) != 4 {
		t.Errorf("snap.ImpliedArgs() = %v after snap.With", got)
	}
}

func TestHclogStandardLogger(t *testing.T) {
	l, lines := jsonLogger(t, slog.LevelDebug, time.Now)
	for _, tc := range []struct {
		opts      *hclog.StandardLoggerOptions
		line      string
		wantLevel string
		wantMsg   string
	}{
		{nil, "[WARN] plain\n", "INFO", "[WARN] plain"},
		{&hclog.StandardLoggerOptions{InferLevels: true}, "[WARN] inferred", "WARN", "inferred"},
		{&hclog.StandardLoggerOptions{InferLevels: true}, "[ERR] short", "ERROR", "short"},
		{&hclog.StandardLoggerOptions{InferLevels: true}, "no prefix", "INFO", "no prefix"},
		{&hclog.StandardLoggerOptions{InferLevels: true, InferLevelsWithTimestamp: true}, "2026/11/30 23:07:10 [DEBUG] stamped", "DEBUG", "stamped"},
		{&hclog.StandardLoggerOptions{ForceLevel: hclog.Error, InferLevels: true}, "[INFO] forced", "ERROR", "forced"},
	} {
		l.StandardLogger(tc.opts).Print(tc.line)
		ls := lines()
		if len(ls) != 1 || ls[0]["level"] != tc.wantLevel || ls[0]["msg"] != tc.wantMsg {
			t.Errorf("StandardLogger(%+v).Print(%q) wrote %v, want level %s msg %q", tc.opts, tc.line, ls, tc.wantLevel, tc.wantMsg)
		}
	}
	if _, err := l.StandardWriter(nil).Write([]byte("w\n")); err != nil {
		t.Fatal(err)
	}
	if ls := lines(); len(ls) != 1 || ls[0]["msg"] != "w" {
		t.Errorf("StandardWriter wrote %v", ls)
	}
}

// Warnings and errors about one peer are throttled by message and peer;
// other lines are not. A window that ends with lines held back is summed
// up then, with no later line needed (a timer: the test runs in a
// synctest bubble, whose clock is the lines' too).
func TestHclogThrottlesRepeatsAboutAPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := time.Now()
		l, lines := jsonLogger(t, slog.LevelInfo, time.Now)
		raftLog := l.Named("raft")
		s := time.Second
		type line struct {
			level, msg, peer string
			repeats          int // the attr
			at               time.Duration
		}
		const hb, ae, contact, vote = "failed to heartbeat to", "failed to appendEntries to", "failed to contact", "failed to make requestVote RPC"
		for i, step := range []struct {
			at    time.Duration
			level hclog.Level // NoLevel: no line, only the time passing
			msg   string
			key   string // the peer's arg
			peer  string
			want  []line // written since the last step, up to this one's own
		}{
			{0, hclog.Error, hb, "peer", "n2", []line{{"WARN", hb, "n2", 0, 0}}}, // an error about a peer is a warning
			{1 * s, hclog.Error, hb, "peer", "n2", nil},
			{1 * s, hclog.Error, hb, "peer", "n3", []line{{"WARN", hb, "n3", 0, 1 * s}}},
			{1 * s, hclog.Error, ae, "peer", "n2", []line{{"WARN", ae, "n2", 0, 1 * s}}},
			{2 * s, hclog.Warn, contact, "server-id", "n2", []line{{"WARN", contact, "n2", 0, 2 * s}}},
			{3 * s, hclog.Warn, contact, "server-id", "n2", nil},
			{3 * s, hclog.Error, vote, "target", "n2", []line{{"WARN", vote, "n2", 0, 3 * s}}},
			{4 * s, hclog.Error, vote, "target", "n2", nil},
			{5 * s, hclog.Info, "pipelining replication", "peer", "n2", []line{{"INFO", "pipelining replication", "n2", 0, 5 * s}}},
			{6 * s, hclog.Info, "pipelining replication", "peer", "n2", []line{{"INFO", "pipelining replication", "n2", 0, 6 * s}}}, // Info: not throttled
			{20 * s, hclog.Error, hb, "peer", "n2", nil},
			// The window of n2's heartbeats ends at 30s with 2 held: summed
			// up then; the summary starts the next window, which holds 31s.
			{31 * s, hclog.Error, hb, "peer", "n2", []line{{"WARN", hb + " (2 more in 30s)", "n2", 2, 30 * s}}},
			// Bursts that stopped: summed up at the end of their window,
			// with no later line. n3's window held nothing: no summary.
			{34 * s, hclog.NoLevel, "", "", "", []line{{"WARN", contact + " (1 more in 30s)", "n2", 1, 32 * s}, {"WARN", vote + " (1 more in 30s)", "n2", 1, 33 * s}}},
			{61 * s, hclog.Error, hb, "peer", "n2", []line{{"WARN", hb + " (1 more in 30s)", "n2", 1, 60 * s}}},
			{100 * s, hclog.NoLevel, "", "", "", []line{{"WARN", hb + " (1 more in 30s)", "n2", 1, 90 * s}}},
			{130 * s, hclog.NoLevel, "", "", "", nil}, // the window from 90s held nothing
			{131 * s, hclog.Error, hb, "peer", "n2", []line{{"WARN", hb, "n2", 0, 131 * s}}},
			{132 * s, hclog.Error, hb, "peer", "n2", nil},
			{200 * s, hclog.NoLevel, "", "", "", []line{{"WARN", hb + " (1 more in 30s)", "n2", 1, 161 * s}}},
		} {
			time.Sleep(time.Until(base.Add(step.at)))
			synctest.Wait() // the timers due by now have written
			if step.level != hclog.NoLevel {
				raftLog.Log(step.level, step.msg, step.key, step.peer, "error", "dial tcp: connection refused")
			}
			var got []line
			for _, m := range lines() {
				ts, _ := time.Parse(time.RFC3339Nano, m["time"].(string))
				peer, _ := m["peer"].(string)
				for _, k := range throttledBy {
					if p, ok := m[k].(string); ok {
						peer = p
					}
				}
				repeats, _ := m["repeats"].(float64)
				got = append(got, line{m["level"].(string), m["msg"].(string), peer, int(repeats), ts.Sub(base)})
			}
			if !reflect.DeepEqual(got, step.want) {
				t.Errorf("step %d: at %v %v %q %s=%s wrote %v, want %v", i, step.at, step.level, step.msg, step.key, step.peer, got, step.want)
			}
		}
		// Below the handler's level nothing is counted: at Info, a Debug
		// repeat neither logs nor holds anything.
		raftLog.Debug("failed to heartbeat to", "peer", "n9")
		raftLog.Debug("failed to heartbeat to", "peer", "n9")
		time.Sleep(time.Minute)
		synctest.Wait()
		if ls := lines(); len(ls) != 0 {
			t.Errorf("debug line at an Info handler: %v", ls)
		}
	})
}

// A clock that falls behind the timers (now is a parameter; the
// window's timer is the time package's) ends a window when the clock
// says so.
func TestHclogThrottleClockBehindTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := time.Now()
		var lag atomic.Int64
		l, lines := jsonLogger(t, slog.LevelInfo, func() time.Time { return time.Now().Add(-time.Duration(lag.Load())) })
		l.Warn("failed to contact", "server-id", "n2")
		l.Warn("failed to contact", "server-id", "n2")
		lag.Store(int64(5 * time.Second))
		time.Sleep(31 * time.Second) // the timer fired at 30s; the clock said 25s
		synctest.Wait()
		if ls := lines(); len(ls) != 1 {
			t.Fatalf("by 31s (the clock: 26s): %d lines, want the first only", len(ls))
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		ls := lines()
		if len(ls) != 1 || ls[0]["msg"] != "failed to contact (1 more in 30s)" || ls[0]["repeats"] != 1.0 {
			t.Fatalf("by 36s (the clock: 31s): %v, want the summary", ls)
		}
		if at, _ := time.Parse(time.RFC3339Nano, ls[0]["time"].(string)); at.Sub(base) != 30*time.Second {
			t.Errorf("summary at %v, want at the clock's 30s", at.Sub(base))
		}
	})
}

// Two kinds of Raft's lines are logged at another level than Raft's:
// a transport's "transport shutdown" is not an error (hashicorp/raft's
// network transport returns it only for RPCs it dropped because this
// member closed it, which happens at every normal shutdown whose peers
// still run), and an error about another member is a warning (a
// graceful stop of a member makes the others fail to reach it). A
// decode error proper, and this member's own errors, keep their level.
func TestHclogLineLevel(t *testing.T) {
	shutdown := raft.ErrTransportShutdown
	refused := errors.New("dial tcp 127.0.0.1:8081: connect: connection refused")
	for _, tc := range []struct {
		level hclog.Level
		msg   string
		args  []any
		want  string // the slog level; "" = not logged
	}{
		{hclog.Error, "failed to decode incoming command", []any{"error", shutdown}, "DEBUG"},
		{hclog.Error, "failed to decode incoming command", []any{"error", fmt.Errorf("handling: %w", shutdown)}, "DEBUG"},
		{hclog.Warn, "m", []any{"error", shutdown}, "DEBUG"},
		{hclog.NoLevel, "m", []any{"error", shutdown}, "DEBUG"},
		{hclog.Trace, "m", []any{"error", shutdown}, "DEBUG"},
		{hclog.Off, "m", []any{"error", shutdown}, ""},
		{hclog.Error, "m", []any{"peer", "n2", "error", shutdown}, "DEBUG"},
		{hclog.Error, "failed to decode incoming command", []any{"error", errors.New("msgpack decode error [pos 3]: invalid length")}, "ERROR"},
		{hclog.Error, "failed to decode incoming command", []any{"error", errors.New("transport shutdown")}, "ERROR"}, // another error with the same text
		{hclog.Error, "failed to decode incoming command", []any{"error", io.ErrUnexpectedEOF}, "ERROR"},
		{hclog.Error, "failed to decode incoming command", []any{"error", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}, "WARN"}, // a peer's exit
		{hclog.Error, "failed to flush response", []any{"error", shutdown.Error()}, "ERROR"},                                                                                  // text, not the error
		// About another member: at most a warning.
		{hclog.Error, "failed to heartbeat to", []any{"peer", "127.0.0.1:8081", "backoff time", time.Second, "error", refused}, "WARN"},
		{hclog.Error, "failed to appendEntries to", []any{"peer", raft.Server{ID: "n2"}, "error", refused}, "WARN"},
		{hclog.Error, "failed to make requestVote RPC", []any{"target", raft.Server{ID: "n2"}, "error", refused, "term", 3}, "WARN"},
		{hclog.Warn, "failed to contact", []any{"server-id", "n2", "time", time.Second}, "WARN"},
		{hclog.Info, "pipelining replication", []any{"peer", raft.Server{ID: "n2"}}, "INFO"},
		// A member catching up: Info.
		{hclog.Warn, "failed to get previous log", []any{"previous-index", 7, "last-index", 3, "error", raft.ErrLogNotFound}, "INFO"},
		{hclog.Warn, "appendEntries rejected, sending older logs", []any{"peer", raft.Server{ID: "n2"}, "next", 4}, "INFO"},
		{hclog.Warn, "rejecting pre-vote request since our last term is greater", []any{"candidate", "n2", "candidate-term", 3, "last-term", 4}, "INFO"},
		{hclog.Warn, "rejecting pre-vote request since node is not in configuration", []any{"from", "n9"}, "WARN"},
		{hclog.Warn, "heartbeat timeout reached, starting election", []any{"last-leader-addr", raft.ServerAddress(""), "last-leader-id", raft.ServerID("")}, "INFO"},
		{hclog.Warn, "no known peers, aborting election", nil, "INFO"},
		{hclog.Warn, "not part of stable configuration, aborting election", nil, "WARN"},
		{hclog.Warn, "heartbeat timeout reached, starting election", []any{"last-leader-addr", raft.ServerAddress("10.0.0.1:8081"), "last-leader-id", raft.ServerID("n1")}, "WARN"},
		// This member's own.
		{hclog.Error, "failed to append to logs", []any{"error", errors.New("disk full")}, "ERROR"},
		{hclog.Error, "failed to open snapshot", []any{"id", "s1", "error", errors.New("EOF")}, "ERROR"},
	} {
		for _, handler := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
			l, lines := jsonLogger(t, handler, time.Now)
			l.Named("raft").Log(tc.level, tc.msg, tc.args...)
			want := tc.want
			if want == "DEBUG" && handler > slog.LevelDebug {
				want = ""
			}
			got := ""
			if ls := lines(); len(ls) == 1 {
				got = ls[0]["level"].(string)
			}
			if got != want {
				t.Errorf("handler %v: Log(%v, %q, %v) wrote level %q, want %q", handler, tc.level, tc.msg, tc.args, got, want)
			}
		}
	}
}

// The same through hashicorp/raft's own TCP transport: an RPC a peer
// has in flight when the member closes its transport.
func TestHclogTransportShutdownOfRaft(t *testing.T) {
	var buf logbuf.Buffer
	log := newHclogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), time.Now)
	recv, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 1, 5*time.Second, log.Named("raft-net"))
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	send, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 1, 5*time.Second, log.Named("raft-net"))
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	sent := make(chan error, 1)
	go func() {
		var resp raft.AppendEntriesResponse
		sent <- send.AppendEntries("n2", recv.LocalAddr(), &raft.AppendEntriesRequest{Term: 1, PrevLogEntry: 1}, &resp)
	}()
	<-recv.Consumer() // in flight: taken, never answered
	recv.Close()
	if err := <-sent; err == nil {
		t.Fatal("the RPC was answered")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "failed to decode incoming command") {
		if time.Now().After(deadline) {
			t.Fatalf("no line about the dropped RPC:\n%s", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		if m["msg"] == "failed to decode incoming command" && (m["level"] != "DEBUG" || m["error"] != "transport shutdown" || m["module"] != "raft-net") {
			t.Errorf("the dropped RPC's line is %s, want it at DEBUG with module raft-net and error \"transport shutdown\"", line)
		}
	}
}

// jsonKeys returns the keys of the JSON object line, in order, repeats
// included (json.Unmarshal keeps the last of a repeated key).
func jsonKeys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	var keys []string
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}
