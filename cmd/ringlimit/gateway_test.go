package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// A gateway whose cluster cannot be reached serves at once: a limited
// route answers 503 while it still waits for its first view, and the
// warning comes once that wait is over. Was: it waited up to 10 s for
// the view before it served, and the kernel held every connection
// unanswered meanwhile. Real loopback; the deadlines only bound a hang.
func TestGatewayServesBeforeItsFirstView(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("routes:\n  - {name: all, path: /*, limits: [{rule: default}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listen, dead := freePort(t), freePort(t) // nothing listens on dead
	var logs logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	go func() {
		exited <- runGateway(ctx, []string{"--listen", listen, "--cluster", dead, "--upstream", "http://" + dead, "--config", cfg},
			func(string) string { return "" }, io.Discard, &logs)
	}()
	hc := &http.Client{Timeout: 5 * time.Second}
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		if resp, err = hc.Get("http://" + listen + "/x"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway never answered: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"unavailable"`) {
		t.Fatalf("with no view: %d %s, want 503 unavailable", resp.StatusCode, body)
	}
	if strings.Contains(logs.String(), "no cluster view yet") {
		t.Fatalf("answered only after the 10 s wait for a view:\n%s", logs.String())
	}
	cancel()
	select {
	case rc := <-exited:
		if rc != 0 {
			t.Fatalf("exit %d\n%s", rc, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not stop\n%s", logs.String())
	}
}
