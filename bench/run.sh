#!/usr/bin/env bash
# The side-by-side benchmark of issue 14, in one run on this machine:
# ringlimit (1 and 3 members; HTTP and the Go client on the data plane),
# gubernator v2 (1 and 3 instances; HTTP gateway and gRPC) and Redis + the
# classic Lua token bucket (EVALSHA, unpipelined and pipelined), with the
# same keys, rule and concurrency levels. Writes results.json,
# results.md and sidebyside.png to bench/results/ (or $OUT).
#
# Redis is a benchmark baseline only, never a runtime dependency: it is
# installed from Debian's packages when missing. Every server is started
# by the run on loopback ports the kernel reports free and stopped by its PID; the
# whole run is bounded (--budget, default 10m).
#
#   bench/run.sh [sidebyside flags]     e.g. --only 'redis|memory' --duration 1s
#
# This machine's speed drifts by tens of percent over minutes, and the
# systems run one after another: for ratios, measure the systems in turn
# several times and take medians, e.g.
#   TIMEOUT=40m bench/run.sh --rounds 3 --budget 38m --only '^(ringlimit-1|ringlimit-3|redis)$' --concurrency 32
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/results}"
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$here/.." && go build -o "$bin/ringlimit" ./cmd/ringlimit)
(cd "$here" && go build -o "$bin/" ./cmd/gubernatord ./cmd/sidebyside)
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
timeout "${TIMEOUT:-11m}" "$bin/sidebyside" --ringlimit "$bin/ringlimit" --gubernatord "$bin/gubernatord" \
  --redis-server "$(command -v redis-server)" --out "$out" "$@"
