package main

import (
	"context"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

func TestLeaveDefaultID(t *testing.T) {
	f := newFakeAPI(t)
	// --addr as a URL with a trailing slash still names the member whose
	// http is host:port (n2 in the fake).
	code, out, errs := runCmd(context.Background(), runLeave, nil, "--addr", f.srv.URL+"/")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if got := f.left(); len(got) != 1 || got[0] != "n2" {
		t.Errorf("leave requests for %q, want [n2]", got)
	}
	if !strings.Contains(out, "n2") {
		t.Errorf("stdout %q does not name n2", out)
	}
}

func TestLeaveExplicitIDAndToken(t *testing.T) {
	f := newFakeAPI(t)
	f.token = "s3cret"
	env := map[string]string{"RINGLIMIT_ADDR": f.addr, "RINGLIMIT_ADMIN_TOKEN": "s3cret"}
	code, _, errs := runCmd(context.Background(), runLeave, env, "--id", "n1")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, errs)
	}
	if got := f.left(); len(got) != 1 || got[0] != "n1" {
		t.Errorf("leave requests for %q, want [n1]", got)
	}
	if n := f.clusterGets.Load(); n != 0 {
		t.Errorf("with --id, leave read /v1/cluster %d times, want 0", n)
	}

	// The wrong token: the server's 401 becomes exit 2 and a message.
	code, _, errs = runCmd(context.Background(), runLeave, env, "--id", "n1", "--admin-token", "wrong")
	if code != 2 || !strings.Contains(errs, "unauthorized (401)") || !strings.Contains(errs, `member "n1"`) {
		t.Errorf("wrong token: exit %d, stderr %q", code, errs)
	}
}

func TestLeaveNoMatchingMember(t *testing.T) {
	f := newFakeAPI(t)
	f.cluster.Members = f.cluster.Members[:1] // only n1, at another address
	code, _, errs := runCmd(context.Background(), runLeave, nil, "--addr", f.addr)
	if code != 2 || !strings.Contains(errs, "no member has HTTP address "+f.addr) || !strings.Contains(errs, "n1=10.0.0.1:8080") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
	if len(f.left()) != 0 {
		t.Errorf("leave sent for %q without a matching member", f.left())
	}
}

func TestMemberAt(t *testing.T) {
	cl := api.Cluster{Members: []api.Member{
		{ID: "a", HTTP: "h1:1"}, {ID: "b", HTTP: "h2:2"}, {ID: "c", HTTP: "h2:2"},
	}}
	for _, tc := range []struct {
		cl      api.Cluster
		addr    string
		want    string
		wantErr string
	}{
		{cl, "h1:1", "a", ""},
		{cl, "h3:3", "", "no member has HTTP address h3:3"},
		{cl, "h2:2", "", "members b, c all have"},
		{api.Cluster{}, "h1:1", "", "no members"},
	} {
		got, err := memberAt(tc.cl, tc.addr)
		if got != tc.want || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("memberAt(%s) = %q, %v; want %q, %q", tc.addr, got, err, tc.want, tc.wantErr)
		}
	}
}
