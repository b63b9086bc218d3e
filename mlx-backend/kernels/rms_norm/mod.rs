//! RMSNorm, plain and fused with the residual add.
//!
//! Contract: `y = x · rsqrt(mean(x², last axis) + eps) · w`, accumulated in
//! f32 and cast back to x's dtype. `x` has any rank ≥ 1 (leading dims are
//! rows) and any hidden size; `w` is 1-D of length `x.shape[-1]`. Views
//! (transposes, slices, broadcasts) are made dense before the kernel reads
//! them. Gemma-style `(1 + w)` norms are a different op: pass `1 + w`.
//!
//! Eligibility for the CPU kernel: a CPU stream, `x` in f16/bf16/f32 and
//! `w` (and `residual`) of x's dtype. Anything else valid builds MLX's
//! `fast::rms_norm` (after the add for the residual form).

mod bf16_pairs;
mod bridge;
pub(crate) mod cpu;

use super::build::build;
use super::registry::{FallbackReason, Kernel};
use super::{Backend, WarmupSpec};
use crate::array::{unlist, Array};
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::stream;

/// The kernel's own verdict on its inputs (the registry adds switches and failures).
fn eligibility(_backend: Backend, x: &Array, others: &[&Array]) -> Result<(), FallbackReason> {
    let dt = x.dtype();
    if !matches!(dt, Dtype::F32 | Dtype::F16 | Dtype::BF16)
        || others.iter().any(|a| a.dtype() != dt)
    {
        return Err(FallbackReason::UnsupportedDtype);
    }
    Ok(())
}

/// `x · rsqrt(mean(x², -1) + eps) · weight`; see the module docs for the contract.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array, OpError> {
    build(
        Kernel::RmsNorm,
        |b| eligibility(b, x, &[weight]),
        |fused| {
            ffi::kernel_rms_norm(x.inner(), weight.inner(), eps, fused, stream())
                .map(Array::from_raw)
                .map_err(OpError::from_cxx("rms_norm"))
        },
    )
}

/// `(rms_norm(x + residual, weight, eps), x + residual)` in one pass over
/// the rows; `residual` has x's shape. The sum is rounded to x's dtype
/// before it is normalised, as the unfused ops do.
pub fn rms_norm_residual(
    x: &Array,
    residual: &Array,
    weight: &Array,
    eps: f32,
) -> Result<(Array, Array), OpError> {
    build(
        Kernel::RmsNorm,
        |b| eligibility(b, x, &[residual, weight]),
        |fused| {
            let l = ffi::kernel_rms_norm_residual(
                x.inner(),
                residual.inner(),
                weight.inner(),
                eps,
                fused,
                stream(),
            )
            .map_err(OpError::from_cxx("rms_norm_residual"))?;
            let mut parts = unlist(&l).into_iter();
            match (parts.next(), parts.next()) {
                (Some(normed), Some(sum)) => Ok((normed, sum)),
                _ => Err(OpError::new("rms_norm_residual", "expected two outputs")),
            }
        },
    )
}

/// Warmup inputs: decode and prefill rows at the given hidden sizes.
pub(crate) fn warmup_specs(hidden: &[i32], dtypes: &[Dtype]) -> Vec<WarmupSpec> {
    let mut specs = Vec::new();
    for &dtype in dtypes {
        for &h in hidden {
            for rows in [1, 64] {
                specs.push(WarmupSpec {
                    kernel: Kernel::RmsNorm,
                    dtype,
                    shape: vec![rows, h],
                    quant: None,
                });
            }
        }
    }
    specs
}

pub(crate) fn run_warmup(spec: &WarmupSpec, key: &Array) -> Result<Vec<Array>, OpError> {
    let hidden = *spec.shape.last().unwrap_or(&1);
    let x = crate::ops::random::normal(&spec.shape, spec.dtype, 0.0, 1.0, Some(key))?;
    let w = crate::ops::random::normal(&[hidden], spec.dtype, 1.0, 0.1, Some(key))?;
    let (normed, sum) = rms_norm_residual(&x, &x, &w, 1e-5)?;
    Ok(vec![rms_norm(&x, &w, 1e-5)?, normed, sum])
}

/// The vjp of the op (fused Primitive or fallback graph) with respect to
/// every primal: `[x, w]`, or `[x, residual, w]` for the residual form
/// (then `cotangents` holds one per output).
#[cfg(feature = "testing")]
pub(crate) fn vjp(
    primals: &[&Array],
    cotangents: &[&Array],
    eps: f32,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    let kernel = if primals.len() == 3 { 1 } else { 0 };
    let l = ffi::kernel_vjp(
        kernel,
        fused,
        &crate::array::list(primals),
        &crate::array::list(cotangents),
        eps,
        stream(),
    )
    .map_err(OpError::from_cxx("rms_norm vjp"))?;
    Ok(unlist(&l))
}
