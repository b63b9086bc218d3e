//! MoE combine: the weighted sum of each token's top-k expert outputs.
//!
//! Contract: `out[..., h] = Σ_k y[..., k, h] · scores[..., k]`, accumulated
//! in f32 in ascending k (multiply, then add), cast to y's dtype. `y` has
//! rank ≥ 3 (`[..., top_k, hidden]`, leading dims flatten into rows and come
//! back) and `scores.shape == y.shape[:-1]`. y and scores are f16, bf16 or
//! f32, independently. The output has y's dtype and shape `[..., hidden]`.
//!
//! Bodies: CPU (Rust), CUDA and Metal. Every valid dtype pair is covered;
//! the GPU bodies take up to 64 experts per token (more build the fallback). The
//! fallback is `sum(f32(y) · f32(scores)[..., None], -2)` cast to y's dtype.

mod bridge;
pub(crate) mod cpu;

use super::build::build;
use super::registry::{FallbackReason, Kernel};
use super::{Backend, WarmupSpec};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::stream;

/// The CUDA body keeps each row's top-k weights in shared memory.
const CUDA_MAX_TOP_K: i32 = 64;

/// Every valid dtype pair is covered on every backend; the GPU bodies (CUDA
/// and Metal) take up to [`CUDA_MAX_TOP_K`] experts per token.
fn eligibility(backend: Backend, y: &Array) -> Result<(), FallbackReason> {
    let shape = y.shape();
    let top_k = shape.len().checked_sub(2).map_or(0, |i| shape[i]);
    if matches!(backend, Backend::Cuda | Backend::Metal) && top_k > CUDA_MAX_TOP_K {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}

/// Combines expert outputs `y [..., top_k, hidden]` with `scores [..., top_k]`.
pub fn moe_combine(y: &Array, scores: &Array) -> Result<Array, OpError> {
    build(
        Kernel::MoeCombine,
        |b| eligibility(b, y),
        |fused| {
            ffi::kernel_moe_combine(y.inner(), scores.inner(), fused, stream())
                .map(Array::from_raw)
                .map_err(OpError::from_cxx("moe_combine"))
        },
    )
}

/// Warmup inputs: one decode and one prefill token count at each hidden size.
pub(crate) fn warmup_specs(hidden: &[i32], top_k: i32, dtypes: &[Dtype]) -> Vec<WarmupSpec> {
    let mut specs = Vec::new();
    for &dtype in dtypes {
        for &h in hidden {
            for tokens in [1, 64] {
                specs.push(WarmupSpec {
                    kernel: Kernel::MoeCombine,
                    dtype,
                    shape: vec![tokens, top_k, h],
                    quant: None,
                });
            }
        }
    }
    specs
}

pub(crate) fn run_warmup(spec: &WarmupSpec, key: &Array) -> Result<Vec<Array>, OpError> {
    let y = crate::ops::random::normal(&spec.shape, spec.dtype, 0.0, 1.0, Some(key))?;
    let scores_shape = &spec.shape[..spec.shape.len() - 1];
    let scores = crate::ops::random::normal(scores_shape, Dtype::F32, 0.0, 1.0, Some(key))?;
    Ok(vec![moe_combine(&y, &scores)?])
}

/// The vjp of the op (fused or fallback) with respect to `[y, scores]`.
#[cfg(feature = "testing")]
pub(crate) fn vjp(
    y: &Array,
    scores: &Array,
    cotangent: &Array,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    let l = ffi::kernel_vjp(
        2,
        fused,
        &crate::array::list(&[y, scores]),
        &crate::array::list(&[cotangent]),
        0.0,
        stream(),
    )
    .map_err(OpError::from_cxx("moe_combine vjp"))?;
    Ok(crate::array::unlist(&l))
}
