//! The register-blocked quantized dot products: each unpacked weight
//! vector feeds several x rows and each x vector several weight rows, so
//! one body serves decode (1 row), batched decode and prefill alike.
//! [`avx512`] works in 16-word blocks (exact f32, int16 through VNNI, bf16
//! pairs), [`avx2`] in 8-word blocks (exact f32, prescaled f32, int16
//! through `vpmaddwd`). [`super::dispatch`] picks between them by how x was
//! prepared. Both are one walk ([`walk`]) over their width's registers.

pub(crate) mod avx2;
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod walk;

/// Weight rows per pass over the chunks of x rows (so a tile's rows stay
/// in cache while every x row meets them).
const TILE: usize = 16;
