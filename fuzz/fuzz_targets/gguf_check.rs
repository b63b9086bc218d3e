//! The GGUF structure checker must return Ok or Err for any bytes, never
//! panic, loop or allocate what the bytes claim.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mlx_backend::check_gguf(data);
});
