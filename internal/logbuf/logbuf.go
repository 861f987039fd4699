// Package logbuf is a log sink for tests: goroutines write lines of JSON
// (a slog.JSONHandler's) while the test reads them back, parsed.
package logbuf

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

// Buffer is an io.Writer that is safe for concurrent use. The zero value
// is empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Take returns what was written since the last Take, and forgets it.
func (b *Buffer) Take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	b.buf.Reset()
	return s
}

// Parse returns the lines of text, each a JSON object, parsed; empty
// lines are skipped. It fails the test on a line that is not a JSON
// object or names a key twice (json.Unmarshal would keep the last).
func Parse(t testing.TB, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a line that is not a JSON object: %q", line)
		}
		if n := keys(line); n != len(m) {
			t.Fatalf("a line with a key twice: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// keys counts the keys of the JSON object line, repeats included; -1 if
// it is not one.
func keys(line string) int {
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return -1
	}
	n := 0
	for dec.More() {
		var v json.RawMessage
		if _, err := dec.Token(); err != nil {
			return -1
		}
		if err := dec.Decode(&v); err != nil {
			return -1
		}
		n++
	}
	return n
}
