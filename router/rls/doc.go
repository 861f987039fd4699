// Package rls is ringlimit's Envoy rate-limit service: the gRPC
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, configured
// with envoyproxy/ratelimit's YAML, loaded unchanged, and decided by the
// cluster instead of Redis.
//
// # Model
//
// A config is a set of domains, each a tree of descriptors (key, optional
// value: no value = any value, each distinct value its own counter; a
// value ending in '*' = a value prefix). A request descriptor (a list of
// entries) matches as envoyproxy/ratelimit matches it: level by level,
// (key, value) before value prefix before key alone, and only a limit
// reached on the descriptor's last entry applies.
//
// Each rate limit of a descriptor becomes a limiter.Rule named
// deterministically from the domain, the descriptor's path in the config
// and the limit's index (rls:DOMAIN/PATH#I, or a hash when that is not a
// valid rule name), and each request descriptor a key made of its entries.
// Those limits exist only in this process's config, not in the cluster's
// Raft-replicated rules, so every check carries its rule inline
// (router.Request.Inline): the key's owner decides under the definition
// it is sent, after validating it, and every replica loading the same
// file shares one counter per descriptor, exact across the cluster.
// Rule names under rules.InlinePrefix can never be written rules. A
// descriptor's own limit (Envoy's per-route override) is a fixed window
// of its unit × unit_multiplier, its rule named by the domain and that
// period (rls:DOMAIN/_override_minute#0, rls:DOMAIN/_override_30s#0),
// so its counter is the descriptor's in that window.
//
// # Semantics
//
//   - hits_addend is the cost (0 means 1, as in Envoy); a descriptor's own
//     hits_addend overrides it. Hits beyond a limit's capacity are
//     OVER_LIMIT without spending anything.
//   - one status per descriptor; the overall code is OVER_LIMIT when any
//     is. current_limit, limit_remaining (after this request) and
//     duration_until_reset describe the decisive limit: the first that
//     denied, else the one with the least remaining.
//   - unmatched descriptors and unknown domains are OK without a limit;
//     unlimited limits are OK with limit_remaining 2^32-1;
//     requests_per_unit 0 denies everything.
//   - shadow_mode answers OK and counts the would-be denial in
//     ringlimit_rls_descriptors_total{result="shadow_mode"}.
//   - replaces: a matched limit named in another matched limit's
//     replaces is neither checked nor spent.
//   - extras its users asked for, ignored by their tooling: algorithm
//     (any of the six; default fixed_window of the unit), burst,
//     failure_mode (open by default: the answer when the owner cannot be
//     reached within the router's timeout), and rate_limits, a list of
//     several limits on one descriptor (a burst and a daily limit).
//     They are decided together, by the owner of the descriptor's key,
//     all-or-nothing: a hit is counted by all of them or, when any
//     denies, by none. Denied hits are never counted.
//   - strings that are not UTF-8 (Envoy sends a header's bytes as they
//     are) are taken as they are: the server's codec decodes a request
//     that protobuf-go refuses for them (see codec).
//   - is_negative_hits (a refund) is not supported: such a descriptor
//     spends nothing and is answered as a query (OK when one more hit
//     would pass).
//
// # Concurrency
//
// Service and Server are safe for concurrent use. The config in force is
// an immutable *Config swapped atomically; a reload that fails to parse
// leaves it in force.
package rls
