package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Sched counts what a process asked of the kernel's scheduler and I/O
// paths: how often its threads were switched out and how many read and
// write system calls it made. A check that costs a context switch or a
// syscall costs microseconds on a virtual machine whatever the user
// code does: these explain server CPU per check that a profile of the
// process's own code does not.
type Sched struct {
	// Switches is voluntary + nonvoluntary context switches, summed over
	// the process's live threads (a thread that exited takes its count
	// with it; Go and Redis keep theirs).
	Switches int64
	// ReadWrites is the read-like and write-like system calls (read,
	// write, recvfrom, sendto, ...), from /proc/PID/io syscr + syscw.
	ReadWrites int64
}

// Sub returns s − t.
func (s Sched) Sub(t Sched) Sched {
	return Sched{Switches: s.Switches - t.Switches, ReadWrites: s.ReadWrites - t.ReadWrites}
}

// SchedOfPID reads pid's Sched from /proc.
func SchedOfPID(pid int) (Sched, error) {
	var s Sched
	dir := fmt.Sprintf("/proc/%d", pid)
	io, err := os.ReadFile(filepath.Join(dir, "io"))
	if err != nil {
		return s, err
	}
	r, err1 := field(io, "syscr:")
	w, err2 := field(io, "syscw:")
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("%s/io: %w", dir, err)
	}
	s.ReadWrites = r + w
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		st, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "status"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			return s, err
		}
		v, err1 := field(st, "voluntary_ctxt_switches:")
		n, err2 := field(st, "nonvoluntary_ctxt_switches:")
		if err := errors.Join(err1, err2); err != nil {
			return s, fmt.Errorf("%s/task/%s/status: %w", dir, t.Name(), err)
		}
		s.Switches += v + n
	}
	return s, nil
}

// Sched reads p's Sched.
func (p *Proc) Sched() (Sched, error) { return SchedOfPID(p.PID()) }

// SchedOf sums the Sched of procs.
func SchedOf(procs []*Proc) (Sched, error) {
	var sum Sched
	for _, p := range procs {
		s, err := p.Sched()
		if err != nil {
			return Sched{}, fmt.Errorf("%s: %w", p.Name, err)
		}
		sum.Switches += s.Switches
		sum.ReadWrites += s.ReadWrites
	}
	return sum, nil
}

// field returns the integer after the line prefix name in a /proc file
// of "name: value" lines.
func field(b []byte, name string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte(name)); ok {
			return strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %q line", name)
}
