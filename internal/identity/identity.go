// Package identity is how the gateway and the Go client's middleware
// turn a client's identity into a bucket key, so that the two key one
// client alike.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// Key is the bucket key of an identity of kind ("sub", "key", "ip"):
// "kind:value", or, for a value too long for a key (api.MaxKeyLen) or not
// UTF-8, "kindh:" and the value's SHA-256 in hex, a kind of its own so
// that no value written as it is can name a hashed one's bucket. Any API
// key or subject then has a budget of its own, where such a value was
// refused by the cluster (400).
func Key(kind, value string) string {
	if len(kind)+1+len(value) <= api.MaxKeyLen && utf8.ValidString(value) {
		return kind + ":" + value
	}
	sum := sha256.Sum256([]byte(value))
	return kind + "h:" + hex.EncodeToString(sum[:])
}
