package proc

import (
	"os"
	"runtime"
	"testing"
)

// SchedOfPID counts this process's own read and write syscalls and the
// context switches of its threads: a thread that blocks in a read is
// switched out, and each write is one more syscall.
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
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // blocking reads on one thread: it sleeps in the kernel
		defer runtime.UnlockOSThread()
		buf := make([]byte, 1)
		for range n {
			if _, err := r.Read(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range n {
		if _, err := w.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after, err := SchedOfPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if d.ReadWrites < n {
		t.Errorf("%d read/write syscalls counted for %d writes", d.ReadWrites, n)
	}
	if d.Switches < 1 {
		t.Errorf("%d context switches counted while a thread blocked in read", d.Switches)
	}
	if _, err := SchedOfPID(-1); err == nil {
		t.Error("SchedOfPID(-1) succeeded")
	}
}

func TestFieldNamesAMissingLine(t *testing.T) {
	if v, err := field([]byte("syscr: 12\nsyscw: 7\n"), "syscw:"); err != nil || v != 7 {
		t.Fatalf("field = %d, %v; want 7", v, err)
	}
	if _, err := field([]byte("syscr: 12\n"), "syscw:"); err == nil {
		t.Fatal("a missing line gave no error")
	}
	if _, err := field([]byte("syscw: x\n"), "syscw:"); err == nil {
		t.Fatal("a bad number gave no error")
	}
}
