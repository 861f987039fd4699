package server

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
)

// Every line members write, from start to shutdown, is slog's JSON:
// Raft's too (hashicorp/raft, its TCP transport, its snapshot store),
// which used to come out as hclog's JSON, and at shutdown as hclog's
// text. None is at ERROR while they start. And a member that is down
// makes the leader log Raft's failed heartbeats to it once, not every
// half second.
func TestEveryLogLineIsSlogJSON(t *testing.T) {
	var out logbuf.Buffer
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
			DataDir: t.TempDir(), Join: []string{join}, Ring: ring.Config{Partitions: 128, ReplicationFactor: 64, Load: 1.25},
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
	for _, l := range logbuf.Parse(t, out.String()) {
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
	for _, l := range logbuf.Parse(t, out.String()) {
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
	for _, l := range logbuf.Parse(t, out.String()) {
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
