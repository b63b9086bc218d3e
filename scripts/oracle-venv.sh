#!/usr/bin/env bash
# Developer-only: create (idempotently) a cached venv with MLX (CPU build),
# mlx-lm, numpy and gguf, used to regenerate tests/reference/default_model.json.
# Never used by CI.
#
# Usage: scripts/oracle-venv.sh      -> prints the venv path on success
# Env:   MLX_BACKEND_CACHE (default ~/.cache/mlx-backend), PYTHON (default python3)
set -euo pipefail

PINS=(
  "mlx==0.32.4"
  "mlx-cpu==0.32.4"
  "mlx-lm==0.32.2"
  "numpy==2.4.6"
  "gguf==0.19.0"
  "transformers==5.24.0"
  "tokenizers==0.23.3"
)

CACHE="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}"
VENV="$CACHE/oracle-venv"
KEY="$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-16)"
STAMP="$VENV/.installed-$KEY"
PY="${PYTHON:-python3}"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c 'import mlx.core, mlx_lm, numpy, gguf' >/dev/null 2>&1; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$CACHE"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}" >&2
"$VENV/bin/python" - >&2 <<'PYEOF'
import mlx.core as mx, mlx_lm, numpy, gguf
from importlib.metadata import version
print("mlx", version("mlx"), "mlx-cpu", version("mlx-cpu"), "mlx-lm", version("mlx-lm"),
      "numpy", numpy.__version__, "gguf", version("gguf"), "device", mx.default_device())
PYEOF
rm -f "$VENV"/.installed-*
touch "$STAMP"
echo "$VENV"
