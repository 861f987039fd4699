#!/usr/bin/env bash
# Redis + the classic atomic Lua token bucket on this machine, now one
# part of the side-by-side run (bench/run.sh, which holds the script and
# its load loop): its rows, then the bytes per key of all three systems.
#
#   scripts/bench-redis.sh [sidebyside flags]
exec "$(dirname "$0")/../bench/run.sh" --only '^(redis|memory)$' "$@"
