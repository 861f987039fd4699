#!/usr/bin/env bash
# Allocations per check on each hot path, before and after, side by side
# in one run: the same benchmarks on a base revision (default: where this
# branch leaves main) and on the work tree, one after the other.
# Benchmark files the base lacks are copied into it (test files only).
#
#   bench/allocs.sh [base-revision]      → a markdown table on stdout
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base="${1:-$(git -C "$root" merge-base HEAD main)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/base"
git -C "$root" archive "$base" | tar -x -C "$tmp/base"
for f in server/http_bench_test.go router/httpapi/check_test.go node/owner_bench_test.go; do
  [ -e "$tmp/base/$f" ] || cp "$root/$f" "$tmp/base/$f"
done
run() { # dir label
  (cd "$1" && {
    go test -run '^$' -bench 'CheckSingle|CheckBatch' -benchmem -benchtime 20000x ./router/httpapi/
    go test -run '^$' -bench 'HTTPCheck' -benchmem -benchtime 3000x ./server/
    go test -run '^$' -bench 'RouterCheck' -benchmem -benchtime 3000x ./server/
    go test -run '^$' -bench 'RoundTrip' -benchmem -benchtime 3000x ./transport/
    go test -run '^$' -bench 'RingCheck' -benchmem -benchtime 3000x ./client/
    go test -run '^$' -bench 'OwnerHandleBatch' -benchmem -benchtime 300x ./node/
  } 2>&1 | grep -E '^Benchmark' | sed "s/^/$2 /")
}
{ run "$tmp/base" before; run "$root" after; } > "$tmp/out.txt"
python3 - "$tmp/out.txt" "$base" <<'PY'
import re, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    label, name, *rest = line.split()
    name = re.sub(r'-\d+$', '', name)
    m = {u: float(v) for v, u in zip(rest[1::2], rest[2::2])}
    if name not in rows:
        rows[name] = {}
        order.append(name)
    rows[name][label] = m
def checks(name):
    m = re.search(r'batch=(\d+)', name) or re.search(r'checks=(\d+)', name)
    if m:
        return int(m.group(1))
    if 'OwnerHandleBatch' in name:
        return 512
    return 100 if 'CheckBatch' in name else 1
print(f"| benchmark | checks/op | before: allocs/op | after: allocs/op | before: B/op | after: B/op | allocs per check before → after | ns/op before → after |")
print("|---|--:|--:|--:|--:|--:|---|---|")
for n in order:
    b, a = rows[n].get('before', {}), rows[n].get('after', {})
    k = checks(n)
    f = lambda m, u: ('%g' % m[u]) if u in m else '—'
    pc = lambda m: ('%.2f' % (m['allocs/op'] / k)) if 'allocs/op' in m else '—'
    ns = lambda m: ('%.0f' % m['ns/op']) if 'ns/op' in m else '—'
    print(f"| {n} | {k} | {f(b,'allocs/op')} | {f(a,'allocs/op')} | {f(b,'B/op')} | {f(a,'B/op')} | {pc(b)} → {pc(a)} | {ns(b)} → {ns(a)} |")
print(f"\nbase: {sys.argv[2]}")
PY
