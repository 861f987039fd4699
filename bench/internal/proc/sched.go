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
	// ReadWrites is the read and write system calls (read, readv, pread
	// and their write twins, as Go's net package and Redis make on a
	// socket), from /proc/PID/io syscr + syscw. Socket calls of their own
	// (recvmsg, sendto, ...) and epoll waits are not counted.
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
	rw, err := fields(io, "syscr:", "syscw:")
	if err != nil {
		return s, fmt.Errorf("%s/io: %w", dir, err)
	}
	s.ReadWrites = rw[0] + rw[1]
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
		vn, err := fields(st, "voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")
		if err != nil {
			return s, fmt.Errorf("%s/task/%s/status: %w", dir, t.Name(), err)
		}
		s.Switches += vn[0] + vn[1]
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

// fields returns the integers after the line prefixes names, in their
// order, from one pass over a /proc file of "name: value" lines.
func fields(b []byte, names ...string) ([]int64, error) {
	vs := make([]int64, len(names))
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() && found < len(names) {
		for i, name := range names {
			v, ok := bytes.CutPrefix(sc.Bytes(), []byte(name))
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s %w", name, err)
			}
			vs[i] = n
			found++
			break
		}
	}
	if found < len(names) {
		return nil, fmt.Errorf("not every one of %q is there", names)
	}
	return vs, nil
}
