//! Seeded random numbers. Every generator takes an optional key (from
//! [`key`]) so results are reproducible; without one MLX's global key is used.

use super::{stream, wrap};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;

/// A PRNG key from a seed.
pub fn key(seed: u64) -> Result<Array, OpError> {
    wrap("random.key", ffi::random_key(seed))
}

/// Reseed MLX's global key.
pub fn seed(seed: u64) {
    ffi::random_seed(seed)
}

/// `num` independent keys from `key` (shape `[num, 2]`).
pub fn split(key: &Array, num: i32) -> Result<Array, OpError> {
    wrap(
        "random.split",
        ffi::random_split(key.inner(), num, stream()),
    )
}

/// Uniform in `[low, high)`.
pub fn uniform(
    low: f32,
    high: f32,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array, OpError> {
    let (lo, hi) = (Array::from_f32(low), Array::from_f32(high));
    // SAFETY: the key pointer is null or borrows an array for the call.
    wrap("random.uniform", unsafe {
        ffi::random_uniform(
            lo.inner(),
            hi.inner(),
            shape,
            dtype.code(),
            Array::ptr(key),
            stream(),
        )
    })
}

/// Normal with mean `loc` and standard deviation `scale`.
pub fn normal(
    shape: &[i32],
    dtype: Dtype,
    loc: f32,
    scale: f32,
    key: Option<&Array>,
) -> Result<Array, OpError> {
    // SAFETY: the key pointer is null or borrows an array for the call.
    wrap("random.normal", unsafe {
        ffi::random_normal(shape, dtype.code(), loc, scale, Array::ptr(key), stream())
    })
}

/// One sample per row from `softmax(logits)` along `axis` (uint32 indices).
pub fn categorical(logits: &Array, axis: i32, key: Option<&Array>) -> Result<Array, OpError> {
    // SAFETY: the key pointer is null or borrows an array for the call.
    wrap("random.categorical", unsafe {
        ffi::random_categorical(logits.inner(), axis, Array::ptr(key), stream())
    })
}

/// Standard Gumbel samples.
pub fn gumbel(shape: &[i32], dtype: Dtype, key: Option<&Array>) -> Result<Array, OpError> {
    // SAFETY: the key pointer is null or borrows an array for the call.
    wrap("random.gumbel", unsafe {
        ffi::random_gumbel(shape, dtype.code(), Array::ptr(key), stream())
    })
}
