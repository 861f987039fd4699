package proc

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

// SchedOfPID counts this process's own read and write syscalls and the
// context switches of its threads: each write and read of a pipe is a
// syscall, and a thread that sleeps in the kernel is switched out (a
// nanosleep is the one blocking call whose outcome does not depend on
// another thread's timing: a blocked read may find its data already
// there and never sleep).
func TestSchedCountsSyscallsAndSwitches(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before, err := SchedOfPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	buf := make([]byte, 1)
	for range n { // a pipe holds 50 bytes: nothing here blocks
		if _, err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if err := syscall.Nanosleep(&syscall.Timespec{Nsec: 1000}, nil); err != nil && err != syscall.EINTR {
			t.Fatal(err)
		}
	}
	after, err := SchedOfPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if d.ReadWrites < 2*n {
		t.Errorf("%d read/write syscalls counted for %d writes and %d reads", d.ReadWrites, n, n)
	}
	if d.Switches < n {
		t.Errorf("%d context switches counted for %d sleeps in the kernel", d.Switches, n)
	}
	if _, err := SchedOfPID(-1); err == nil {
		t.Error("SchedOfPID(-1) succeeded")
	}
}

func TestFieldsNamesAMissingLine(t *testing.T) {
	if v, err := fields([]byte("syscr: 12\nsyscw: 7\n"), "syscw:", "syscr:"); err != nil || len(v) != 2 || v[0] != 7 || v[1] != 12 {
		t.Fatalf("fields = %v, %v; want [7 12]", v, err)
	}
	if _, err := fields([]byte("syscr: 12\n"), "syscr:", "syscw:"); err == nil {
		t.Fatal("a missing line gave no error")
	}
	if _, err := fields([]byte("syscw: x\n"), "syscw:"); err == nil {
		t.Fatal("a bad number gave no error")
	}
}
