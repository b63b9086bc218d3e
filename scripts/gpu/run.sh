#!/usr/bin/env bash
# On the GPU machine: assemble the parts packed by scripts/gpu/pack.sh
# (stashed in /tmp/mlx-backend-gpu by earlier calls, or carried in this
# one), then run the GPU checks and write a report.
#
#   scripts/gpu/run.sh [tests|checks|generate|bench|kernels|peer|mlx-checks|synthetic|all] [.gpu/<part> ...]
#
# tests     every packed test binary with MLX's default device the GPU
# generate  the generate example on the GPU (the known greedy answer)
# bench     bench_one_batch --no-peers on the GPU
# kernels   the GPU kernel bench (benches/gpu_kernels.rs)
# checks    the standalone kernel checks (scripts/gpu/checks: every tile and
#           layout of the prefill qmm and attention kernels against float64
#           references, with their timings); `--quick` forms
# peer      the default model through mlx-lm on the GPU (benches/peers/bench_peers.py,
#           the workloads of bench), right after ours: run it in the call
#           that runs bench, for a side-by-side ratio
# mlx-checks MLX's own CUDA ops against its CPU ops (scripts/gpu/mlx_checks.py):
#           which built-ins a GPU test may take as its reference
# synthetic for each published shape in GPU_SYNTHETIC (default: qwen3-0.6b
#           qwen1.5-moe-a2.7b), bench_one_batch --synthetic on ours, then
#           mlx-lm on the same folder
# Reports and logs go to $OUT (the device tool returns it), else ./gpu-report.
# Env: GPU_TESTS         only these tests: test binary names (without hash),
#                        each whole or as NAME:FILTER for the tests whose name
#                        contains FILTER (e.g. `kernels:attention:: models_tiny`)
#      GPU_TEST_TIMEOUT  seconds one test may take (default 300)
#      GPU_TEST_JOBS     tests run at once on the one GPU, a process each (default 8)
set -uo pipefail
WHAT="${1:-all}"
shift || true
STASH=/tmp/mlx-backend-gpu
mkdir -p "$STASH"
for p in "$@"; do cp "$p" "$STASH/"; done
REPORT_DIR="${OUT:-$PWD/gpu-report}"
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/report.md"
APP=/opt/mlx-backend-gpu

for kind in base app; do
  if ls "$STASH/$kind.tar.xz.part-"* >/dev/null 2>&1; then
    cat "$STASH/$kind.tar.xz.part-"* | xz -d | tar -C / -xf - ||
      { echo "run: the $kind parts do not assemble (a part missing? the machine went cold?)"; exit 3; }
  fi
done
[[ -d "$APP/deps" ]] || { echo "run: nothing unpacked: carry the parts first (docs/gpu.md)"; exit 3; }

# CUDA 13 libraries from the machine's Python (PyTorch's nvidia wheels).
NV="$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia"
for d in "$NV"/*/lib; do LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
export LD_LIBRARY_PATH
# The tests compare float32 results with float32 references and goldens:
# MLX's float32 matmuls use TF32 on the GPU unless told otherwise.
export MLX_ENABLE_TF32="${MLX_ENABLE_TF32:-0}"
# MLX's compiled CUDA kernels (NVRTC) survive between runs of one call.
export MLX_PTX_CACHE_DIR=/tmp/mlx-backend-gpu/ptx-cache
GEN="$APP/examples/generate"
missing="$(ldd "$GEN" | grep 'not found' || true)"
if [[ -n "$missing" ]]; then
  echo "run: unresolved libraries:"; echo "$missing"; exit 3
fi

{
  echo "# GPU run"
  echo
  echo "- machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "- date: $(date -u +%FT%TZ)"
  echo
} >"$REPORT"

status=0
# One test (binary and name) in a process of its own: a slow test cannot
# hold back the others, a CUDA fault cannot poison them, and its panic
# message is in its own log. Writes a result line to $REPORT_DIR/rows/.
run_one_test() {
  local t="$1" test="$2" name log rc
  name="$(basename "$t")"
  log="$REPORT_DIR/logs/${name%-*}.$test.log"
  timeout "${GPU_TEST_TIMEOUT:-300}" "$t" --exact "$test" --test-threads=1 >"$log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "ok" >"$REPORT_DIR/rows/${name%-*}.$test"
    rm -f "$log"
  else
    echo "rc=$rc" >"$REPORT_DIR/rows/${name%-*}.$test"
  fi
}
export -f run_one_test
export REPORT_DIR

if [[ "$WHAT" == all || "$WHAT" == tests ]]; then
  mkdir -p "$REPORT_DIR/rows" "$REPORT_DIR/logs"
  start=$SECONDS
  for t in "$APP"/deps/*; do
    name="$(basename "$t")"
    bin="${name%-*}"
    # Whole binaries, or the tests of a binary whose names hold a filter.
    want=all
    filters=()
    if [[ -n "${GPU_TESTS:-}" ]]; then
      want=none
      for entry in $GPU_TESTS; do
        if [[ "$entry" == "$bin" ]]; then
          want=all
          break
        elif [[ "$entry" == "$bin:"* ]]; then
          want=some
          filters+=("${entry#*:}")
        fi
      done
    fi
    [[ $want == none ]] && continue
    "$t" --list --format terse 2>/dev/null | sed -n 's/: test$//p' | while read -r test; do
      if [[ $want == some ]]; then
        hit=no
        for f in "${filters[@]}"; do [[ "$test" == *"$f"* ]] && hit=yes; done
        [[ $hit == yes ]] || continue
      fi
      echo "$t $test"
    done
  done | xargs -P "${GPU_TEST_JOBS:-8}" -L 1 bash -c 'run_one_test "$1" "$2"' _
  echo "| test binary | passed | failed (exit code) |" >>"$REPORT"
  echo "| --- | --- | --- |" >>"$REPORT"
  for bin in $(ls "$REPORT_DIR/rows" | sed 's/\..*//' | sort -u); do
    ok=0; failed=""
    for f in "$REPORT_DIR/rows/$bin".*; do
      if [[ "$(cat "$f")" == ok ]]; then ok=$((ok + 1)); else failed="$failed ${f##*/$bin.} ($(cat "$f"))"; fi
    done
    echo "| $bin | $ok | ${failed:- } |" >>"$REPORT"
    [[ -n "$failed" ]] && status=1
  done
  echo >>"$REPORT"
  echo "tests: $((SECONDS - start)) s, ${GPU_TEST_JOBS:-8} at a time" >>"$REPORT"
  # The logs of failed tests, in one file (the tool returns few files).
  for f in "$REPORT_DIR"/logs/*.log; do
    [[ -e "$f" ]] || continue
    echo "=== $(basename "$f" .log)"
    grep -E -B2 -A12 "panicked at|^error" "$f" | head -40
    tail -n 3 "$f"
  done >"$REPORT_DIR/failures.txt"
  rm -rf "$REPORT_DIR/rows" "$REPORT_DIR/logs"
fi
if [[ "$WHAT" == all || "$WHAT" == checks ]]; then
  for c in "$APP"/checks/*; do
    [[ -x "$c" ]] || continue
    name="$(basename "$c")"
    args=()
    [[ "$name" == qmm_check ]] && args=(--quick)
    "$c" "${args[@]}" >"$REPORT_DIR/$name.txt" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    {
      echo
      echo "## $name (exit $rc; full output in $name.txt)"
      echo '```'
      grep -E "FAIL|cases|failed|error" "$REPORT_DIR/$name.txt" | head -40
      echo '```'
    } >>"$REPORT"
  done
fi
if [[ "$WHAT" == all || "$WHAT" == generate ]]; then
  echo >>"$REPORT"
  echo '## generate --device gpu' >>"$REPORT"
  echo '```' >>"$REPORT"
  "$GEN" --device gpu --prompt "What is the capital of France?" --max-tokens 32 >>"$REPORT" 2>&1 || status=1
  echo '```' >>"$REPORT"
fi
if [[ "$WHAT" == all || "$WHAT" == bench ]]; then
  echo >>"$REPORT"
  echo '## bench_one_batch --no-peers (GPU)' >>"$REPORT"
  echo '```' >>"$REPORT"
  "$APP/examples/bench_one_batch" --no-peers --prefill 32,512 --decode-batch 1,8,32 --decode-steps 32 >>"$REPORT" 2>&1 || status=1
  echo '```' >>"$REPORT"
fi
if [[ "$WHAT" == peer || "$WHAT" == synthetic || "$WHAT" == mlx-checks ]]; then
  # MLX's Python package: the CUDA layout's mlx/ (libmlx and its kernels)
  # with the cp312 bindings unpacked over it, and mlx-lm beside it.
  PY=/tmp/mlx-backend-gpu/python
  # The binaries' RUNPATH is the layout's mlx/lib.
  LIB="$(readelf -d "$GEN" | sed -n 's/.*R[UN]*PATH.*\[\(.*\)\]/\1/p' | tr ':' '\n' | grep '/mlx/lib$' | head -1)"
  if [[ ! -d "$PY/mlx_lm" ]]; then
    rm -rf "$PY" && mkdir -p "$PY"
    cp -r "$(dirname "$LIB")" "$PY/mlx"
    cp -r "$(dirname "$(dirname "$LIB")")/mlx_cuda_13.libs" "$PY/"
    for w in "$APP"/peer/*.whl; do python3 -m zipfile -e "$w" "$PY/"; done
  fi
fi
if [[ "$WHAT" == mlx-checks ]]; then
  echo >>"$REPORT"
  echo "## MLX's CUDA ops against its CPU ops (scripts/gpu/mlx_checks.py)" >>"$REPORT"
  PYTHONPATH="$PY" python3 scripts/gpu/mlx_checks.py >>"$REPORT" 2>&1 || status=1
fi
if [[ "$WHAT" == synthetic ]]; then
  for shape in ${GPU_SYNTHETIC:-qwen3-0.6b qwen1.5-moe-a2.7b}; do
    echo >>"$REPORT"
    echo "## $shape (synthetic, 4-bit g64): ours, then mlx-lm" >>"$REPORT"
    echo '```' >>"$REPORT"
    "$APP/examples/bench_one_batch" --no-peers --synthetic "$shape" --prefill 512 \
      --decode-batch 1,8,32 --decode-steps 32 >>"$REPORT" 2>&1 || status=1
    PYTHONPATH="$PY" python3 benches/peers/bench_peers.py --engine mlx_lm --device gpu \
      --hf-folder "$(dirname "$(dirname "$(dirname "$LIB")")")/synthetic/$shape-q4g64-seed0" \
      --prefill 512 --decode-batch 1,8,32 --decode-steps 32 >>"$REPORT" 2>>"$REPORT_DIR/peer.log" || status=1
    echo '```' >>"$REPORT"
  done
fi
if [[ "$WHAT" == peer ]]; then
  echo >>"$REPORT"
  echo '## mlx-lm on the GPU (benches/peers/bench_peers.py --device gpu)' >>"$REPORT"
  echo '```' >>"$REPORT"
  PYTHONPATH="$PY" python3 benches/peers/bench_peers.py --engine mlx_lm --device gpu \
    --gguf "$(dirname "$(dirname "$(dirname "$LIB")")")/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --prefill 32,512 --decode-batch 1,8,32 --decode-steps 32 >>"$REPORT" 2>"$REPORT_DIR/peer.log" || status=1
  echo '```' >>"$REPORT"
fi
if [[ "$WHAT" == all || "$WHAT" == kernels ]]; then
  echo >>"$REPORT"
  echo '## GPU kernels against MLX built-ins (benches/gpu_kernels.rs)' >>"$REPORT"
  "$APP/benches/gpu_kernels" >>"$REPORT" 2>&1 || status=1
fi
cat "$REPORT"
exit $status
