package proclog

import (
	"errors"
	"log"
	"log/slog"
	"net"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/grpclog"

	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// sink is the Sink of this test process, installed once (Install's
// settings are process-wide).
var sink = NewSink(slog.NewJSONHandler(os.Stderr, nil))

func TestMain(m *testing.M) {
	Install(sink, 1)
	os.Exit(m.Run())
}

// take returns the lines b got since the last take, parsed, without
// their time; it fails the test on one that is not a JSON object.
func take(t *testing.T, b *logbuf.Buffer) []map[string]any {
	t.Helper()
	out := logbuf.Parse(t, b.Take())
	for _, m := range out {
		delete(m, "time")
	}
	return out
}

// use points the process's sink at a JSON handler at level into a
// buffer, for the test's duration.
func use(t *testing.T, level slog.Level) *logbuf.Buffer {
	var buf logbuf.Buffer
	sink.Use(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
	t.Cleanup(func() { sink.Use(slog.NewJSONHandler(os.Stderr, nil)) })
	return &buf
}

func TestGRPCLevels(t *testing.T) {
	core := grpclog.Component("test")
	for _, tc := range []struct {
		handler slog.Level
		log     func()
		want    map[string]any // nil: no line
	}{
		{slog.LevelDebug, func() { grpclog.Infof("dialing %s", "a:1") }, map[string]any{"level": "DEBUG", "msg": "dialing a:1", "module": "grpc"}},
		{slog.LevelInfo, func() { grpclog.Info("chatty") }, nil},
		{slog.LevelInfo, func() { grpclog.Warning("w", 1) }, map[string]any{"level": "WARN", "msg": "w1", "module": "grpc"}},
		{slog.LevelInfo, func() { grpclog.Errorln("e", 1) }, map[string]any{"level": "ERROR", "msg": "e 1", "module": "grpc"}},
		{slog.LevelError, func() { grpclog.Warningf("w") }, nil},
		// A component's lines name it.
		{slog.LevelDebug, func() { core.Infof("[Server #%d] Server created", 1) }, map[string]any{"level": "DEBUG", "msg": "[Server #1] Server created", "module": "grpc", "component": "test"}},
		{slog.LevelInfo, func() { core.Warning("a", "b") }, map[string]any{"level": "WARN", "msg": "a b", "module": "grpc", "component": "test"}},
		{slog.LevelInfo, func() { core.Errorf("failed: %v", errors.New("boom")) }, map[string]any{"level": "ERROR", "msg": "failed: boom", "module": "grpc", "component": "test"}},
		{slog.LevelInfo, func() { core.Info("chatty") }, nil},
		// A first arg that only looks like a component is the message's.
		{slog.LevelInfo, func() { grpclog.ErrorDepth(0, "[Server #1]", "stopped") }, map[string]any{"level": "ERROR", "msg": "[Server #1] stopped", "module": "grpc"}},
	} {
		buf := use(t, tc.handler)
		tc.log()
		var want []map[string]any
		if tc.want != nil {
			want = []map[string]any{tc.want}
		}
		if got := take(t, buf); !reflect.DeepEqual(got, want) {
			t.Errorf("handler %v: wrote %v, want %v", tc.handler, got, want)
		}
	}
}

func TestGRPCVerbosity(t *testing.T) {
	use(t, slog.LevelDebug)
	if !grpclog.V(0) || !grpclog.V(1) || grpclog.V(2) {
		t.Errorf("at Debug with verbosity 1: V(0), V(1), V(2) = %v, %v, %v; want true, true, false", grpclog.V(0), grpclog.V(1), grpclog.V(2))
	}
	use(t, slog.LevelInfo)
	if grpclog.V(0) {
		t.Error("at Info: V(0) = true, want false (gRPC's INFO is Debug)")
	}
}

// A real gRPC server's own lines come through the sink.
func TestGRPCServer(t *testing.T) {
	buf := use(t, slog.LevelDebug)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	s.Stop()
	if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) { // stopped before it served
		t.Fatal(err)
	}
	var created bool
	for _, l := range take(t, buf) {
		if l["module"] != "grpc" || l["component"] != "core" {
			t.Errorf("a line of gRPC's server without module grpc, component core: %v", l)
		}
		if l["level"] == "ERROR" {
			t.Errorf("an error line of a server started and stopped: %v", l)
		}
		created = created || (strings.HasSuffix(l["msg"].(string), "Server created") && l["level"] == "DEBUG")
	}
	if !created {
		t.Error(`no DEBUG line "Server created"`)
	}
}

// The standard library's default logger writes through the sink at
// Warn: bbolt's line at Close, for one.
func TestStandardLogger(t *testing.T) {
	buf := use(t, slog.LevelInfo)
	log.Printf("bolt.Close(): funlock error: %s", errors.New("bad file descriptor"))
	log.Print("two\nlines\n")
	want := []map[string]any{
		{"level": "WARN", "msg": "bolt.Close(): funlock error: bad file descriptor", "module": "log"},
		{"level": "WARN", "msg": "two\nlines", "module": "log"},
	}
	if got := take(t, buf); !reflect.DeepEqual(got, want) {
		t.Errorf("wrote %v, want %v", got, want)
	}
	use(t, slog.LevelError)
	log.Print("dropped")
	if got := take(t, buf); len(got) != 0 {
		t.Errorf("at Error: wrote %v", got)
	}
}

// Use may swap the handler while lines are written.
func TestSinkUseWhileWriting(t *testing.T) {
	var a, b logbuf.Buffer
	sink.Use(slog.NewJSONHandler(&a, nil))
	t.Cleanup(func() { sink.Use(slog.NewJSONHandler(os.Stderr, nil)) })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				log.Print("x")
			}
		})
	}
	sink.Use(slog.NewJSONHandler(&b, nil))
	wg.Wait()
	if n := len(take(t, &a)) + len(take(t, &b)); n != 400 {
		t.Errorf("%d lines, want 400", n)
	}
}
