package logbuf

import (
	"fmt"
	"sync"
	"testing"
)

// Writers and a reader may run at once; Take hands each line out once;
// Parse reads every line as a JSON object.
func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { fmt.Fprintf(&b, "{\"i\":%d}\n", i) })
	}
	wg.Wait()
	if got := len(Parse(t, b.String())); got != 4 {
		t.Fatalf("String: %d lines, want 4", got)
	}
	if got := len(Parse(t, b.Take())); got != 4 {
		t.Fatalf("Take: %d lines, want 4", got)
	}
	if s := b.Take(); s != "" {
		t.Fatalf("a second Take: %q, want nothing", s)
	}
	if n := keys(`{"a":1,"a":2}`); n != 2 {
		t.Fatalf("keys of a repeated key: %d, want 2", n)
	}
	if n := keys(`[1]`); n != -1 {
		t.Fatalf("keys of a list: %d, want -1", n)
	}
}
