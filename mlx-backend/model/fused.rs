//! The fused ops the model layers call. Each has a custom Primitive with a
//! CPU kernel in `crate::kernels` where eligible; these entry points keep the
//! layers independent of which path runs.

use crate::ops::Quantized;
use crate::{Array, OpError};

/// RMSNorm over the last axis with a learned scale.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array, OpError> {
    x.rms_norm_mlx(Some(weight), eps)
}

/// `silu(x·Wgᵀ) ⊙ (x·Wuᵀ)` for quantized gate/up projections.
pub fn gate_qmv_silu_mul(x: &Array, gate: &Quantized, up: &Quantized) -> Result<Array, OpError> {
    gate.matmul(x, true)?.silu()?.mul(&up.matmul(x, true)?)
}

/// The expert-indexed form: `x [..., K]`, `indices [..., k]` → `[..., k, N]`.
pub fn gather_gate_qmv_silu_mul(
    x: &Array,
    indices: &Array,
    gate: &Quantized,
    up: &Quantized,
) -> Result<Array, OpError> {
    let xe = x.expand_dims(&[-2, -3])?;
    let g = gate.gather_matmul(&xe, None, Some(indices), true, false)?;
    let u = up.gather_matmul(&xe, None, Some(indices), true, false)?;
    g.silu()?.mul(&u)?.squeeze(&[-2])
}

/// `Σ_k y[..., k, :] · scores[..., k]`.
pub fn moe_combine(y: &Array, scores: &Array) -> Result<Array, OpError> {
    y.mul(&scores.expand_dims(&[-1])?)?
        .sum(&[-2], false)?
        .astype(y.dtype())
}
