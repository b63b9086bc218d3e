#!/usr/bin/env bash
# On the GPU machine: keep carried parts in /tmp/mlx-backend-gpu until the
# last call assembles them (the machine keeps /tmp while it stays warm).
#   scripts/gpu/stash.sh .gpu/base.tar.xz.part-aa [...]
set -euo pipefail
STASH=/tmp/mlx-backend-gpu
mkdir -p "$STASH"
for p in "$@"; do
  cp "$p" "$STASH/"
done
ls -l "$STASH"
