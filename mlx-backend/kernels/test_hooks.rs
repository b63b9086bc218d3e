//! Hooks for this crate's own integration tests (`tests/`), with feature
//! `testing` only: forcing and forgetting kernel failures, and the kernels'
//! vjps (the fused Primitive's against the fallback graph's). They exist so
//! those tests can reach states and paths that serving never takes; they
//! are not part of the stable API and may change at any time.

use super::registry::{self, Kernel};
use crate::array::Array;
use crate::error::OpError;

/// The kernel's next invocation of its CPU body fails as if the body had
/// returned an error (`fail: false` withdraws a pending one).
pub fn force_failure(kernel: Kernel, fail: bool) {
    registry::force_failure(kernel, fail);
}

/// Forgets a recorded failure of the kernel on every backend, so later op
/// builds use its body again.
pub fn clear_failure(kernel: Kernel) {
    registry::clear_failure(kernel);
}

/// The vjp of [`rms_norm`](super::rms_norm()) (fused Primitive or fallback
/// graph, by `fused`) with respect to every primal: `primals` is `[x, w]`,
/// or `[x, residual, w]` for [`rms_norm_residual`](super::rms_norm_residual())
/// (then `cotangents` holds one per output).
pub fn rms_norm_vjp(
    primals: &[&Array],
    cotangents: &[&Array],
    eps: f32,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    super::rms_norm::vjp(primals, cotangents, eps, fused)
}

/// The vjp of [`moe_combine`](super::moe_combine()) (fused Primitive or
/// fallback graph, by `fused`) with respect to `[y, scores]`.
pub fn moe_combine_vjp(
    y: &Array,
    scores: &Array,
    cotangent: &Array,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    super::moe_combine::vjp(y, scores, cotangent, fused)
}
