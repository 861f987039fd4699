package main

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A shutdown that never returns (Raft's, over a disk that never answers)
// holds serve for at most its bound; one that returns in time gives its
// own result.
func TestWithinBoundsAHungShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		start := time.Now()
		err := within(5*time.Second, func() error { <-hang; return nil })
		if !errors.Is(err, errShutdownHung) {
			t.Fatalf("hung shutdown: %v, want errShutdownHung", err)
		}
		if took := time.Since(start); took != 5*time.Second {
			t.Fatalf("gave up after %v, want 5s", took)
		}
		failed := errors.New("http: server closed with errors")
		if err := within(5*time.Second, func() error { time.Sleep(time.Second); return failed }); err != failed {
			t.Fatalf("shutdown in time: %v, want its own error", err)
		}
		if err := within(5*time.Second, func() error { return nil }); err != nil {
			t.Fatalf("clean shutdown: %v", err)
		}
	})
}
