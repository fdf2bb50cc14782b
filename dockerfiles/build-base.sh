#!/usr/bin/env bash
# Build the base image offline: a Debian root filesystem from Debian's own packages
# (debootstrap) imported as an image (docker import). Where an image registry is
# reachable, use an official python:3.X-slim image as BASE_IMAGE instead.
#
#   dockerfiles/build-base.sh [TAG]        (default leakbisect-base:bookworm)
#
# Env: SUITE (bookworm), MIRROR (http://deb.debian.org/debian), FORCE=1 to rebuild
# even when TAG exists. Needs root, debootstrap and a running Docker engine.
set -euo pipefail
TAG="${1:-leakbisect-base:bookworm}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
# python3 for the environments (uv finds it), ca-certificates for TLS to indexes,
# procps for `docker top`, tini as PID 1 so orphans are reaped inside the container,
# git for commits trials (listing tags and commits, uv building `pkg @ git+URL@SHA`).
PACKAGES="python3,ca-certificates,procps,tini,git"

# An image built from another package list (an older checkout's) is rebuilt.
built_with=$(docker image inspect --format '{{ index .Config.Labels "leakbisect.packages" }}' \
    "$TAG" 2>/dev/null || true)
if [ "${FORCE:-0}" != 1 ] && [ "$built_with" = "$PACKAGES" ]; then
    echo "base image $TAG exists (FORCE=1 rebuilds)"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }

root="$(mktemp -d /tmp/leakbisect-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
started=$(date +%s)
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >/dev/null
# Keep the image small: no apt lists, caches, docs or man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL leakbisect.packages=$PACKAGES" \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG" >/dev/null
echo "built $TAG in $(( $(date +%s) - started )) s"
