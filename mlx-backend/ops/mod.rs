//! Ops over [`Array`], as methods and free functions. Every op
//! is built on the current stream ([`crate::Stream::scope`]) and returns
//! `Result<Array, OpError>`: MLX validates shapes, axes and dtypes while the
//! graph is built, and a bad call leaves the graph untouched.

mod elementwise;
mod fast;
mod indexing;
mod linalg;
mod quantized;
pub mod random;
mod reduce;
mod shape;

pub use fast::{scaled_dot_product_attention, AttentionMask, RopeOffset};
pub use indexing::{concatenate, split, stack, where_};
pub use quantized::{quantize, QuantSpec, Quantized};

use crate::array::Array;
use crate::device::current_spec;
use crate::error::OpError;
use crate::ffi;
use cxx::UniquePtr;

/// Wrap a bridge result for op `op`.
pub(crate) fn wrap(
    op: &'static str,
    r: Result<UniquePtr<ffi::array>, cxx::Exception>,
) -> Result<Array, OpError> {
    r.map(Array::from_raw).map_err(OpError::from_cxx(op))
}

pub(crate) fn stream() -> ffi::StreamSpec {
    current_spec()
}
