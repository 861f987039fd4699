// Package proc starts and watches the server processes a benchmark
// command runs (ringlimit, gubernatord, redis-server, ...): each on
// loopback ports the kernel reports free (FreePorts), so two runs at once
// do not meet; each waited for by WaitUp, which fails at once when the
// process has exited instead of asking whatever else listens on its port;
// each stopped by its PID, and measured (CPU time, RSS) from /proc.
//
// A Proc is safe for concurrent use; its fields are read-only.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// Proc is a server process this run started; it is stopped by its PID.
type Proc struct {
	Name string
	Log  string // the file its output goes to
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // of Wait, once done is closed
}

// Start starts bin with args and extra environment, its output going to
// dir/name.log. The child gets SIGKILL if this process dies first.
func Start(dir, name, bin string, args, env []string) (*Proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logf.Name(), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitFor polls ok every 50ms until it holds, ctx ends or limit passes.
func WaitFor(ctx context.Context, what string, limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		if ok() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitUp polls ok as WaitFor does, but fails at once when p has exited
// (a server whose port was taken meanwhile exits): ok would otherwise be
// answered by whatever else listens on that port.
func WaitUp(ctx context.Context, p *Proc, what string, limit time.Duration, ok func() bool) error {
	var exited error
	err := WaitFor(ctx, what, limit, func() bool {
		if p.Exited() {
			exited = p.exitError()
			return true
		}
		return ok()
	})
	return errors.Join(err, exited)
}

// exitError says that p exited, how, and what its log ends with.
func (p *Proc) exitError() error {
	b, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	lines = lines[max(0, len(lines)-5):]
	return fmt.Errorf("%s exited (%v); the end of %s:\n%s", p.Name, p.err, p.Log, strings.Join(lines, "\n"))
}

// FreePorts returns n distinct loopback TCP ports the kernel says are
// free now: it listens on 127.0.0.1:0 n times (all open at once, so the
// ports differ) and closes the listeners. Runs at the same time get
// different ports. A port taken by another process before our server
// binds it makes that server exit, which WaitUp reports.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("choosing a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Stop sends SIGTERM, and SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StopAll stops procs by PID, in reverse order of start.
func StopAll(procs []*Proc) {
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(5 * time.Second)
	}
}

// CPU is the process's user + system CPU time so far, from /proc/PID/stat.
func (p *Proc) CPU() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields are counted
	// after its closing parenthesis, where field 3 (state) comes first.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/PID/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/PID/stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// RSS is the process's resident set size in bytes, from /proc/PID/statm.
func (p *Proc) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", p.PID()))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, errors.New("short /proc/PID/statm")
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// CPUOf sums the CPU time of procs.
func CPUOf(procs []*Proc) (time.Duration, error) {
	var sum time.Duration
	for _, p := range procs {
		c, err := p.CPU()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p.Name, err)
		}
		sum += c
	}
	return sum, nil
}
