//! gate-QMV-SiLU-mul: the SwiGLU input projection on MLX affine-quantized
//! weights, `out = silu(x·Wgᵀ) ⊙ (x·Wuᵀ)`, both projections in one pass over x.
//!
//! Contract: `x [..., K]` float; `gate` and `up` are [`Quantized`] matrices
//! `[N, K·bits/32]` (dense form) or expert stacks `[E, N, K·bits/32]`
//! (expert-indexed form) sharing one `bits` (2, 3, 4, 5, 6 or 8) and
//! `group_size` (32, 64 or 128, dividing K); scales and biases are
//! `[..., N, K/group_size]`. Dense: `[..., K] → [..., N]`. Expert-indexed
//! (mlx-lm's SwitchGLU): integer `indices [..., top_k]` with x's leading
//! dims give `[..., top_k, N]`. Rounding follows the unfused graph
//! (each projection, the sigmoid, silu and the product round to x's dtype).
//!
//! Eligibility: x, scales and biases of one dtype (f16/bf16/f32), or f32 x
//! with f16/bf16 scales and biases (the result is then f32, as MLX
//! promotes); 4 or 8 bits. The GPU bodies (CUDA and Metal, dense and
//! expert-indexed) also
//! need groups of 32, 64 or 128, K a multiple of 32 and at most
//! `CUDA_QMV_MAX_ROWS` (4) rows of x (decode-size batches; MLX's own
//! quantized matmul is faster from 5 rows on). Other valid quantizations (e.g.
//! 3-bit) build the fallback: `quantized_matmul` (dense) or `gather_qmm`
//! with `rhs_indices` (expert-indexed), then `silu(g) * u`.
//!
//! The `_with` forms also pick the kernel's [`ActivationPrecision`] (exact
//! f32, or int8 activations with integer dot products); the fallback graph
//! ignores it.

mod bridge;
pub(crate) mod cpu;

use super::build::{build, quantized_shape_eligibility};
use super::registry::{FallbackReason, Kernel};
use super::{ActivationPrecision, Backend, QuantSpec, WarmupSpec};
use crate::array::{list, Array};
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{stream, Quantized};

fn eligibility(
    backend: Backend,
    x: &Array,
    gate: &Quantized,
    up: &Quantized,
) -> Result<(), FallbackReason> {
    let (dt, pt) = (x.dtype(), gate.scales.dtype());
    let float = |t: Dtype| matches!(t, Dtype::F32 | Dtype::F16 | Dtype::BF16);
    let params = [&gate.scales, &gate.biases, &up.scales, &up.biases];
    if !float(dt)
        || !float(pt)
        || params.iter().any(|a| a.dtype() != pt)
        || (pt != dt && dt != Dtype::F32)
    {
        return Err(FallbackReason::UnsupportedDtype);
    }
    if !matches!(gate.bits, 4 | 8) {
        return Err(FallbackReason::UnsupportedQuantization);
    }
    quantized_shape_eligibility(backend, x, gate.group_size)
}

/// The expert-indexed form: the dense form's limits, and (on CUDA) one
/// grid row per (row, expert) pair.
fn gather_eligibility(
    backend: Backend,
    x: &Array,
    indices: &Array,
    gate: &Quantized,
    up: &Quantized,
) -> Result<(), FallbackReason> {
    eligibility(backend, x, gate, up)?;
    if backend == Backend::Cuda && indices.size() > 65535 {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}

fn check_shared_params(gate: &Quantized, up: &Quantized) -> Result<(), OpError> {
    if (gate.bits, gate.group_size) != (up.bits, up.group_size) {
        return Err(OpError::new(
            "gate_qmv_silu_mul",
            format!(
                "gate ({} bits, group {}) and up ({} bits, group {}) must share quantization parameters",
                gate.bits, gate.group_size, up.bits, up.group_size
            ),
        ));
    }
    Ok(())
}

fn parts(q: &Quantized) -> cxx::UniquePtr<ffi::ArrayList> {
    list(&[&q.weight, &q.scales, &q.biases])
}

/// Dense form: `silu(x·gateᵀ) ⊙ (x·upᵀ)`, `[..., K] → [..., N]` (exact activations).
pub fn gate_qmv_silu_mul(x: &Array, gate: &Quantized, up: &Quantized) -> Result<Array, OpError> {
    gate_qmv_silu_mul_with(x, gate, up, ActivationPrecision::Exact)
}

/// [`gate_qmv_silu_mul`] with the CPU kernel's activation precision chosen.
pub fn gate_qmv_silu_mul_with(
    x: &Array,
    gate: &Quantized,
    up: &Quantized,
    activations: ActivationPrecision,
) -> Result<Array, OpError> {
    check_shared_params(gate, up)?;
    build(
        Kernel::GateQmvSiluMul,
        |b| eligibility(b, x, gate, up),
        |fused| {
            ffi::kernel_gate_qmv_silu_mul(
                x.inner(),
                &parts(gate),
                &parts(up),
                gate.group_size,
                gate.bits,
                activations.code(),
                fused,
                stream(),
            )
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("gate_qmv_silu_mul"))
        },
    )
}

/// Expert-indexed form: row `[..., j]` of the output uses expert
/// `indices[..., j]`; `x [..., K]`, `indices [..., top_k]` → `[..., top_k, N]`
/// (exact activations).
pub fn gather_gate_qmv_silu_mul(
    x: &Array,
    indices: &Array,
    gate: &Quantized,
    up: &Quantized,
) -> Result<Array, OpError> {
    gather_gate_qmv_silu_mul_with(x, indices, gate, up, ActivationPrecision::Exact)
}

/// [`gather_gate_qmv_silu_mul`] with the CPU kernel's activation precision chosen.
pub fn gather_gate_qmv_silu_mul_with(
    x: &Array,
    indices: &Array,
    gate: &Quantized,
    up: &Quantized,
    activations: ActivationPrecision,
) -> Result<Array, OpError> {
    check_shared_params(gate, up)?;
    build(
        Kernel::GateQmvSiluMul,
        |b| gather_eligibility(b, x, indices, gate, up),
        |fused| {
            ffi::kernel_gather_gate_qmv_silu_mul(
                x.inner(),
                indices.inner(),
                &parts(gate),
                &parts(up),
                gate.group_size,
                gate.bits,
                activations.code(),
                fused,
                stream(),
            )
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("gather_gate_qmv_silu_mul"))
        },
    )
}

/// Warmup inputs: decode-shaped dense projections `K → N` (and the expert
/// form when `experts` is given as `(E, top_k)`).
pub(crate) fn warmup_specs(
    k: i32,
    n: i32,
    quant: QuantSpec,
    experts: Option<(i32, i32)>,
    dtypes: &[Dtype],
) -> Vec<WarmupSpec> {
    let mut specs = Vec::new();
    for &dtype in dtypes {
        specs.push(WarmupSpec {
            kernel: Kernel::GateQmvSiluMul,
            dtype,
            shape: vec![1, k, n],
            quant: Some(quant),
        });
        if let Some((e, top_k)) = experts {
            specs.push(WarmupSpec {
                kernel: Kernel::GateQmvSiluMul,
                dtype,
                shape: vec![1, k, n, e, top_k],
                quant: Some(quant),
            });
        }
    }
    specs
}

/// Shapes: `[rows, K, N]` dense, `[rows, K, N, E, top_k]` expert-indexed.
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
    let quantized = |lead: &[i32]| -> Result<Quantized, OpError> {
        let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
        crate::ops::quantize(&normal(&shape, 0.05)?, quant.group_size, quant.bits)
    };
    if let [_, _, _, e, top_k] = spec.shape[..] {
        let (gate, up) = (quantized(&[e])?, quantized(&[e])?);
        let indices = Array::arange(0.0, (rows * top_k) as f64, 1.0, Dtype::U32)?
            .reshape(&[rows, top_k])?
            .remainder(&Array::scalar(e as u32))?;
        Ok(vec![gather_gate_qmv_silu_mul(&x, &indices, &gate, &up)?])
    } else {
        let (gate, up) = (quantized(&[])?, quantized(&[])?);
        Ok(vec![gate_qmv_silu_mul(&x, &gate, &up)?])
    }
}
