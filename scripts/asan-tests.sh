#!/usr/bin/env bash
# The whole test suite under AddressSanitizer: our Rust code and the C++
# bridge and Primitives are instrumented (out-of-bounds and use-after-free
# reads and writes, double frees); libmlx is not instrumented, but every
# malloc/free it makes goes through ASan's allocator, so heap corruption
# anywhere is caught at the free. Needs a nightly toolchain (rustup
# installs it: `rustup toolchain install nightly`). Run by hand, not in CI
# (a separate build of everything, ~2x slower tests); docs/reliability.md has
# the recorded result.
#
#   scripts/asan-tests.sh [extra cargo test arguments, e.g. --test runner]
#
# Leak checking is off: MLX keeps its allocator, scheduler and caches alive
# until exit on purpose; tests/memory_leak.rs checks our own leaks.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
export RUSTDOCFLAGS="$RUSTFLAGS"
# The C++ bridge and Primitives (compiled by build.rs through cc).
export CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/asan}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=0}"

# --target keeps the sanitizer off build scripts and proc-macros.
cargo +nightly test --release --target "$TARGET" "$@"
