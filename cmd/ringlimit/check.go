package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
)

// Exit codes of the CLI subcommands (check uses all three).
const (
	exitOK     = 0
	exitDenied = 1
	exitError  = 2
	// exitNoLeader: status printed the cluster, which has no leader.
	exitNoLeader = 1
)

// defaultAddr is the HTTP address of `ringlimit serve` with no flags.
const defaultAddr = "127.0.0.1:8080"

// runCheck is `ringlimit check`: one check against --addr. It exits 0 when
// allowed, 1 when denied, 2 on any error.
func runCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", stderr)
	addr := fs.String("addr", defaultAddr, "HTTP address of any member (host:port or URL)")
	rule := fs.String("rule", "", "rule name (required)")
	key := fs.String("key", "", "key to check (required)")
	cost := fs.Int64("cost", 1, "units to spend; 0 only asks whether a check of 1 would pass")
	asJSON := fs.Bool("json", false, "print the decision object as the API returns it")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	if *rule == "" || *key == "" {
		return fail(stderr, "check", errors.New("--rule and --key are required"))
	}
	if *cost < 0 {
		return fail(stderr, "check", fmt.Errorf("--cost %d: must be ≥ 0", *cost))
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()

	c := client.New(baseURL(*addr))
	defer c.CloseIdleConnections()
	d, err := c.Check(ctx, *rule, *key, *cost)
	if err != nil {
		return fail(stderr, "check", err)
	}
	if *asJSON {
		if err := writeJSON(stdout, d); err != nil {
			return fail(stderr, "check", err)
		}
	} else {
		fmt.Fprintln(stdout, formatDecision(d))
	}
	if !d.Allowed {
		return exitDenied
	}
	return exitOK
}

// formatDecision is the one-line human form of a decision:
//
//	allowed  remaining=199 limit=200 reset_after=10ms
//	denied   retry_after=100ms remaining=0 limit=200 reset_after=1s degraded
func formatDecision(d api.Decision) string {
	var b strings.Builder
	if d.Allowed {
		b.WriteString("allowed ")
	} else {
		fmt.Fprintf(&b, "denied   retry_after=%v", ms(d.RetryAfterMs))
	}
	fmt.Fprintf(&b, " remaining=%d limit=%d reset_after=%v", d.Remaining, d.Limit, ms(d.ResetAfterMs))
	if d.DelayMs > 0 {
		fmt.Fprintf(&b, " delay=%v", ms(d.DelayMs))
	}
	if d.Degraded {
		b.WriteString(" degraded")
	}
	return b.String()
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// parseOrExit parses the flags with the environment fallback. When it
// returns ok false the command must exit with code: 0 after -h, 2 after a
// flag error (already reported on the flag set's output).
func parseOrExit(fs *flag.FlagSet, args []string, getenv func(string) string) (code int, ok bool) {
	out := &countingWriter{w: fs.Output()}
	fs.SetOutput(out)
	err := parseFlags(fs, args, getenv)
	fs.SetOutput(out.w)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return exitOK, false
	default:
		// fs.Parse reports its own errors; the ones parseFlags adds (a
		// stray argument, a bad environment value) are not yet reported.
		if out.n == 0 {
			fmt.Fprintf(out.w, "%s: %v\n", fs.Name(), err)
		}
		return exitError, false
	}
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}

// fail reports err on stderr as "ringlimit <cmd>: err" and returns exitError.
func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "ringlimit %s: %v\n", cmd, err)
	return exitError
}

// withTimeout bounds ctx by d; d ≤ 0 means no bound.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
