#!/usr/bin/env bash
# The classic design ringlimit replaces, measured on this machine for the
# side-by-side in BENCHMARKS.md: Redis + an atomic Lua token bucket
# (HMGET/refill/HSET/PEXPIRE in one script), driven by redis-benchmark.
# Redis is a benchmark baseline only, never a runtime dependency.
# Installs redis-server from Debian's packages when missing. Bounded: a
# fixed number of requests per run; the server is stopped at the end.
#
#   scripts/bench-redis.sh [requests]     (default 1000000)
set -euo pipefail
n="${1:-1000000}"
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
port=7390
work=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --daemonize no >"$work/redis.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

# ARGV[1] tokens per ms, ARGV[2] burst. State: a hash {tokens, ts} per key.
lua='local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local b = redis.call("HMGET", KEYS[1], "tokens", "ts")
local burst = tonumber(ARGV[2])
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - ts) * tonumber(ARGV[1]))
local allowed = 0
if tokens >= 1 then tokens = tokens - 1; allowed = 1 end
redis.call("HSET", KEYS[1], "tokens", tokens, "ts", now)
redis.call("PEXPIRE", KEYS[1], 60000)
return allowed'
sha=$(redis-cli -p "$port" SCRIPT LOAD "$lua")

echo "| redis + Lua token bucket | clients | pipeline | checks/s |"
echo "|---|---|---|---|"
for c in 16 64; do for p in 1 100; do
  rps=$(redis-benchmark -p "$port" -c "$c" -P "$p" -n "$n" -r 100000 -q EVALSHA "$sha" 1 'key:__rand_int__' 0.1 200 \
        | tr '\r' '\n' | grep -Eo '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
  echo "| 100k keys | $c | $p | $rps |"
done; done

# Memory per key: 1M distinct keys, each checked once.
redis-cli -p "$port" FLUSHALL >/dev/null
base=$(redis-cli -p "$port" INFO memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
redis-benchmark -p "$port" -c 16 -P 100 -n 5000000 -r 1000000 -q EVALSHA "$sha" 1 'key:__rand_int__' 0.1 200 >/dev/null
keys=$(redis-cli -p "$port" DBSIZE)
used=$(redis-cli -p "$port" INFO memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
echo
echo "memory: $keys keys, $(( (used - base) / keys )) bytes per key (used_memory)"
