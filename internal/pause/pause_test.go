package pause

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := For(context.Background(), time.Second); err != nil || time.Since(start) != time.Second {
			t.Errorf("For(1s) = %v after %v; want nil after 1s", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start = time.Now()
		if err := For(ctx, time.Hour); err != context.DeadlineExceeded || time.Since(start) != 100*time.Millisecond {
			t.Errorf("For(1h) under a 100ms context = %v after %v; want DeadlineExceeded after 100ms", err, time.Since(start))
		}
	})
}
