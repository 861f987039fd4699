package proc

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FreePorts returns distinct ports, each of which can be bound at once,
// and never one that is in use.
func TestFreePorts(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	inUse := held.Addr().(*net.TCPAddr).Port

	ports, err := FreePorts(9) // three ringlimit members' worth
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 9 {
		t.Fatalf("FreePorts(9) = %v, want 9 ports", ports)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || p > 65535 || seen[p] || p == inUse {
			t.Fatalf("FreePorts(9) = %v: %d is out of range, repeated or in use (%d)", ports, p, inUse)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d from FreePorts is not free: %v", p, err)
		}
		ln.Close()
	}
	if ports, err := FreePorts(0); err != nil || len(ports) != 0 {
		t.Fatalf("FreePorts(0) = %v, %v; want none", ports, err)
	}
}

// A server that exits before it is up (its port was taken) fails the wait
// at once, with its log, instead of the wait asking whatever else listens
// on that port.
func TestWaitUpFailsWhenTheServerExits(t *testing.T) {
	dir := t.TempDir()
	p, err := Start(dir, "taken", "/bin/sh", []string{"-c", "echo 'bind: address already in use' >&2; exit 1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done() // exited: WaitUp must not need its own time to see it
	asked := false
	start := time.Now()
	err = WaitUp(context.Background(), p, "taken up", time.Minute, func() bool { asked = true; return true })
	if err == nil || asked {
		t.Fatalf("WaitUp = %v (ok asked: %v), want the exit, without asking", err, asked)
	}
	for _, want := range []string{"taken exited", "address already in use", filepath.Join(dir, "taken.log")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("WaitUp error %q does not say %q", err, want)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("WaitUp took %v, want at once", took)
	}
}
