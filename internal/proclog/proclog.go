// Package proclog routes the process-wide loggers of libraries that
// ringlimit links through a slog.Handler, so that the lines they write
// are the running command's own (slog JSON on stderr):
//
//   - gRPC's grpclog (grpclog.SetLoggerV2). gRPC's INFO is chatty (a
//     line for every server created, every transport closed): it is
//     slog's Debug; WARNING is Warn; ERROR and FATAL are Error (gRPC
//     exits after a FATAL itself). V(l), which gRPC asks before its
//     verbose lines, is true for l up to Install's verbosity when Debug
//     is logged. Lines carry "module": "grpc" and, from a gRPC component
//     ("[core] ..."), "component": "core". GRPC_GO_LOG_SEVERITY_LEVEL no
//     longer applies: the handler's level decides.
//   - The standard library's default logger (log.Printf), at Warn with
//     "module": "log". In ringlimit's dependencies its one user is
//     go.etcd.io/bbolt v1.3.5, the store of hashicorp/raft-boltdb/v2:
//     "bolt.Close(): funlock error: ..." when unlocking the file fails
//     at Close; a library that writes there unasked is reporting a
//     problem.
//
// Both are process-wide settings that their libraries read without
// synchronisation (grpclog.SetLoggerV2 is to be "called before any gRPC
// functions"), so Install sets them once, at process start, to a Sink;
// the command points the Sink at its handler when it has one (Use, after
// its flags are parsed), which is safe at any time. Until then a Sink
// writes through the fallback it was made with.
package proclog

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/grpclog"
)

// A Sink is where the loggers Install sets write: a handler that may be
// swapped while they do. Safe for concurrent use.
type Sink struct {
	h atomic.Pointer[slog.Handler]
}

// NewSink returns a Sink writing through fallback until Use.
func NewSink(fallback slog.Handler) *Sink {
	s := &Sink{}
	s.Use(fallback)
	return s
}

// Use makes the Sink write through h from now on.
func (s *Sink) Use(h slog.Handler) { s.h.Store(&h) }

func (s *Sink) handler() slog.Handler { return *s.h.Load() }

// log writes one line at level with the attrs given, if h logs level.
func (s *Sink) log(level slog.Level, msg string, attrs ...slog.Attr) {
	h := s.handler()
	if !h.Enabled(context.Background(), level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	_ = h.Handle(context.Background(), r)
}

// Install sets gRPC's logger and the standard library's default logger
// to write through s, gRPC's verbose lines up to verbosity (gRPC's
// GRPC_GO_LOG_VERBOSITY_LEVEL; 0: none). Call it once, at process start,
// before anything uses gRPC or logs.
func Install(s *Sink, verbosity int) {
	grpclog.SetLoggerV2(&grpcLogger{s: s, verbosity: verbosity})
	log.SetFlags(0)
	log.SetPrefix("")
	log.SetOutput(stdWriter{s})
}

// stdWriter is the output of the standard library's default logger: each
// write is one line.
type stdWriter struct{ s *Sink }

func (w stdWriter) Write(p []byte) (int, error) {
	w.s.log(slog.LevelWarn, strings.TrimRight(string(p), "\n"), slog.String("module", "log"))
	return len(p), nil
}

// grpcLogger is grpclog's LoggerV2 (and DepthLoggerV2, which gRPC's
// components use) over a Sink.
type grpcLogger struct {
	s         *Sink
	verbosity int
}

var _ grpclog.DepthLoggerV2 = (*grpcLogger)(nil)

// line writes msg at level; component is the gRPC component's name, if
// any.
func (g *grpcLogger) line(level slog.Level, component, msg string) {
	attrs := []slog.Attr{slog.String("module", "grpc")}
	if component != "" {
		attrs = append(attrs, slog.String("component", component))
	}
	g.s.log(level, msg, attrs...)
}

// depth writes a line of a Depth method, whose args are fmt.Println's:
// a component's lines start with an arg "[name]".
func (g *grpcLogger) depth(level slog.Level, args []any) {
	component := ""
	if len(args) > 0 {
		if c, ok := args[0].(string); ok && len(c) > 2 && c[0] == '[' && c[len(c)-1] == ']' && !strings.ContainsAny(c, " \t") {
			component, args = c[1:len(c)-1], args[1:]
		}
	}
	g.line(level, component, sprintln(args))
}

func sprintln(args []any) string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }

func (g *grpcLogger) Info(args ...any)   { g.line(slog.LevelDebug, "", fmt.Sprint(args...)) }
func (g *grpcLogger) Infoln(args ...any) { g.line(slog.LevelDebug, "", sprintln(args)) }
func (g *grpcLogger) Infof(format string, args ...any) {
	g.line(slog.LevelDebug, "", fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Warning(args ...any)   { g.line(slog.LevelWarn, "", fmt.Sprint(args...)) }
func (g *grpcLogger) Warningln(args ...any) { g.line(slog.LevelWarn, "", sprintln(args)) }
func (g *grpcLogger) Warningf(format string, args ...any) {
	g.line(slog.LevelWarn, "", fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Error(args ...any)   { g.line(slog.LevelError, "", fmt.Sprint(args...)) }
func (g *grpcLogger) Errorln(args ...any) { g.line(slog.LevelError, "", sprintln(args)) }
func (g *grpcLogger) Errorf(format string, args ...any) {
	g.line(slog.LevelError, "", fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Fatal(args ...any)   { g.line(slog.LevelError, "", fmt.Sprint(args...)) }
func (g *grpcLogger) Fatalln(args ...any) { g.line(slog.LevelError, "", sprintln(args)) }
func (g *grpcLogger) Fatalf(format string, args ...any) {
	g.line(slog.LevelError, "", fmt.Sprintf(format, args...))
}

func (g *grpcLogger) InfoDepth(_ int, args ...any)    { g.depth(slog.LevelDebug, args) }
func (g *grpcLogger) WarningDepth(_ int, args ...any) { g.depth(slog.LevelWarn, args) }
func (g *grpcLogger) ErrorDepth(_ int, args ...any)   { g.depth(slog.LevelError, args) }
func (g *grpcLogger) FatalDepth(_ int, args ...any)   { g.depth(slog.LevelError, args) }

// V reports whether gRPC's verbose lines of level l are logged: l is at
// most the verbosity and Debug (gRPC's INFO) is logged.
func (g *grpcLogger) V(l int) bool {
	return l <= g.verbosity && g.s.handler().Enabled(context.Background(), slog.LevelDebug)
}
