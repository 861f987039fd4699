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
	waitFor(t, "the member restarted without --id ready, or exited", func() bool {
		return again.exited() || get(again.http, "/readyz", nil) == 200
	})
	if again.exited() {
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
// the file (exit 2): the dir is not taken for a new member's.
func TestServeRefusesABadMemberIDFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "member-id"), []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := launchServe(t, "", dir)
	waitFor(t, "serve to exit", p.exited)
	var ee *exec.ExitError
	if !errors.As(p.exitErr, &ee) || ee.ExitCode() != 2 {
		t.Errorf("exit %v, want exit status 2; log:\n%s", p.exitErr, lastLines(p.log.String(), 5))
	}
	if !strings.Contains(p.log.String(), "member-id: not a member id") {
		t.Errorf("log does not name the file:\n%s", lastLines(p.log.String(), 5))
	}
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
