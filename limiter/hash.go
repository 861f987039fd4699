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
// part of the salt, so a rule's algorithm changed finds no state under
// its new one: a table that knows the seed (SetSeed) then looks the key
// up under the old one (altBucket), in the store of its kind, and
// converts what it finds (convertAny).

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

// altBucket is the bucket of the same key under a salt that differs from
// bucket's by delta (salt ⊕ other salt): mix64 is inverted, so the key
// hash need not be known. A table looks up the bucket a key had under
// its rule's previous algorithm with it (ruleSet.alts).
func altBucket(bucket, delta uint64) uint64 { return mix64(unmix64(bucket) ^ delta) }

// unmix64 is the inverse of mix64: a shift by 33 undoes itself (2×33 ≥
// 64), and the multipliers are odd, so invertible modulo 2^64.
func unmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xc7b4c8f8129337db // 0xc4ceb3fe1a85ec53⁻¹
	x ^= x >> 33
	x *= 0x4f74430c22a54005 // 0xff51afd7ed558ccd⁻¹
	x ^= x >> 33
	return x
}

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
