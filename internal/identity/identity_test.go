package identity

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// Values that fit are kept as written; longer ones and ones that are not
// UTF-8 are hashed into a kind of their own; every key fits the contract.
func TestKey(t *testing.T) {
	long := strings.Repeat("k", api.MaxKeyLen)
	for _, tt := range []struct {
		value, want string
	}{
		{"abc", "key:abc"},
		{long[:api.MaxKeyLen-4], "key:" + long[:api.MaxKeyLen-4]},
		{long[:api.MaxKeyLen-3], "keyh:"},
		{"\xff", "keyh:"},
	} {
		got := Key("key", tt.value)
		if !strings.HasPrefix(got, tt.want) || strings.HasSuffix(tt.want, "h:") && len(got) != len("keyh:")+64 {
			t.Errorf("Key(key, %d bytes) = %q, want %q…", len(tt.value), got, tt.want)
		}
		if len(got) > api.MaxKeyLen || !utf8.ValidString(got) {
			t.Errorf("Key(key, %d bytes) = %d bytes, UTF-8 %v", len(tt.value), len(got), utf8.ValidString(got))
		}
	}
	if Key("key", "a\xff") == Key("key", "a\xfe") {
		t.Error("two values that are not UTF-8 share a key")
	}
}
