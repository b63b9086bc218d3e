#!/usr/bin/env bash
# Checks the Metal bodies' C++ host code on a machine without a Mac: every
# mlx-kernels-cpp file that only macOS builds compiles (`metal.cpp`,
# `metal_*.cpp`, and the op builders with MLX_BACKEND_METAL defined) is
# syntax-checked with g++ -fsyntax-only against MLX's macOS headers (the
# pinned mlx-metal wheel for macOS arm64, downloaded once) and a stand-in
# for metal-cpp's Metal.hpp (scripts/metal-check/). The shaders (*.metal)
# are checked as C++ against a stand-in <metal_stdlib>
# (scripts/metal-check/shader/): their templates, names and types, not
# what only Apple's compiler knows (address spaces, attributes); the macOS
# CI job compiles them for real.
set -euo pipefail
cd "$(dirname "$0")/.."

MLX_VERSION=0.32.4
cache="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}/metal-check-$MLX_VERSION"
python="${MLX_PYTHON:-python3}"
if [ ! -f "$cache/mlx/include/mlx/backend/metal/device.h" ]; then
  rm -rf "$cache.partial"
  mkdir -p "$cache.partial"
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform macosx_14_0_arm64 --python-version 3.12 \
    "mlx-metal==$MLX_VERSION" -d "$cache.partial"
  "$python" - "$cache.partial" <<'PY'
import pathlib, sys, zipfile
root = pathlib.Path(sys.argv[1])
for wheel in root.glob("mlx_metal-*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("mlx/include/"):
                z.extract(name, root)
PY
  rm -rf "$cache"
  mv "$cache.partial" "$cache"
fi
include="$cache/mlx/include"

# The cxx bridges' generated headers (rust/cxx.h and mlx-backend/*.rs.h),
# which the Primitives include: from this checkout's Linux build.
gen=$(ls -dt target/*/build/mlx-backend-*/out/cxxbridge/include 2>/dev/null | head -1 || true)
if [ -z "$gen" ]; then
  cargo build --release --quiet --lib
  gen=$(ls -dt target/*/build/mlx-backend-*/out/cxxbridge/include | head -1)
fi
crate=$(dirname "$gen")/crate

files=$(find mlx-kernels-cpp -name 'metal.cpp' -o -name 'metal_*.cpp' | sort)
# The op builders that attach the Metal bodies, compiled as macOS compiles them.
files="$files $(ls mlx-kernels-cpp/{rms_norm/rms_norm,moe_combine/moe_combine,attention/attention,quantized_matmul/quantized_matmul,gate_qmv_silu_mul/gate_qmv_silu_mul}.cpp)"
status=0
for f in $files; do
  if ! g++ -fsyntax-only -std=c++20 -DMLX_BACKEND_METAL \
    -DMLX_BACKEND_METALLIB='"/nonexistent/mlx_backend.metallib"' \
    -DMLX_BACKEND_METAL_LIBRARY='"mlx_backend"' \
    -Wall -Wno-unused-parameter -Wno-deprecated-declarations \
    -I scripts/metal-check -I "$include" -I mlx-kernels-cpp -I "$gen" -I "$crate" "$f"; then
    echo "metal-check: $f failed" >&2
    status=1
  fi
done
shaders=$(find mlx-kernels-cpp -name '*.metal' | sort)
for f in $shaders; do
  if ! g++ -fsyntax-only -std=c++17 -x c++ -Wall -Wno-attributes -Wno-unknown-pragmas \
    -I scripts/metal-check/shader -I mlx-kernels-cpp -I "$include" "$f"; then
    echo "metal-check: $f failed" >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "metal-check: $(echo $files | wc -w) host files and $(echo $shaders | wc -w) shaders OK"
exit "$status"
