// Package pause waits for a while unless a context ends first.
package pause

import (
	"context"
	"time"
)

// For waits d, or until ctx is done: nil when d passed, else ctx's error.
// A d of 0 or less passes at once, though ctx may be done as well: which
// of the two For reports then is not specified.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
