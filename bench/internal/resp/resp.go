// Package resp is the small Redis client the benchmark commands share:
// RESP commands appended by hand and pipelined, replies read one by one,
// one connection per load worker, and a redis-server started on a
// loopback port for one run.
package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ringlimit/ringlimit/bench/internal/proc"
)

// Conn is one RESP connection. Commands are gathered with AppendCmd and
// written together by Flush; their replies are then read with Reply, in
// order.
type Conn struct {
	c net.Conn
	r *bufio.Reader
	w []byte
}

// Dial connects to the Redis server at addr (host:port).
func Dial(ctx context.Context, addr string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

// Close closes the connection.
func (rc *Conn) Close() error { return rc.c.Close() }

// AppendCmd appends one command (its arguments as bulk strings) to what
// the next Flush writes.
func (rc *Conn) AppendCmd(args ...string) {
	rc.w = append(rc.w, '*')
	rc.w = strconv.AppendInt(rc.w, int64(len(args)), 10)
	rc.w = append(rc.w, "\r\n"...)
	for _, a := range args {
		rc.w = append(rc.w, '$')
		rc.w = strconv.AppendInt(rc.w, int64(len(a)), 10)
		rc.w = append(rc.w, "\r\n"...)
		rc.w = append(rc.w, a...)
		rc.w = append(rc.w, "\r\n"...)
	}
}

// Flush writes the commands appended since the last Flush in one write;
// deadline bounds it and the replies read after it.
func (rc *Conn) Flush(deadline time.Time) error {
	_ = rc.c.SetDeadline(deadline)
	_, err := rc.c.Write(rc.w)
	rc.w = rc.w[:0]
	return err
}

// Reply reads one reply: an integer, a status or bulk string (its text),
// or an error.
func (rc *Conn) Reply() (int64, string, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return 0, "", err
	}
	if len(line) < 3 {
		return 0, "", fmt.Errorf("redis: short reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case ':':
		n, err := strconv.ParseInt(body, 10, 64)
		return n, "", err
	case '+':
		return 0, body, nil
	case '-':
		return 0, "", errors.New("redis: " + body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return 0, "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return 0, "", err
		}
		return 0, string(buf[:n]), nil
	}
	return 0, "", fmt.Errorf("redis: unexpected reply %q", line)
}

// Do sends one command and reads its reply; ctx's deadline (else 10 s)
// bounds both.
func (rc *Conn) Do(ctx context.Context, args ...string) (int64, string, error) {
	rc.AppendCmd(args...)
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	if err := rc.Flush(dl); err != nil {
		return 0, "", err
	}
	return rc.Reply()
}

// Pool holds idle connections to one server, one per load worker in
// effect.
type Pool struct {
	addr  string
	conns chan *Conn
}

// NewPool returns a pool of connections to addr that keeps up to n idle.
func NewPool(addr string, n int) *Pool {
	return &Pool{addr: addr, conns: make(chan *Conn, n)}
}

// Get returns an idle connection, or dials a new one.
func (p *Pool) Get(ctx context.Context) (*Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	default:
		return Dial(ctx, p.addr)
	}
}

// Put gives back a connection whose replies were all read; one beyond
// the pool's room is closed.
func (p *Pool) Put(c *Conn) {
	select {
	case p.conns <- c:
	default:
		c.Close()
	}
}

// Close closes the idle connections.
func (p *Pool) Close() {
	for {
		select {
		case c := <-p.conns:
			c.Close()
		default:
			return
		}
	}
}

// Pipeline sends the commands cmds appends, together, on a connection of
// p, and hands each of their n replies to reply in order; ctx's deadline
// (else 10 s) bounds the round trip. A connection that failed is closed,
// not given back; the error is CtxErr's.
func (p *Pool) Pipeline(ctx context.Context, cmds func(*Conn), n int, reply func(i int, n int64, s string)) error {
	rc, err := p.Get(ctx)
	if err != nil {
		return err
	}
	cmds(rc)
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	if err := rc.Flush(dl); err != nil {
		rc.Close()
		return CtxErr(ctx, err)
	}
	for i := range n {
		v, s, err := rc.Reply()
		if err != nil {
			rc.Close()
			return CtxErr(ctx, err)
		}
		reply(i, v, s)
	}
	p.Put(rc)
	return nil
}

// CtxErr is ctx's deadline error when err is a socket timeout at or past
// ctx's deadline (the end of a run, not a failure of the server).
func CtxErr(ctx context.Context, err error) error {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Start starts bin (a redis-server) without persistence on a free
// loopback port, its log and working directory under work, and waits
// until it answers PING; it returns the process, its address and a
// connection to it. The caller stops the process.
func Start(ctx context.Context, work, bin string) (*proc.Proc, string, *Conn, error) {
	ports, err := proc.FreePorts(1)
	if err != nil {
		return nil, "", nil, err
	}
	name := fmt.Sprintf("redis-%d", ports[0])
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", nil, err
	}
	p, err := proc.Start(work, name, bin, []string{"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no"}, nil)
	if err != nil {
		return nil, "", nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	var rc *Conn
	err = proc.WaitUp(ctx, p, "redis up", 30*time.Second, func() bool {
		c, err := Dial(ctx, addr)
		if err != nil {
			return false
		}
		if _, s, err := c.Do(ctx, "PING"); err != nil || s != "PONG" {
			c.Close()
			return false
		}
		rc = c
		return true
	})
	if err != nil {
		p.Stop(5 * time.Second)
		return nil, "", nil, err
	}
	return p, addr, rc, nil
}
