#!/usr/bin/env bash
# Build the CUDA flavour here (no GPU needed) and pack what a GPU machine
# needs to run it into parts small enough for one device call each.
#
#   scripts/gpu/pack.sh            -> .gpu/ holds the parts and a MANIFEST
#
# What goes in:
#   base.tar.xz.part-*   MLX's CUDA wheel layout (mlx/ and mlx_cuda_13.libs/;
#                        not the ~2.7 GB nvidia/ wheels: the GPU machine's
#                        python3 has the CUDA 13 libraries) and the default
#                        model. Changes only with MLX or the model: reused
#                        when its inputs are unchanged.
#   app.tar.xz.part-*    the stripped test binaries, examples and GPU kernel bench,
#                        the standalone kernel checks (scripts/gpu/checks),
#                        scripts/gpu, and the mlx-lm peer's wheels (MLX's cp312
#                        bindings and mlx-lm, ~1.3 MB).
# Paths inside are absolute (the binaries' RUNPATH points into the cache), so
# the device extracts them at /.
#
# Env: MLX_BACKEND_CACHE  cache root (default ~/.cache/mlx-backend)
#      GPU_PART_BYTES     part size (default 55 MiB: a part plus the work tree
#                         stays under one call's 64 MiB)
#      GPU_TESTS          space-separated test binary names to pack (default: all);
#                         NAME:FILTER entries (run.sh's test filter) pack NAME
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUTDIR="$ROOT/.gpu"
CACHE="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}"
PART_BYTES="${GPU_PART_BYTES:-$((55 * 1024 * 1024))}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/cuda}"
LAYOUT="$CACHE/mlx-0.32.4-cuda-13"
MODEL="$(bash scripts/fetch-default-model.sh)"

echo "pack: building --features cuda into $CARGO_TARGET_DIR" >&2
cargo build --release --features cuda --examples >&2
mapfile -t TESTS < <(
  cargo test --release --features cuda --no-run --message-format=json 2>/dev/null |
    python3 scripts/cargo-executables.py --tests
)
BENCH="$(
  cargo bench --features cuda --no-run --bench gpu_kernels --message-format=json 2>/dev/null |
    python3 scripts/cargo-executables.py --target gpu_kernels
)"
bash scripts/gpu/checks/build.sh "$CARGO_TARGET_DIR/gpu-checks"
[[ -d "$LAYOUT/mlx/lib" ]] || { echo "pack: no CUDA layout at $LAYOUT (the build should have made it)" >&2; exit 1; }

mkdir -p "$OUTDIR"
STAGE="$(mktemp -d -t mlx-backend-gpu-XXXXXX)"
trap 'rm -rf "$STAGE"' EXIT

# The base archive, rebuilt only when its inputs change.
BASE_KEY="$( (ls -l --time-style=+%s "$LAYOUT/mlx/lib" "$MODEL"; du -s "$LAYOUT/mlx" "$LAYOUT/mlx_cuda_13.libs") | sha256sum | cut -c1-16)"
if [[ ! -f "$OUTDIR/base.key" || "$(cat "$OUTDIR/base.key")" != "$BASE_KEY" ]]; then
  echo "pack: base archive (MLX CUDA layout + default model)" >&2
  rm -f "$OUTDIR"/base.tar.xz.part-*
  tar -C / -cf - "${LAYOUT#/}/mlx" "${LAYOUT#/}/mlx_cuda_13.libs" "${MODEL#/}" |
    xz -T2 -3 | split -b "$PART_BYTES" -a 2 - "$OUTDIR/base.tar.xz.part-"
  echo "$BASE_KEY" >"$OUTDIR/base.key"
fi

# The app archive: binaries under /opt/mlx-backend-gpu/{deps,examples} (the
# layout tests/cli_examples.rs expects), plus this folder's scripts.
APP="$STAGE/opt/mlx-backend-gpu"
mkdir -p "$APP/deps" "$APP/examples" "$APP/scripts"
for t in "${TESTS[@]}"; do
  name="$(basename "$t")"
  if [[ -n "${GPU_TESTS:-}" ]] && ! grep -qw "${name%-*}" <<<"$GPU_TESTS"; then continue; fi
  strip -o "$APP/deps/$name" "$t"
done
mkdir -p "$APP/benches"
[[ -n "$BENCH" ]] && strip -o "$APP/benches/gpu_kernels" "$BENCH"
for e in generate bench_one_batch serve; do
  strip -o "$APP/examples/$e" "$CARGO_TARGET_DIR/release/examples/$e"
done
cp scripts/gpu/*.sh "$APP/scripts/"
mkdir -p "$APP/checks"
cp "$CARGO_TARGET_DIR"/gpu-checks/* "$APP/checks/"
# The mlx-lm peer for run.sh peer: the device's Python is 3.12, so MLX's
# cp312 bindings (unpacked there over the CUDA layout's mlx/) and mlx-lm.
PEER_WHEELS="$CACHE/peer-wheels-0.32.4"
if [[ ! -d "$PEER_WHEELS" ]]; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 mlx==0.32.4 mlx-lm==0.32.2 -d "$PEER_WHEELS.partial" >&2
  mv "$PEER_WHEELS.partial" "$PEER_WHEELS"
fi
mkdir -p "$APP/peer"
cp "$PEER_WHEELS"/*.whl "$APP/peer/"
# Tests read goldens and fixtures from the source tree by absolute path.
mkdir -p "$STAGE/${ROOT#/}"
cp -r tests "$STAGE/${ROOT#/}/"
rm -f "$OUTDIR"/app.tar.xz.part-*
tar -C "$STAGE" -cf - . | xz -T2 -6 | split -b "$PART_BYTES" -a 2 - "$OUTDIR/app.tar.xz.part-"

(cd "$OUTDIR" && ls -l base.tar.xz.part-* app.tar.xz.part-* | awk '{print $5, $9}') >"$OUTDIR/MANIFEST"
echo "pack: parts in .gpu/ (carry each in its own call, see docs/gpu.md):" >&2
cat "$OUTDIR/MANIFEST" >&2
