// Command ringlimit is a distributed rate limiter: a cluster member
// (serve), the stateless routing tier (router, gateway), its clients
// (check, status, leave, bench) and a test-certificate maker (certs).
// See README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/ringlimit/ringlimit/internal/proclog"
)

const usage = `ringlimit — a rate limiter cluster with no shared store

usage:
  ringlimit serve   [flags]   run a cluster member (bootstraps a single-node cluster by default)
  ringlimit router  --cluster HOST:PORT,...   a stateless router: follows the ring, forwards each check to its owner
  ringlimit gateway --upstream URL [flags]    reverse proxy that limits before forwarding
  ringlimit check   [--addr HOST:PORT] --rule NAME --key KEY [--cost N] [--json] [--timeout D]
  ringlimit status  [--addr HOST:PORT] [--json] [--timeout D]
  ringlimit leave   [--addr HOST:PORT] [--id ID] [--admin-token T] [--timeout D]
  ringlimit bench   [flags]   load generator: checks/s, latency
  ringlimit certs   [--dir DIR] [--nodes n1,n2,...] [--hosts H,...] [--valid-for D]   a test CA, member certificates and a cluster secret

--addr is 127.0.0.1:8080 by default (serve's with no flags): a host:port or a URL.

Every flag may also come from the environment as RINGLIMIT_<FLAG>, except
leave --id (RINGLIMIT_ID is a member's own id in its container).
Run 'ringlimit <command> -h' for the flags of a command.
`

// logs is where the process-wide loggers of libraries write — gRPC's
// and the standard library's default one, bbolt's (proclog): main
// installs it before anything runs; serve, router and gateway point it
// at their own logger. Until then, and in the short-lived commands, it
// writes slog JSON on stderr at Info.
var logs = proclog.NewSink(slog.NewJSONHandler(os.Stderr, nil))

func main() {
	verbosity, _ := strconv.Atoi(os.Getenv("GRPC_GO_LOG_VERBOSITY_LEVEL")) // as gRPC's own logger
	proclog.Install(logs, verbosity)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, the next one is the system's own: a
		// second Ctrl-C ends a shutdown that takes too long.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest, getenv, stdout, stderr)
	case "router":
		return runRouter(ctx, rest, getenv, stdout, stderr)
	case "gateway":
		return runGateway(ctx, rest, getenv, stdout, stderr)
	case "check":
		return runCheck(ctx, rest, getenv, stdout, stderr)
	case "status":
		return runStatus(ctx, rest, getenv, stdout, stderr)
	case "leave":
		return runLeave(ctx, rest, getenv, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, getenv, stdout, stderr)
	case "certs":
		return runCerts(rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "ringlimit: unknown command %q\n\n%s", cmd, usage)
	return 2
}
