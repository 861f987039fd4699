package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// A member started without --id over a data dir of its own comes back
// as the member it was, not as the host name: a container recreated over
// its volume has a new host name. Was: its start was refused (exit 1),
// the dir holding the Raft state of a cluster that never had a member of
// the host name's id (an audit: the Compose stand-in upstream, the image's
// own command, crash-looped after a recreate).
func TestServeWithoutIDTakesTheDataDirsID(t *testing.T) {
	dir := t.TempDir()
	first := startServe(t, "n-recorded", dir)
	first.stop(t)

	again := launchServe(t, "", dir)
	if again.readyOrExited(t) {
		t.Fatalf("restarted without --id over n-recorded's data dir, it exited (%v):\n%s", again.exitErr, lastLines(again.log.String(), 5))
	}
	var c api.Cluster
	if code := get(again.http, "/v1/cluster", &c); code != 200 || len(c.Members) != 1 || c.Members[0].ID != "n-recorded" || c.Leader != "n-recorded" {
		t.Fatalf("restarted without --id over n-recorded's data dir: /v1/cluster %d, %+v; want n-recorded leading, alone", code, c)
	}
	if rec, err := os.ReadFile(filepath.Join(dir, "member-id")); err != nil || string(rec) != "n-recorded\n" {
		t.Errorf("member-id: %q, %v", rec, err)
	}
}

// A member-id that is not an id stops serve without --id at once, naming
// the file (exit 1, as every refused data dir): the dir is not taken for
// a new member's.
func TestServeRefusesABadMemberIDFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "member-id"), []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := launchServe(t, "", dir)
	waitFor(t, "serve to exit", p.exited)
	var ee *exec.ExitError
	if !errors.As(p.exitErr, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit %v, want exit status 1; log:\n%s", p.exitErr, lastLines(p.log.String(), 5))
	}
	if !strings.Contains(p.log.String(), "member-id: not a member id") {
		t.Errorf("log does not name the file:\n%s", lastLines(p.log.String(), 5))
	}
}

// A data dir is refused under an --id other than the one it records,
// naming that id, and the record is left as it was: a copied or mixed-up
// volume. Was: taken whenever the log knew the id (an audit: n3's data
// dir started as n2 joined as n2 and shut the real n2 out of the
// cluster), and the record rewritten even by a start then refused.
func TestServeRefusesAnotherMembersDataDir(t *testing.T) {
	dir := t.TempDir()
	a := startServe(t, "n-a", dir)
	b := startServe(t, "n-b", t.TempDir(), "--join", a.http)
	waitFor(t, "n-b listed", func() bool {
		var c api.Cluster
		return get(a.http, "/v1/cluster", &c) == 200 && len(c.Members) == 2
	})
	b.stop(t)
	a.stop(t)

	// n-b is in n-a's log: only the record tells the two dirs apart.
	p := launchServe(t, "n-b", dir)
	p.readyOrExited(t)
	var ee *exec.ExitError
	if !errors.As(p.exitErr, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit %v, want exit status 1; log:\n%s", p.exitErr, lastLines(p.log.String(), 5))
	}
	if !strings.Contains(p.log.String(), `is the data dir of member \"n-a\"`) {
		t.Errorf("the refusal does not name the recorded id:\n%s", lastLines(p.log.String(), 5))
	}
	if rec, err := os.ReadFile(filepath.Join(dir, "member-id")); err != nil || string(rec) != "n-a\n" {
		t.Errorf("member-id after the refused start: %q, %v; want n-a", rec, err)
	}
}

// readyOrExited waits until the process is ready or has exited, and
// reports whether it exited.
func (p *proc) readyOrExited(t *testing.T) bool {
	t.Helper()
	name := p.id
	if name == "" {
		name = "serve without --id"
	}
	waitFor(t, name+" ready, or exited", func() bool { return p.exited() || get(p.http, "/readyz", nil) == 200 })
	return p.exited()
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// A damaged member-id does not keep the member out once --id is given,
// as serve's refusal says: the id given is written over it.
func TestServeWithIDRewritesABadMemberIDFile(t *testing.T) {
	dir := t.TempDir()
	first := startServe(t, "n-fix", dir)
	first.stop(t)
	if err := os.WriteFile(filepath.Join(dir, "member-id"), []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	again := launchServe(t, "n-fix", dir)
	if again.readyOrExited(t) {
		t.Fatalf("--id n-fix over its own dir with a damaged member-id exited (%v):\n%s", again.exitErr, lastLines(again.log.String(), 5))
	}
	if rec, err := os.ReadFile(filepath.Join(dir, "member-id")); err != nil || string(rec) != "n-fix\n" {
		t.Errorf("member-id: %q, %v; want it written again", rec, err)
	}
}
