#!/usr/bin/env bash
# Builds the standalone CUDA kernel checks (one folder each, main.cu) with
# the nvcc that build.rs installs, into $1 (default target/cuda/gpu-checks).
# They include the kernels' .cu files directly and link the CUDA runtime
# statically, so on the GPU machine they need only the driver's libcuda.
#   scripts/gpu/checks/build.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/../../.."
CACHE="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}"
NV="${NVCC_ROOT:-$(ls -d "$CACHE"/nvcc-*/nvidia/cu13 2>/dev/null | tail -1)}"
MLX_INCLUDE="$CACHE/mlx-0.32.4-cuda-13/mlx/include"
OUTDIR="${1:-target/cuda/gpu-checks}"
[[ -x "$NV/bin/nvcc" ]] || { echo "checks: no nvcc under $CACHE (build --features cuda first)" >&2; exit 1; }
[[ -d "$MLX_INCLUDE/cccl" ]] || { echo "checks: no CUDA MLX layout at $MLX_INCLUDE" >&2; exit 1; }
mkdir -p "$OUTDIR"
for dir in scripts/gpu/checks/*/; do
  name="$(basename "$dir")"
  echo "checks: building $name" >&2
  "$NV/bin/nvcc" -O3 -std=c++20 -I mlx-kernels-cpp -isystem "$MLX_INCLUDE/cccl" \
    -gencode arch=compute_90,code=sm_90 "$dir/main.cu" -o "$OUTDIR/$name" \
    -L"$NV/lib" -lcudart_static -ldl -lpthread -lrt
done
