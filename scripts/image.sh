#!/usr/bin/env bash
# Build the ringlimit container image without pulling anything: the host's
# Go builds a static binary (CGO_ENABLED=0), which goes into FROM scratch
# with the host's CA bundle and a non-root user (deploy/Dockerfile.scratch).
#
#   scripts/image.sh [TAG]        # default ringlimit:dev
#
# RINGLIMIT_BINARY=path uses an already built static linux binary instead
# of building one (the deploy tests do, to build once).
set -euo pipefail
cd "$(dirname "$0")/.."

tag="${1:-ringlimit:dev}"
ca=/etc/ssl/certs/ca-certificates.crt
[ -r "$ca" ] || { echo "image.sh: $ca not found (install ca-certificates)" >&2; exit 1; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT

if [ -n "${RINGLIMIT_BINARY:-}" ]; then
  cp "$RINGLIMIT_BINARY" "$ctx/ringlimit"
else
  CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false -ldflags='-s -w' -o "$ctx/ringlimit" ./cmd/ringlimit
fi
cp "$ca" "$ctx/ca-certificates.crt"
cp deploy/image/passwd deploy/image/group "$ctx/"
mkdir "$ctx/data"

docker build --pull=false -f deploy/Dockerfile.scratch -t "$tag" "$ctx"
echo "built $tag"
