//! attention: `softmax(q·kᵀ·scale)·v`, causal or unmasked, what MLX's
//! `fast::scaled_dot_product_attention` computes with mask mode `"causal"`
//! or `""`.
//!
//! Contract: `q [B, Hq, L, D]`, `k, v [B, Hkv, S, D]` of one float dtype,
//! Hq a multiple of Hkv (grouped-query attention). Causal is lower-right
//! aligned: query row `i` sees keys `0..=i + S - L`. Output `[B, Hq, L, D]`
//! in q's dtype. Views with a dense head axis (the KV cache's slices, the
//! heads' transpose) are read in place through their strides; other views
//! are copied dense first on the CPU and read through all four strides on
//! CUDA.
//!
//! Eligibility: no array mask; `S ≥ max(L, 1)` when causal, `S ≥ 1`
//! otherwise; on the CPU f32 q, k and v; on CUDA f32, f16 or bf16 and
//! head_dim ≤ 256, any number of query rows; on Metal the same dtypes,
//! head_dim ≤ 256 and at most [`METAL_ATTENTION_MAX_ROWS`] query rows.
//! Anything else builds MLX's
//! `fast::scaled_dot_product_attention` (an array mask with
//! [`FallbackReason::UnsupportedMask`]). The checks run in that order: a
//! mask MLX's op must take is reported as such before any shape limit.
//!
//! The CUDA body (`mlx-kernels-cpp/attention/cuda.cu`) has two kernels.
//! Up to 4 query rows per head (decode, a few speculative rows) it computes
//! one query row per block, its warps taking interleaved keys with an
//! online softmax in f32 that is merged at the end; with few rows and many
//! keys the keys are split over several blocks per row and merged by a
//! second kernel. With more rows (prefill) a block takes a tile of query
//! rows of one head and walks the key tiles up to its causal limit
//! (`attention/flash.cuh`, FlashAttention-2's scheme): tensor cores
//! (`mma.sync`, f32 accumulation) for f16/bf16, exact f32 arithmetic on
//! the CUDA cores for f32.

mod bridge;
pub(crate) mod cpu;

use super::build::build;
use super::registry::{FallbackReason, Kernel};
use super::{Backend, WarmupSpec};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{scaled_dot_product_attention, stream, AttentionMask};

/// The largest head_dim the CUDA body takes (`kCudaAttentionMaxHeadDim`);
/// the Metal body's limit too (32 lanes of 8 elements,
/// `attention/metal_args.h`).
pub const CUDA_ATTENTION_MAX_HEAD_DIM: i32 = 256;

/// The most query rows per head the Metal body takes (decode and a few
/// speculative rows; `kMetalAttentionMaxRows`): MLX's own Metal
/// `scaled_dot_product_attention` serves prefill.
pub const METAL_ATTENTION_MAX_ROWS: i32 = 4;

fn eligibility(
    backend: Backend,
    q: &Array,
    k: &Array,
    v: &Array,
    mask: &AttentionMask<'_>,
) -> Result<(), FallbackReason> {
    let dtype_ok = |t: Dtype| match backend {
        Backend::Cpu => t == Dtype::F32,
        _ => matches!(t, Dtype::F32 | Dtype::F16 | Dtype::BF16),
    };
    if [q, k, v].iter().any(|a| !dtype_ok(a.dtype())) {
        return Err(FallbackReason::UnsupportedDtype);
    }
    let (qs, ks) = (q.shape(), k.shape());
    // What no backend takes (the mask) is reported before one backend's
    // shape limits.
    match mask {
        AttentionMask::Array(_) => return Err(FallbackReason::UnsupportedMask),
        // Malformed shapes go to the fused op's contract check, which names them.
        _ if qs.len() != 4 || ks.len() != 4 => return Ok(()),
        AttentionMask::Causal if ks[2] < qs[2].max(1) => {
            return Err(FallbackReason::UnsupportedMask)
        }
        _ if ks[2] < 1 => return Err(FallbackReason::UnsupportedMask),
        _ => {}
    }
    let gpu = matches!(backend, Backend::Cuda | Backend::Metal);
    if (gpu && qs[3] > CUDA_ATTENTION_MAX_HEAD_DIM)
        || (backend == Backend::Metal && qs[2] > METAL_ATTENTION_MAX_ROWS)
    {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
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
