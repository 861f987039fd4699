package server

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/transport"
)

// Connections refused for want of authentication are said at WARN, at
// most once per refusedWarnEvery (they were DEBUG only: a router given no
// cluster secret answered every check by its failure mode, and neither
// it nor the member said why); a peer silent past the handshake is still
// DEBUG.
func TestRefusedConnectionsAreWarnedAtAPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		logf := listenerErrorLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
		refused := fmt.Errorf("transport: handshake with 127.0.0.1:5000: %w: the peer sent a request without the handshake", transport.ErrAuth)
		count := func(level string) int { return strings.Count(buf.String(), "level="+level) }
		for range 50 {
			logf(refused)
		}
		if count("WARN") != 1 || !strings.Contains(buf.String(), "127.0.0.1:5000") {
			t.Fatalf("50 refusals logged %d WARN lines, want 1 naming the peer:\n%s", count("WARN"), buf.String())
		}
		time.Sleep(refusedWarnEvery)
		logf(refused)
		if count("WARN") != 2 {
			t.Fatalf("a refusal %v later logged %d WARN lines in all, want 2", refusedWarnEvery, count("WARN"))
		}
		logf(fmt.Errorf("handshake: %w", errors.New("i/o timeout")))
		if count("WARN") != 2 || count("DEBUG") != 1 {
			t.Fatalf("a timed-out handshake: %d WARN, %d DEBUG lines, want it at DEBUG:\n%s", count("WARN"), count("DEBUG"), buf.String())
		}
	})
}
