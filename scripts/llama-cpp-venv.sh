#!/usr/bin/env bash
# Developer-only: create (idempotently) a cached venv with llama-cpp-python,
# used to regenerate the llama.cpp side of tests/reference/default_model.json.
# Never used by CI.  llama-cpp-python builds llama.cpp from source: expect
# 10-20 minutes on a 2-core machine.  cmake/ninja come from PyPI as build deps.
#
# Usage: scripts/llama-cpp-venv.sh      -> prints the venv path on success
# Env:   MLX_BACKEND_CACHE (default ~/.cache/mlx-backend), PYTHON (default python3)
#        LLAMA_CPP_JOBS (default: nproc)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36

CACHE="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}"
VENV="$CACHE/llama-cpp-venv"
STAMP="$VENV/.installed-llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-noamx"
PY="${PYTHON:-python3}"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c 'import llama_cpp' >/dev/null 2>&1; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$CACHE"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
# llama-cpp-python's runtime dependencies (it is installed with --no-deps
# below so that pip never swaps the source build for another one).
"$VENV/bin/python" -m pip install --quiet typing-extensions numpy diskcache jinja2 >&2

JOBS="${LLAMA_CPP_JOBS:-$(nproc 2>/dev/null || echo 2)}"
# CPU-only, native ISA, no shared OpenMP surprises; tests/examples not built.
# AMX is left out: on VMs whose CPU reports AMX but whose kernel grants no
# AMX tile state (seen on a Xeon under firecracker), ggml's AMX path dies
# with SIGILL at the first matmul.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'}"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
export MAX_JOBS="$JOBS"

"$VENV/bin/python" -m pip install --no-cache-dir --verbose --force-reinstall --no-deps \
  "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2

"$VENV/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__)' >&2
touch "$STAMP"
echo "$VENV"
