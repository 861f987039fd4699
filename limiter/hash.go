package limiter

import "github.com/cespare/xxhash/v2"

// Keys are never stored: a bucket is found by a 64-bit hash of (rule,
// key). Both hashes are seeded with a secret (one per cluster), so a
// client that does not know the seed cannot craft a key whose bucket
// lands on another tenant's.
//
//	keyHash    = xxhash64(seed, key)          → partition = keyHash mod P
//	ruleSalt   = xxhash64(seed, name, algo)   computed once per rule
//	bucketHash = mix(keyHash ⊕ ruleSalt)      the table's key
//
// All rules of one client key therefore live in the same partition (and
// on the same owner), while their buckets stay distinct. The algorithm is
// part of the salt, so changing a rule's algorithm starts fresh buckets
// instead of reading one algorithm's state as another's.

// KeyHash returns the seeded hash of a client key.
func KeyHash(seed uint64, key string) uint64 { return xxh64(seed, key) }

// RuleSalt returns the seeded salt of a rule's buckets.
func RuleSalt(seed uint64, name string, a Algorithm) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write([]byte{byte(a), 0})
	_, _ = d.WriteString(name)
	return d.Sum64()
}

// BucketHash combines a key hash and a rule salt into the bucket's key in
// a Table. It is a bijection of keyHash for a given salt, so two keys of
// one rule collide only when their key hashes do.
func BucketHash(keyHash, salt uint64) uint64 { return mix64(keyHash ^ salt) }

// mix64 is the murmur3 finaliser: a bijection that spreads every input
// bit over the output.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb3fe1a85ec53
	x ^= x >> 33
	return x
}
