package limiter

import (
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

func TestXXH64MatchesXXHash(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		s := rapid.StringN(0, 200, -1).Draw(t, "s")
		d := xxhash.NewWithSeed(seed)
		_, _ = d.WriteString(s)
		if got, want := xxh64(seed, s), d.Sum64(); got != want {
			t.Fatalf("xxh64(%d, %q) = %x, xxhash says %x", seed, s, got, want)
		}
	})
	for n := range 70 { // every tail length and stripe boundary
		s := string(make([]byte, n))
		if xxh64(0, s) != xxhash.Sum64String(s) {
			t.Fatalf("length %d: differs from xxhash.Sum64String", n)
		}
	}
}

func BenchmarkKeyHash(b *testing.B) {
	for b.Loop() {
		KeyHash(42, "user-123456")
	}
}
