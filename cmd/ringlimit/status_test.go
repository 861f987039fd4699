package main

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

func TestStatusCommand(t *testing.T) {
	f := newFakeAPI(t)
	ctx := context.Background()

	code, out, errs := runCmd(ctx, runStatus, nil, "--addr", f.addr)
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	lines := strings.Split(out, "\n")
	head := "leader         n1\nepoch          42\npartitions     1024\nmembers        2\nrules version  7\n\n"
	if !strings.HasPrefix(out, head) || len(lines) != 10 {
		t.Fatalf("table:\n%s\nwant it to start with:\n%s", out, head)
	}
	for i, want := range []string{
		"ID STATE HTTP RAFT PEER PARTITIONS VOTER",
		"n1 * active 10.0.0.1:8080 10.0.0.1:8081 10.0.0.1:8082 512 yes",
		"n2 draining " + f.addr + " 127.0.0.1:9 127.0.0.1:10 512 no",
	} {
		if got := strings.Join(strings.Fields(lines[6+i]), " "); got != want {
			t.Errorf("table line %d = %q, want %q", 6+i, lines[6+i], want)
		}
	}
	// Columns are aligned: every row starts its HTTP column where the
	// header's does.
	col := strings.Index(lines[6], "HTTP")
	for _, l := range lines[7:9] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row %q not aligned with HTTP at column %d", l, col)
		}
	}

	// --json is the /v1/cluster object; the address may come from the
	// environment and be a URL.
	code, out, errs = runCmd(ctx, runStatus, map[string]string{"RINGLIMIT_ADDR": f.srv.URL, "RINGLIMIT_JSON": "1"})
	if code != 0 {
		t.Fatalf("--json: exit %d; stderr: %s", code, errs)
	}
	var got api.Cluster
	if err := json.Unmarshal([]byte(out), &got); err != nil || !reflect.DeepEqual(got, f.cluster) {
		t.Errorf("--json printed %s (%v), want %+v", out, err, f.cluster)
	}
	if !strings.Contains(out, `"leader":"n1","epoch":42,"partitions":1024,"rules_version":7,"members":[{"id":"n1","state":"active","http":"10.0.0.1:8080"`) ||
		!strings.Contains(out, `"partitions":512,"voter":false}`) {
		t.Errorf("--json printed %s, not the wire form", out)
	}
}

// Raft servers that are no member (a leave between its two halves) get
// a line under the table.
func TestStatusRaftOnly(t *testing.T) {
	f := newFakeAPI(t)
	f.cluster.RaftOnly = []string{"n3", "n4"}
	code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr)
	if code != 0 || !strings.HasSuffix(out, "\nin Raft's configuration, no member: n3, n4 (a leave or a join under way)\n") {
		t.Fatalf("exit %d, stderr %s; output:\n%s\nwant a last line naming n3, n4", code, errs, out)
	}
}

// A node that does not report voters (an older version) leaves the
// VOTER column at "-", and the columns before it where they were.
func TestStatusVoterNotReported(t *testing.T) {
	f := newFakeAPI(t)
	for i := range f.cluster.Members {
		f.cluster.Members[i].Voter = nil
	}
	code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr)
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	lines := strings.Split(out, "\n")
	if got, want := strings.Join(strings.Fields(lines[7]), " "), "n1 * active 10.0.0.1:8080 10.0.0.1:8081 10.0.0.1:8082 512 -"; got != want {
		t.Errorf("row = %q, want %q", got, want)
	}
}

// A node that knows the members but no leader (an election) is a
// status worth printing, and not a healthy one: exit 1, saying why.
// Was: exit 0, as for a healthy cluster.
func TestStatusNoLeader(t *testing.T) {
	f := newFakeAPI(t)
	f.cluster.Leader = ""
	for _, json := range []string{"--json=false", "--json"} {
		code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr, json)
		if code != 1 || !strings.Contains(errs, "no leader") {
			t.Errorf("%s: exit %d, stderr %q; want 1 and no leader named", json, code, errs)
		}
		if json == "--json" {
			if !strings.Contains(out, `"leader":""`) {
				t.Errorf("--json printed %s, want the cluster object", out)
			}
		} else if !strings.Contains(out, "leader         (none)") || !strings.Contains(out, "members        2") {
			t.Errorf("output:\n%s", out)
		}
	}
}

// --ready: a cluster with a leader is not enough, the member at --addr
// must be ready too (exit 1 saying why): Compose's health check ran
// status alone, healthy while the member's /readyz said 503 (a walk
// through the deployment docs).
func TestStatusReady(t *testing.T) {
	f := newFakeAPI(t)
	if code, _, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr, "--ready"); code != 0 {
		t.Fatalf("ready: exit %d, stderr %q", code, errs)
	}
	f.notReady = "not ready: marked down"
	code, _, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr, "--ready")
	if code != 1 || !strings.Contains(errs, "is not ready") || !strings.Contains(errs, "marked down") {
		t.Fatalf("not ready: exit %d, stderr %q; want 1 and the member's reason", code, errs)
	}
	if code, _, _ := runCmd(context.Background(), runStatus, nil, "--addr", f.addr); code != 0 {
		t.Fatalf("without --ready a member not ready is no failure of status: exit %d", code)
	}
}

// A node with no view of the cluster yet is an error (exit 2) that says
// so, not a cluster of nobody: a member that has not joined answers 503,
// and a node that lists no members (an older version) is taken the same
// way.
func TestStatusNoView(t *testing.T) {
	f := newFakeAPI(t)
	f.cluster = api.Cluster{Partitions: 1024}
	// Nothing listens at the --join address: the member never joins.
	m := startTestMember(t, "n1", freePort(t))
	for _, tc := range []struct{ addr, says string }{
		{f.addr, "it lists no members"},
		{m.http, "unavailable (503): this node has no view of the cluster yet: it has not joined a cluster"},
	} {
		for _, json := range []string{"--json=false", "--json"} {
			code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", tc.addr, json)
			if code != 2 || out != "" || !strings.Contains(errs, "no view of the cluster yet") || !strings.Contains(errs, tc.says) {
				t.Errorf("status --addr %s %s: exit %d, stdout %q, stderr %q; want 2, nothing, a message saying it has no view (%s)", tc.addr, json, code, out, errs, tc.says)
			}
		}
	}
}

func TestStatusErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "127.0.0.1:1"},          // nothing listens
		{"--addr", "127.0.0.1:1", "extra"}, // stray argument
		{"--json=maybe"},                   // bad flag value
	} {
		code, out, errs := runCmd(context.Background(), runStatus, nil, args...)
		if code != 2 || out != "" || errs == "" {
			t.Errorf("status %q: exit %d, stdout %q, stderr %q; want 2, nothing, a message", args, code, out, errs)
		}
	}
}

// The leader's answer carries each member's silence: status says so
// under the table for one silent a second or more, and nothing for one
// heard from lately or not reported (a follower's answer).
func TestStatusSilentMembers(t *testing.T) {
	f := newFakeAPI(t)
	ms := func(v int64) *int64 { return &v }
	f.cluster.Members[0].SilentMS = ms(999)
	f.cluster.Members[1].SilentMS = ms(3240)
	code, out, errs := runCmd(context.Background(), runStatus, nil, "--addr", f.addr)
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	want := "\nn2: the leader has not heard from it for 3.2s (a member silent for --dead-after is marked dead)\n"
	if !strings.HasSuffix(out, want) || strings.Count(out, "not heard") != 1 {
		t.Errorf("output:\n%s\nwant it to end with:\n%s", out, want)
	}
	code, out, _ = runCmd(context.Background(), runStatus, nil, "--addr", f.addr, "--json")
	if code != 0 || !strings.Contains(out, `"silent_ms":3240`) {
		t.Errorf("--json: exit %d, %s; want silent_ms 3240", code, out)
	}
	f.cluster.Members[1].SilentMS = nil
	if _, out, _ = runCmd(context.Background(), runStatus, nil, "--addr", f.addr); strings.Contains(out, "not heard") {
		t.Errorf("no silence reported, output:\n%s", out)
	}
}
