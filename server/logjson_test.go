package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
)

// lockedBuffer is a buffer that members write while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns every line written so far, each parsed; it fails the
// test on a line that is not a JSON object or has a key twice.
func (b *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSuffix(b.buf.String(), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a line that is not JSON: %q", line)
		}
		if n := topKeys(line); n != len(m) {
			t.Fatalf("a line with a key twice: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// topKeys counts the keys of the JSON object line, repeats included
// (json.Unmarshal keeps the last of a repeated key); -1 if it is not one.
func topKeys(line string) int {
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return -1
	}
	n := 0
	for dec.More() {
		var v json.RawMessage
		if _, err := dec.Token(); err != nil {
			return -1
		}
		if err := dec.Decode(&v); err != nil {
			return -1
		}
		n++
	}
	return n
}

// Every line members write, from start to shutdown, is slog's JSON:
// Raft's too (hashicorp/raft, its TCP transport, its snapshot store),
// which used to come out as hclog's JSON, and at shutdown as hclog's
// text. None is at ERROR while they start. And a member that is down
// makes the leader log Raft's failed heartbeats to it once, not every
// half second.
func TestEveryLogLineIsSlogJSON(t *testing.T) {
	var out lockedBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var ss []*Server
	var stops []func() error
	for _, id := range []string{"n1", "n2", "n3"} {
		join := ""
		if len(ss) > 0 {
			join = ss[0].cfg.HTTPAdvertise
		}
		ls := listen(t)
		s, err := Start(Config{
			ID: id, HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
			DataDir: t.TempDir(), Join: join, Ring: ring.Config{Partitions: 128, ReplicationFactor: 64, Load: 1.25},
			RaftTimeout: testRaftTimeout,
			Router:      router.Config{Timeout: testRouterTimeout, RefreshWait: 2 * time.Second},
			Logger:      log,
		}, ls)
		if err != nil {
			t.Fatal(err)
		}
		stop := sync.OnceValue(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return s.Shutdown(ctx)
		})
		t.Cleanup(func() { _ = stop() })
		ss, stops = append(ss, s), append(stops, stop)
		if len(ss) == 1 {
			eventually(t, "n1 ready", func() bool { return s.Node.Ready() == nil })
		}
	}
	waitSettled(t, ss, 3)
	waitPromoted(t, ss)

	var lead, down *Server
	eventually(t, "a leader", func() bool {
		for _, s := range ss {
			if s.Node.Raft().State() == raft.Leader {
				lead = s
				return true
			}
		}
		return false
	})
	if err := lead.Node.Raft().Snapshot().Error(); err != nil { // the snapshot store's lines
		t.Fatal(err)
	}
	// A normal start logs no error (Raft's errors about another member
	// are warnings; a transport's "transport shutdown" is debug).
	for _, l := range out.lines(t) {
		if l["level"] == "ERROR" {
			t.Errorf("an ERROR line while 3 members start: %v", l)
		}
	}
	for _, s := range ss {
		if s != lead {
			down = s
		}
	}
	// Count the leader's failed heartbeats to the member it can no
	// longer reach (in the filter: nothing reads the channel): Raft logs
	// each just before it reports it.
	var failed atomic.Int64
	obs := raft.NewObserver(make(chan raft.Observation, 64), false, func(o *raft.Observation) bool {
		if f, ok := o.Data.(raft.FailedHeartbeatObservation); ok && string(f.PeerID) == down.cfg.ID {
			failed.Add(1)
		}
		return false
	})
	lead.Node.Raft().RegisterObserver(obs)
	defer lead.Node.Raft().DeregisterObserver(obs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := down.Abort(ctx); err != nil { // gone as a crash would be
		t.Fatal(err)
	}
	eventually(t, "4 failed heartbeats", func() bool { return failed.Load() >= 4 })
	var heartbeats int
	for _, l := range out.lines(t) {
		if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "failed to heartbeat to") && l["peer"] == down.cfg.RaftAdvertise {
			heartbeats++
		}
	}
	if heartbeats != 1 {
		t.Errorf("%d lines about the failed heartbeats (%d) to %s, want 1", heartbeats, failed.Load(), down.cfg.ID)
	}

	for i, s := range ss {
		if s != down {
			if err := stops[i](); err != nil {
				t.Error(err)
			}
		}
	}
	modules := map[string]int{}
	for _, l := range out.lines(t) {
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := l[k].(string); !ok {
				t.Fatalf("a line without slog's %q: %v", k, l)
			}
		}
		for k := range l {
			if strings.HasPrefix(k, "@") {
				t.Fatalf("a line with hclog's %q: %v", k, l)
			}
		}
		if m, ok := l["module"].(string); ok {
			modules[m]++
			if l["node"] == nil {
				t.Errorf("a line of %s without the node's id: %v", m, l)
			}
		}
	}
	for _, m := range []string{"raft", "raft-net", "snapshot"} {
		if modules[m] == 0 {
			t.Errorf("no line of module %q; lines by module: %v", m, modules)
		}
	}
}
