package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

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
	if n := f.clusterGets.Load(); n > 1 {
		t.Errorf("with --id, leave read /v1/cluster %d times, want at most once (to know whom else to ask)", n)
	}

	// The wrong token: the server's 401 becomes exit 2 and a message.
	code, _, errs = runCmd(context.Background(), runLeave, env, "--id", "n1", "--admin-token", "wrong")
	if code != 2 || !strings.Contains(errs, "unauthorized (401)") || !strings.Contains(errs, `member "n1"`) {
		t.Errorf("wrong token: exit %d, stderr %q", code, errs)
	}
}

// A leave answered 503 (no leader) is asked again until it is answered;
// a 404 after a 503 means an earlier attempt removed the member. A 404
// on the first attempt, and a 503 that lasts past --timeout, are errors.
func TestLeaveRetriesWhileNoLeader(t *testing.T) {
	leaveRetry, leaveRetryMax = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { leaveRetry, leaveRetryMax = 250*time.Millisecond, 4*time.Second })
	for _, tc := range []struct {
		name    string
		answers []int
		code    int
		sent    int
		stderr  string
	}{
		{"answered after two 503s", []int{503, 503, 200}, 0, 3, "asking again"},
		{"gone after a 503", []int{503, 404}, 0, 2, "asking again"},
		{"unknown at once", []int{404}, 2, 1, "not_found (404)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.leaveAnswers = tc.answers
			code, out, errs := runCmd(context.Background(), runLeave, nil, "--addr", f.addr, "--id", "n1")
			if code != tc.code || len(f.left()) != tc.sent || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("exit %d after %d requests, stderr %q; want exit %d after %d, stderr with %q", code, len(f.left()), errs, tc.code, tc.sent, tc.stderr)
			}
			if tc.code == 0 && !strings.Contains(out, "member n1 left") {
				t.Errorf("stdout %q", out)
			}
		})
	}
	f := newFakeAPI(t)
	f.leaveAnswers = slices.Repeat([]int{503}, 1000)
	code, _, errs := runCmd(context.Background(), runLeave, nil, "--addr", f.addr, "--id", "n1", "--timeout", "500ms")
	if code != 2 || !strings.Contains(errs, "gave up") || !strings.Contains(errs, "no leader") {
		t.Fatalf("503 past --timeout: exit %d, stderr %q", code, errs)
	}
}

// RINGLIMIT_ID is a member's own id in its container or pod (serve
// --id): `docker exec n2 ringlimit leave --addr n3:8080` removed n2. It
// never names the member to remove; when it names another member than
// the one at --addr, the leave stops before anything is sent.
func TestLeaveIDNotFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		left   []string
		stderr string
	}{
		{"env names another member", map[string]string{"RINGLIMIT_ID": "n1"}, nil, 2, nil,
			"the member at ADDR is n2, but RINGLIMIT_ID=n1 (a member's container sets it to its own id): leave does not read it; give --id n2"},
		{"env names the member at --addr", map[string]string{"RINGLIMIT_ID": "n2"}, nil, 0, []string{"n2"}, ""},
		{"--id given", map[string]string{"RINGLIMIT_ID": "n2"}, []string{"--id", "n1"}, 0, []string{"n1"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			code, _, errs := runCmd(context.Background(), runLeave, tc.env, append([]string{"--addr", f.addr}, tc.args...)...)
			want := strings.ReplaceAll(tc.stderr, "ADDR", f.addr)
			if code != tc.code || !slices.Equal(f.left(), tc.left) || !strings.Contains(errs, want) {
				t.Errorf("leave %q with %v: exit %d, removed %q, stderr %q; want exit %d, removed %q, stderr with %q",
					tc.args, tc.env, code, f.left(), errs, tc.code, tc.left, want)
			}
		})
	}
	// The flag's help says so too.
	var help strings.Builder
	runLeave(context.Background(), []string{"-h"}, envOf(nil), &help, &help)
	if !strings.Contains(help.String(), "RINGLIMIT_ID is not read") {
		t.Errorf("leave -h does not say RINGLIMIT_ID is not read:\n%s", help.String())
	}
}

// An --addr that answers GET /v1/cluster with something other than the
// API's JSON (a 404 page) is named as not a member.
func TestStatusAndLeaveOfANonMember(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	for _, cmd := range []struct {
		name string
		fn   func(context.Context, []string, func(string) string, io.Writer, io.Writer) int
	}{{"status", runStatus}, {"leave", runLeave}} {
		code, out, errs := runCmd(context.Background(), cmd.fn, nil, "--addr", srv.URL)
		if code != 2 || out != "" || !strings.Contains(errs, "http_404 (404)") || !strings.Contains(errs, "--addr must be a member's HTTP address") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", cmd.name, code, out, errs)
		}
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

// The member at --addr, relaying the leave of another member, is stopped
// meanwhile: it answers 503 (its relay cut short at its drain), is asked
// again as a member that is not leaving is, no longer answers, and
// another member says how the leave ended (404: removed). Was: it was the
// only one asked, and the leave exited 2 on a removal that succeeded (a
// review).
func TestLeaveThroughAMemberThatStopsMeanwhile(t *testing.T) {
	leaveRetry, leaveRetryMax = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { leaveRetry, leaveRetryMax = 250*time.Millisecond, 4*time.Second })
	asked, other := newFakeAPI(t), newFakeAPI(t)
	asked.cluster.Members = append(asked.cluster.Members, api.Member{ID: "n3", State: "active", HTTP: other.addr})
	asked.leaveAnswers, asked.leaveGone = []int{503}, 1
	other.leaveAnswers = []int{404}
	code, out, errs := runCmd(context.Background(), runLeave, nil, "--addr", asked.addr, "--id", "n1")
	if code != 0 || !strings.Contains(out, "member n1 left") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want n1 left, said by another member", code, out, errs)
	}
	if got := other.left(); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("the other member was asked to remove %q, want [n1]", got)
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
		{cl, "H1.:1", "a", ""},
		{api.Cluster{Members: []api.Member{{ID: "a", HTTP: "127.0.0.1:8080"}, {ID: "b", HTTP: "127.0.0.2:8080"}}}, "localhost:8080", "a", ""},
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

// The member at --addr, asked to leave, answers 503 (its relay to the
// leader cut short as it stops, or no leader yet) and then stops (it left
// and exited): the leave is asked of another member at once, whose 404
// says it is done. Was: the member leaving was asked again, and a
// successful leave printed "context canceled; asking again" and
// "connection refused; asking another member" (a real-process audit).
func TestLeaveOfTheMemberAskedEndsThroughAnother(t *testing.T) {
	leaveRetry, leaveRetryMax = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { leaveRetry, leaveRetryMax = 250*time.Millisecond, 4*time.Second })
	leaving, other := newFakeAPI(t), newFakeAPI(t)
	leaving.cluster.Members[0].HTTP = other.addr // n1 is at the other fake
	leaving.leaveAnswers, leaving.leaveGone = []int{503}, 1
	other.leaveAnswers = []int{404}
	code, out, errs := runCmd(context.Background(), runLeave, nil, "--addr", leaving.addr)
	// Not asked again, nor a "connection refused" printed: its 503 is
	// how a member leaving answers as it stops.
	// The line says what goes on first, the 503 after it.
	if code != 0 || !strings.Contains(out, "member n2 left") ||
		!strings.HasPrefix(errs, "ringlimit leave: asking another member how the leave of n2 ends (a member stops as it leaves; n2 answered ") ||
		strings.Contains(errs, "asking again") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want n2 left, asked of another member after the leaving member's 503", code, out, errs)
	}
	if got := leaving.left(); len(got) != 1 {
		t.Fatalf("the member leaving answered %d leave requests, want 1", len(got))
	}
	if got := other.left(); len(got) != 1 || got[0] != "n2" {
		t.Fatalf("the other member was asked to remove %q, want [n2]", got)
	}
}

// The same with --id naming the member at --addr: `ringlimit leave
// --addr <n3's> --id n3` exited 2 on a leave that succeeded (only a leave
// without --id asked the others; a new user's walk through the README).
// With --id naming another member, the member at --addr is the only one
// asked (TestLeaveRetriesWhileNoLeader).
func TestLeaveByIDOfTheMemberAskedEndsThroughAnother(t *testing.T) {
	leaveRetry, leaveRetryMax = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { leaveRetry, leaveRetryMax = 250*time.Millisecond, 4*time.Second })
	leaving, other := newFakeAPI(t), newFakeAPI(t)
	leaving.cluster.Members[0].HTTP = other.addr
	leaving.leaveAnswers, leaving.leaveGone = []int{503}, 1
	other.leaveAnswers = []int{404}
	code, out, errs := runCmd(context.Background(), runLeave, nil, "--addr", leaving.addr, "--id", "n2")
	if code != 0 || !strings.Contains(out, "member n2 left") || strings.Contains(errs, "asking again") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want n2 left, asked of another member after the leaving member's 503", code, out, errs)
	}
	if got := other.left(); len(got) != 1 || got[0] != "n2" {
		t.Fatalf("the other member was asked to remove %q, want [n2]", got)
	}
}
