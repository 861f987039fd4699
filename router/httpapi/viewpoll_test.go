package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/pipenet"
)

// waitingAdmin is a fakeAdmin whose view stays at epoch and rules
// version: WaitView waits, as a node does, until the view is newer than
// asked (it never becomes so), ctx ends or wait passes.
type waitingAdmin struct {
	fakeAdmin
	epoch, rules uint64
}

func (a *waitingAdmin) WaitView(ctx context.Context, afterEpoch, afterRules uint64, wait time.Duration) {
	if a.epoch > afterEpoch || a.rules > afterRules {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	<-ctx.Done()
}

// A long poll of the view is answered at the end of its wait, whatever
// the wait up to its 30s maximum, through a server with NewServer's
// timeouts (its 10s WriteTimeout and ReadTimeout once dropped every poll
// of 10s or more: the default wait closed the connection unanswered).
// `after` alone waits for a newer epoch, `rules_after` alone for newer
// rules: a parameter not given is no condition (it once defaulted to 0,
// which any view is newer than, so `after` alone answered at once).
func TestViewLongPollThroughServer(t *testing.T) {
	startDateRefresh()
	synctest.Test(t, func(t *testing.T) {
		a := &waitingAdmin{epoch: 5, rules: 3}
		h := New(Config{AdminToken: "tok"}, newFakeChecker(), a)
		s := NewServer(h)
		ln := pipenet.NewListener()
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		tr := &http.Transport{DialContext: ln.DialContext}
		defer func() {
			tr.CloseIdleConnections()
			if err := s.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Error(err)
			}
			time.Sleep(workerIdle) // fake time: fasthttp's worker-pool cleaner sees the stop and ends
		}()
		hc := &http.Client{Transport: tr}

		for _, tc := range []struct {
			query string
			took  time.Duration
		}{
			{"after=5&rules_after=3&wait=9s", 9 * time.Second},
			{"after=5&rules_after=3", 10 * time.Second}, // the default wait
			{"after=5&rules_after=3&wait=10s", 10 * time.Second},
			{"after=5&rules_after=3&wait=11s", 11 * time.Second},
			{"after=5&rules_after=3&wait=30s", 30 * time.Second},
			{"after=5&rules_after=3&wait=45s", maxViewWait},
			{"after=5&wait=12s", 12 * time.Second},
			{"rules_after=3&wait=12s", 12 * time.Second},
			{"after=4&rules_after=3&wait=30s", 0}, // newer epoch
			{"after=5&rules_after=2&wait=30s", 0}, // newer rules
			{"after=4&wait=30s", 0},
			{"rules_after=2&wait=30s", 0},
			{"after=5&rules_after=3&wait=0s", 0},
		} {
			req, err := http.NewRequest("GET", "http://ringlimit/v1/cluster/view?"+tc.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer tok")
			start := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("GET ?%s: %v after %v", tc.query, err, time.Since(start))
			}
			var v api.ClusterView
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != http.StatusOK || err != nil || took != tc.took {
				t.Errorf("GET ?%s: %d (body: %v) after %v, want 200 with the view after %v", tc.query, resp.StatusCode, err, took, tc.took)
			}
		}
	})
}
