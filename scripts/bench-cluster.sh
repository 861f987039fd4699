#!/usr/bin/env bash
# Runs `ringlimit bench` against a 1-node and a 3-node cluster on this
# machine, side by side in one session, and prints one line per run.
# Every run is bounded (--duration); every server is stopped at the end.
#
#   scripts/bench-cluster.sh [duration]      (default 5s per run)
set -euo pipefail
cd "$(dirname "$0")/.."
dur="${1:-5s}"
work=$(mktemp -d)
bin="$work/ringlimit"
go build -o "$bin" ./cmd/ringlimit
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

start() { # id http raft peer [join]
  local id=$1 http=$2 raft=$3 peer=$4 join=${5:-}
  "$bin" serve --id "$id" --http "127.0.0.1:$http" --raft "127.0.0.1:$raft" --peer "127.0.0.1:$peer" \
    --data-dir "$work/$id" ${join:+--join "$join"} --log-level warn 2>>"$work/$id.log" &
  pids+=($!)
  for _ in $(seq 1 200); do
    curl -sf "127.0.0.1:$http/readyz" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "node $id did not become ready" >&2; cat "$work/$id.log" >&2; exit 1
}

put_rules() { # http
  curl -sf -X PUT "127.0.0.1:$1/v1/rules" -H 'Content-Type: application/yaml' --data-binary @- >/dev/null <<'YAML'
rules:
  - name: bench
    algorithm: token_bucket
    limit: 100
    period: 1s
    burst: 200
YAML
}

run() { # label addrs concurrency batch [protocol]
  local out
  out=$("$bin" bench --addr "$2" --rule bench --keys 100000 --dist uniform --concurrency "$3" --batch "$4" --duration "$dur" --protocol "${5:-http}" --json)
  python3 - "$1" "$3" "$4" "$out" <<'PY'
import json, sys
label, conc, batch, raw = sys.argv[1:5]
r = json.loads(raw)
l = r["latency_ms"]
print(f"| {label} | {conc} | {batch} | {r['checks_per_second']:,.0f} | {l['p50']:.2f} | {l['p99']:.2f} | {r['allowed_ratio']*100:.1f}% | {r['degraded']} | {r['errors']} |")
PY
}

echo "| cluster / target | concurrency | batch | checks/s | p50 ms | p99 ms | allowed | degraded | errors |"
echo "|---|---|---|---|---|---|---|---|---|"
start a1 7080 7081 7082
put_rules 7080
for c in 16 64; do for b in 1 100; do run "1 node" 127.0.0.1:7080 $c $b; done; done
for b in 1 100 1000; do run "1 node, data plane (stateless router)" 127.0.0.1:7080 16 $b peer; done
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true; pids=()

start b1 7180 7181 7182
start b2 7190 7191 7192 127.0.0.1:7180
start b3 7200 7201 7202 127.0.0.1:7180
for _ in $(seq 1 200); do
  n=$(curl -sf 127.0.0.1:7200/v1/cluster | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["members"]))' || echo 0)
  [ "$n" = 3 ] && break; sleep 0.05
done
put_rules 7180
sleep 0.5 # let the rules reach the followers
for c in 16 64; do for b in 1 100; do
  run "3 nodes, all targeted" 127.0.0.1:7180,127.0.0.1:7190,127.0.0.1:7200 $c $b
  run "3 nodes, one targeted (2/3 forwarded)" 127.0.0.1:7180 $c $b
done; done
for b in 1 100 1000; do run "3 nodes, data plane (stateless router)" 127.0.0.1:7180 16 $b peer; done
