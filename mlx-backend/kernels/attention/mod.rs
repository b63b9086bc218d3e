//! attention: `softmax(q·kᵀ·scale)·v`, causal or unmasked, what MLX's
//! `fast::scaled_dot_product_attention` computes with mask mode `"causal"`
//! or `""`.
//!
//! Contract: `q [B, Hq, L, D]`, `k, v [B, Hkv, S, D]` of one float dtype,
//! Hq a multiple of Hkv (grouped-query attention). Causal is lower-right
//! aligned: query row `i` sees keys `0..=i + S - L`. Output `[B, Hq, L, D]`
//! in q's dtype. Views (the KV cache's slices, the heads' transpose) are
//! made dense before the kernel reads them.
//!
//! Eligibility for the CPU kernel: a CPU stream; f32 q, k and v; no array
//! mask; `S ≥ max(L, 1)` when causal, `S ≥ 1` otherwise. Anything else
//! builds MLX's `fast::scaled_dot_product_attention` (an array mask with
//! [`FallbackReason::UnsupportedMask`]).

pub(crate) mod cpu;

use super::registry::{FallbackReason, Kernel};
use super::{build, Backend, WarmupSpec};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{scaled_dot_product_attention, stream, AttentionMask};

/// On by default: see README.md, "Kernels", for the benchmark.
pub(crate) const DEFAULT_ENABLED: bool = true;

fn eligibility(
    _backend: Backend,
    q: &Array,
    k: &Array,
    v: &Array,
    mask: &AttentionMask<'_>,
) -> Result<(), FallbackReason> {
    if [q, k, v].iter().any(|a| a.dtype() != Dtype::F32) {
        return Err(FallbackReason::UnsupportedDtype);
    }
    let (qs, ks) = (q.shape(), k.shape());
    match mask {
        AttentionMask::Array(_) => Err(FallbackReason::UnsupportedMask),
        // Malformed shapes go to the fused op's contract check, which names them.
        _ if qs.len() != 4 || ks.len() != 4 => Ok(()),
        AttentionMask::Causal if ks[2] < qs[2].max(1) => Err(FallbackReason::UnsupportedMask),
        _ if ks[2] < 1 => Err(FallbackReason::UnsupportedMask),
        _ => Ok(()),
    }
}

/// `softmax(q·kᵀ·scale + mask)·v`, `q [B, Hq, L, D]`, `k, v [B, Hkv, S, D]`.
pub fn attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array, OpError> {
    build(
        Kernel::Attention,
        |b| eligibility(b, q, k, v, &mask),
        |fused| {
            let causal = match mask {
                AttentionMask::None => false,
                AttentionMask::Causal => true,
                AttentionMask::Array(_) => {
                    return scaled_dot_product_attention(q, k, v, scale, mask)
                }
            };
            ffi::kernel_attention(
                q.inner(),
                k.inner(),
                v.inner(),
                scale,
                causal,
                fused,
                stream(),
            )
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("attention"))
        },
    )
}

/// Warmup inputs per `(Hq, Hkv, D)`: a decode step (1 query over 128 keys)
/// and a causal prefill of 64 tokens.
pub(crate) fn warmup_specs(heads: &[(i32, i32, i32)], dtypes: &[Dtype]) -> Vec<WarmupSpec> {
    let mut specs = Vec::new();
    for &dtype in dtypes {
        for &(hq, hkv, d) in heads {
            for (l, s) in [(1, 128), (64, 64)] {
                specs.push(WarmupSpec {
                    kernel: Kernel::Attention,
                    dtype,
                    shape: vec![1, hq, hkv, l, s, d],
                    quant: None,
                });
            }
        }
    }
    specs
}

/// Shape `[B, Hq, Hkv, L, S, D]`; causal when `L > 1`.
pub(crate) fn run_warmup(spec: &WarmupSpec, key: &Array) -> Result<Vec<Array>, OpError> {
    let [b, hq, hkv, l, s, d] = spec.shape[..] else {
        return Err(OpError::new(
            "attention warmup",
            format!("shape {:?} is not [B, Hq, Hkv, L, S, D]", spec.shape),
        ));
    };
    let normal = |shape: &[i32]| crate::ops::random::normal(shape, spec.dtype, 0.0, 1.0, Some(key));
    let q = normal(&[b, hq, l, d])?;
    let k = normal(&[b, hkv, s, d])?;
    let v = normal(&[b, hkv, s, d])?;
    let mask = if l > 1 {
        AttentionMask::Causal
    } else {
        AttentionMask::None
    };
    Ok(vec![attention(&q, &k, &v, 1.0 / (d as f32).sqrt(), mask)?])
}
