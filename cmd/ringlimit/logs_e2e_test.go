package main

import (
	"encoding/json"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// The normal life of a 3-member cluster of real processes and a router —
// start, join, settle, a graceful stop (SIGINT) of the router and of each
// member: a follower, then the leader, then the last one — writes
// nothing but
// slog JSON lines on stderr, and none at ERROR: not Raft's at shutdown
// (its transport's "failed to decode incoming command: transport
// shutdown"), not gRPC's, not bbolt's. gRPC's own logger writes through
// the process's slog logger too (its INFO as DEBUG: "Server created").
func TestServeLogsAreSlogJSONWithoutErrors(t *testing.T) {
	n1 := startServe(t, "n1", t.TempDir(), "--grpc", freePort(t))
	n2 := startServe(t, "n2", t.TempDir(), "--grpc", freePort(t), "--join", n1.http)
	n3 := startServe(t, "n3", t.TempDir(), "--grpc", freePort(t), "--join", n1.http)
	nodes := []*proc{n1, n2, n3}
	var view api.Cluster
	waitFor(t, "3 active voters with partitions, the same view everywhere", func() bool {
		var first api.Cluster
		for i, p := range nodes {
			var c api.Cluster
			if get(p.http, "/v1/cluster", &c) != 200 || len(c.Members) != 3 {
				return false
			}
			for k, m := range c.Members {
				if m.State != "active" || m.Partitions == 0 || m.Voter == nil || !*m.Voter {
					return false
				}
				c.Members[k].SilentMS = nil // the leader's alone
			}
			if i == 0 {
				first = c
			} else if !reflect.DeepEqual(c, first) {
				return false
			}
		}
		view = first
		return view.Leader != ""
	})
	var leader *proc
	var followers []*proc
	for _, p := range nodes {
		if p.id == view.Leader {
			leader = p
		} else {
			followers = append(followers, p)
		}
	}
	if leader == nil {
		t.Fatalf("leader %q is none of the members", view.Leader)
	}
	rt := &proc{id: "router", http: freePort(t), done: make(chan struct{}), log: &logbuf.Buffer{}}
	rt.cmd = exec.Command(binary(t), "router", "--http", rt.http, "--cluster", n2.http+","+n1.http, "--grpc", freePort(t), "--log-level", "debug")
	rt.cmd.Stderr = rt.log
	if err := rt.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { rt.exitErr = rt.cmd.Wait(); close(rt.done) }()
	t.Cleanup(func() {
		rt.stop(t)
		if t.Failed() {
			t.Logf("log of the router:\n%s", lastLines(rt.logText(), 40))
		}
	})
	waitFor(t, "router ready", func() bool { return get(rt.http, "/readyz", nil) == 200 })
	for _, p := range []*proc{rt, followers[0], leader, followers[1]} {
		p.stop(t)
		if p.exitErr != nil {
			t.Errorf("%s: SIGINT: %v, want a clean exit", p.id, p.exitErr)
		}
	}
	for _, p := range append(nodes, rt) {
		grpcLines := 0
		for line := range strings.SplitSeq(strings.TrimSuffix(p.log.String(), "\n"), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Errorf("%s: a line that is not JSON: %q", p.id, line)
				continue
			}
			for _, k := range []string{"time", "level", "msg"} {
				if _, ok := m[k].(string); !ok {
					t.Errorf("%s: a line without slog's %q: %s", p.id, k, line)
				}
			}
			if m["level"] == "ERROR" {
				t.Errorf("%s: an ERROR line in a normal start and stop: %s", p.id, line)
			}
			if m["module"] == "grpc" {
				grpcLines++
			}
		}
		if grpcLines == 0 {
			t.Errorf("%s: no line of gRPC's own logger (module grpc) at --log-level debug", p.id)
		}
	}
}
