//! quantized_matmul: `y = x·Wᵀ` on MLX affine-quantized weights (what
//! MLX's `quantized_matmul(x, w, scales, biases, transpose=true)` computes),
//! accumulated in f32 and rounded once to x's dtype.
//!
//! Contract: `x [..., K]` float; `w` a [`Quantized`] matrix
//! `[N, K·bits/32]` with `bits` 2, 3, 4, 5, 6 or 8 and `group_size` 32, 64
//! or 128 dividing K; scales and biases `[N, K/group_size]`. Output
//! `[..., N]` in x's dtype.
//!
//! Eligibility: x, scales and biases of one dtype (f16/bf16/f32), or f32 x
//! with f16/bf16 scales and biases (the result is then f32, as MLX
//! promotes); 4 or 8 bits. The CUDA body also needs groups of 32, 64 or 128
//! and K a multiple of 32; it takes any number of rows of x: up to
//! [`CUDA_QMV_MAX_ROWS`](super::CUDA_QMV_MAX_ROWS) run the decode kernels
//! (`common/qmv.cuh`), more the tiled kernels (`common/qmm.cuh`: tensor
//! cores for f16/bf16 x, exact f32 FMAs for f32 x). The Metal body has the
//! same group and K limits and takes at most
//! [`METAL_QMV_MAX_ROWS`](super::METAL_QMV_MAX_ROWS) rows (decode kernels
//! only, `common/metal_qmv.h`). Otherwise the op builds MLX's
//! `quantized_matmul`.
//!
//! [`quantized_matmul_with`] also picks the kernel's [`ActivationPrecision`]
//! (exact f32, or int8 activations with integer dot products); the fallback
//! graph ignores it.

mod bridge;
pub(crate) mod cpu;

use super::build::{build, quantized_k_eligibility};
use super::registry::{FallbackReason, Kernel};
use super::{ActivationPrecision, Backend, QuantSpec, WarmupSpec};
use crate::array::{list, Array};
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{stream, Quantized};

fn eligibility(backend: Backend, x: &Array, w: &Quantized) -> Result<(), FallbackReason> {
    let (dt, pt) = (x.dtype(), w.scales.dtype());
    let float = |t: Dtype| matches!(t, Dtype::F32 | Dtype::F16 | Dtype::BF16);
    if !float(dt) || !float(pt) || w.biases.dtype() != pt || (pt != dt && dt != Dtype::F32) {
        return Err(FallbackReason::UnsupportedDtype);
    }
    if !matches!(w.bits, 4 | 8) {
        return Err(FallbackReason::UnsupportedQuantization);
    }
    quantized_k_eligibility(backend, x, w.group_size)
}

/// `x·wᵀ`, `[..., K] → [..., N]`, in x's dtype promoted with the scales'
/// (exact activations).
pub fn quantized_matmul(x: &Array, w: &Quantized) -> Result<Array, OpError> {
    quantized_matmul_with(x, w, ActivationPrecision::Exact)
}

/// [`quantized_matmul`] with the CPU kernel's activation precision chosen.
pub fn quantized_matmul_with(
    x: &Array,
    w: &Quantized,
    activations: ActivationPrecision,
) -> Result<Array, OpError> {
    build(
        Kernel::QuantizedMatmul,
        |b| eligibility(b, x, w),
        |fused| {
            ffi::kernel_quantized_matmul(
                x.inner(),
                &list(&[&w.weight, &w.scales, &w.biases]),
                w.group_size,
                w.bits,
                activations.code(),
                fused,
                stream(),
            )
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("quantized_matmul"))
        },
    )
}

/// Warmup inputs: each `(K, N)` projection at decode (1 row) and, when
/// `prefill_rows > 1`, at prefill shape.
pub(crate) fn warmup_specs(
    projections: &[(i32, i32)],
    prefill_rows: i32,
    quant: QuantSpec,
    dtypes: &[Dtype],
) -> Vec<WarmupSpec> {
    let rows: &[i32] = if prefill_rows > 1 {
        &[1, prefill_rows]
    } else {
        &[1]
    };
    let mut specs = Vec::new();
    for &dtype in dtypes {
        for &(k, n) in projections {
            for &r in rows {
                specs.push(WarmupSpec {
                    kernel: Kernel::QuantizedMatmul,
                    dtype,
                    shape: vec![r, k, n],
                    quant: Some(quant),
                });
            }
        }
    }
    specs
}

/// Shape `[rows, K, N]`.
pub(crate) fn run_warmup(spec: &WarmupSpec, key: &Array) -> Result<Vec<Array>, OpError> {
    let quant = spec.quant.unwrap_or(QuantSpec {
        bits: 4,
        group_size: 64,
    });
    let (rows, k, n) = (spec.shape[0], spec.shape[1], spec.shape[2]);
    let normal = |shape: &[i32], scale: f32| {
        crate::ops::random::normal(shape, spec.dtype, 0.0, scale, Some(key))
    };
    let x = normal(&[rows, k], 1.0)?;
    let w = crate::ops::quantize(&normal(&[n, k], 0.05)?, quant.group_size, quant.bits)?;
    Ok(vec![quantized_matmul(&x, &w)?])
}
