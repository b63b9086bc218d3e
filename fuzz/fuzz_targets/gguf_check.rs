//! The GGUF structure checker must return Ok or Err for any bytes, never
//! panic, loop or allocate what the bytes claim.
//!
//! Run from the repository root with nightly; the rpath that build.rs sets
//! reaches only the main crate's own binaries, so point the loader at libmlx:
//! `LD_LIBRARY_PATH=~/.cache/mlx-backend/mlx-0.32.4-cpu/mlx/lib cargo +nightly fuzz run gguf_check`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mlx_backend::check_gguf(data);
});
