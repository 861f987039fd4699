#!/usr/bin/env bash
# What a graceful join costs, two binaries alternated in one session:
# three members (`serve`, loopback ports), a rule of an hour so that the
# keys stay active, ~633k keys spent by `ringlimit bench` (1M checks over
# 1M uniform keys), then a fourth member joins. Per run: keys held, the
# joiner ready, every member settled (no partition awaited, no hand-off
# pending), bytes over loopback (/proc/net/dev, from the join to 3 s after
# it settled: the machine must be otherwise quiet) and the members' CPU.
#
#   bench/joincost.sh OLD_BINARY NEW_BINARY [ROUNDS=4] [BASE_PORT=29100]
#
# Every process it starts it stops by PID (SIGTERM, then SIGKILL), also
# on error or interrupt; each wait is bounded.
set -euo pipefail
old=$1 new=$2 rounds=${3:-4} base=${4:-29100}
work=$(mktemp -d)
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
start() { # binary dir id index [join]
  local args=(serve --id "$3" --http "127.0.0.1:$((base + $4 * 10))" --raft "127.0.0.1:$((base + $4 * 10 + 1))"
    --peer "127.0.0.1:$((base + $4 * 10 + 2))" --data-dir "$2/$3")
  [ -n "${5:-}" ] && args+=(--join "127.0.0.1:$base")
  "$1" "${args[@]}" >"$2/$3.log" 2>&1 &
  pids+=($!)
}
ready() { for _ in $(seq 600); do curl -sf -o /dev/null "127.0.0.1:$1/readyz" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; return 1; }
cpu() { local s=0 a; for p in "${pids[@]}"; do read -ra a <"/proc/$p/stat"; s=$((s + a[13] + a[14])); done; echo "$s"; }
lo() { awk '/ lo:/{print $2}' /proc/net/dev; }
metric_sum() { # port regex
  curl -s "127.0.0.1:$1/metrics" | awk -v re="$2" '$1 ~ re {s += $2} END {printf "%d", s}'
}
run() { # binary label
  local d="$work/$2"; mkdir -p "$d"
  start "$1" "$d" n1 0; ready "$base"
  start "$1" "$d" n2 1 j; ready $((base + 10))
  start "$1" "$d" n3 2 j; ready $((base + 20))
  sleep 2
  curl -sf -X PUT -H 'Content-Type: application/json' \
    --data '{"rules":[{"name":"hour","algorithm":"token_bucket","limit":100,"period":"1h"}]}' \
    "127.0.0.1:$base/v1/rules" >/dev/null
  sleep 1
  "$1" bench --rule hour --addr "127.0.0.1:$base,127.0.0.1:$((base + 10)),127.0.0.1:$((base + 20))" \
    --batch 1000 --requests 1000 --keys 1000000 --concurrency 8 --duration 60s >"$d/bench.txt" 2>&1
  sleep 1
  local keys=0 i
  for i in 0 1 2; do keys=$((keys + $(metric_sum $((base + i * 10)) '^ringlimit_active_keys$'))); done
  local b0 c0 t0 t1 t2
  b0=$(lo); c0=$(cpu); t0=$(date +%s.%N)
  start "$1" "$d" n4 3 j; ready $((base + 30))
  t1=$(date +%s.%N)
  for _ in $(seq 400); do
    local s=0
    for i in 0 1 2 3; do s=$((s + $(metric_sum $((base + i * 10)) '^ringlimit_(awaiting_partitions|handoff_pending_partitions)$'))); done
    [ "$s" = 0 ] && break
    sleep 0.05
  done
  t2=$(date +%s.%N)
  sleep 3
  local b1 c1
  b1=$(lo); c1=$(cpu)
  stop_all
  python3 -c "print('| $2 | $keys | %.2f | %.2f | %.1f | %.2f |' % ($t1-$t0, $t2-$t0, ($b1-$b0)/1e6, ($c1-$c0)/100))"
}
echo "| binary | keys | joiner ready (s) | settled (s) | loopback MB | members' CPU (s) |"
echo "|---|--:|--:|--:|--:|--:|"
for r in $(seq "$rounds"); do
  run "$old" "old-$r"
  run "$new" "new-$r"
done
