//! This crate's custom MLX Primitives, each with a CPU kernel in Rust and
//! MLX's own ops as the fallback graph:
//!
//! * [`rms_norm()`] / [`rms_norm_residual()`]: RMSNorm, optionally fused with the residual add;
//! * [`moe_combine()`]: the weighted sum of the top-k expert outputs;
//! * [`gate_qmv_silu_mul()`] / [`gather_gate_qmv_silu_mul()`]: the quantized SwiGLU projection;
//! * [`quantized_matmul()`]: `x·Wᵀ` on affine-quantized weights (linears, tied lm_head);
//!   the quantized ops' `_with` forms take an [`ActivationPrecision`] (exact or int8 x);
//! * [`attention()`]: causal or unmasked scaled dot-product attention (GQA);
//! * [`decoder_layer()`]: a whole quantized decoder block for decode rows, KV append included.
//!
//! Every op checks its contract (an [`OpError`] names what is wrong), then
//! asks the [`registry`] whether to build the fused Primitive or the
//! fallback; the decision and its reason are counted per backend. Which
//! kernel has a body on which backend is one table, [`has_body`].

mod activation;
pub mod attention;
mod backend;
mod build;
mod cpu;
pub mod decoder_layer;
pub mod gate_qmv_silu_mul;
pub mod moe_combine;
pub mod quantized_matmul;
pub mod registry;
mod registry_bridge;
pub mod rms_norm;
#[cfg(feature = "testing")]
pub mod test_hooks;
mod warmup;

pub use activation::{ActivationPrecision, UnknownActivationPrecision};
pub use attention::{attention, CUDA_ATTENTION_MAX_HEAD_DIM, METAL_ATTENTION_MAX_ROWS};
pub use backend::Backend;
pub use build::{CUDA_QMV_MAX_ROWS, METAL_QMV_MAX_ROWS};
pub use decoder_layer::{decoder_layer, DecoderLayer, DecoderStack, RopeSpec};
pub use gate_qmv_silu_mul::{
    gate_qmv_silu_mul, gate_qmv_silu_mul_with, gather_gate_qmv_silu_mul,
    gather_gate_qmv_silu_mul_with,
};
pub use moe_combine::moe_combine;
pub use quantized_matmul::{quantized_matmul, quantized_matmul_with};
pub use registry::{has_body, CpuArch, FallbackReason, Kernel, KernelStats, Snapshot};
pub use rms_norm::{rms_norm, rms_norm_residual};
pub use warmup::{AttentionDims, ModelDims, MoeDims, WarmupError, WarmupReport, WarmupSpec};

use crate::array::{eval, Array};
use crate::dtype::Dtype;
use crate::ops::QuantSpec;

const WARMUP_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

/// Each kernel's default warmup specs (dtypes × typical small-model shapes).
pub fn warmup_specs(kernel: Kernel) -> Vec<WarmupSpec> {
    match kernel {
        Kernel::RmsNorm => rms_norm::warmup_specs(&[576, 4096], &WARMUP_DTYPES),
        Kernel::MoeCombine => moe_combine::warmup_specs(&[2048], 4, &WARMUP_DTYPES),
        Kernel::GateQmvSiluMul => gate_qmv_silu_mul::warmup_specs(
            576,
            1536,
            QuantSpec {
                bits: 4,
                group_size: 32,
            },
            Some((8, 2)),
            &WARMUP_DTYPES,
        ),
        Kernel::QuantizedMatmul => quantized_matmul::warmup_specs(
            &[(576, 576), (1536, 576)],
            32,
            QuantSpec {
                bits: 4,
                group_size: 32,
            },
            &WARMUP_DTYPES,
        ),
        Kernel::Attention => attention::warmup_specs(&[(9, 3, 64)], &WARMUP_DTYPES),
        Kernel::DecoderLayer => decoder_layer::warmup_specs(
            &[[1, 576, 1536, 9, 3, 64], [4, 576, 1536, 9, 3, 64]],
            QuantSpec {
                bits: 4,
                group_size: 32,
            },
            &WARMUP_DTYPES,
        ),
    }
}

/// Runs every enabled kernel on its default warmup specs.
pub fn warmup() -> Result<WarmupReport, WarmupError> {
    let specs: Vec<WarmupSpec> = Kernel::ALL.into_iter().flat_map(warmup_specs).collect();
    warmup_with(&specs)
}

/// Runs every enabled kernel on the shapes and dtype of one model.
pub fn warmup_for_model(dims: &ModelDims) -> Result<WarmupReport, WarmupError> {
    let dtypes = [dims.dtype];
    let mut specs = rms_norm::warmup_specs(&[dims.hidden_size], &dtypes);
    if let Some(q) = dims.quant {
        specs.extend(gate_qmv_silu_mul::warmup_specs(
            dims.hidden_size,
            dims.intermediate_size,
            q,
            None,
            &dtypes,
        ));
        let (h, i) = (dims.hidden_size, dims.intermediate_size);
        specs.extend(quantized_matmul::warmup_specs(
            &[(h, h), (i, h)],
            32,
            q,
            &dtypes,
        ));
    }
    // The fused block runs on f32 activations only.
    if let (Some(q), Some(a), None, Dtype::F32) = (dims.quant, dims.attention, dims.moe, dims.dtype)
    {
        specs.extend(decoder_layer::warmup_specs(
            &[[
                1,
                dims.hidden_size,
                dims.intermediate_size,
                a.n_heads,
                a.n_kv_heads,
                a.head_dim,
            ]],
            q,
            &dtypes,
        ));
    }
    if let Some(moe) = dims.moe {
        specs.extend(moe_combine::warmup_specs(
            &[dims.hidden_size],
            moe.top_k,
            &dtypes,
        ));
        if let Some(q) = dims.quant {
            specs.extend(gate_qmv_silu_mul::warmup_specs(
                dims.hidden_size,
                moe.intermediate_size,
                q,
                Some((moe.num_experts, moe.top_k)),
                &dtypes,
            ));
        }
    }
    warmup_with(&specs)
}

/// Runs the given specs on the current stream (those of kernels with a
/// body there, switched on and not failed), surfacing the first failure.
pub fn warmup_with(specs: &[WarmupSpec]) -> Result<WarmupReport, WarmupError> {
    let key = crate::ops::random::key(0x5eed).map_err(|source| WarmupError::Op {
        kernel: Kernel::RmsNorm,
        source,
    })?;
    let backend = Backend::current();
    let mut report = WarmupReport::default();
    for spec in specs {
        let kernel = spec.kernel;
        if !registry::is_fused_on(kernel, backend) {
            report.skipped += 1;
            continue;
        }
        let outputs = match kernel {
            Kernel::RmsNorm => rms_norm::run_warmup(spec, &key),
            Kernel::MoeCombine => moe_combine::run_warmup(spec, &key),
            Kernel::GateQmvSiluMul => gate_qmv_silu_mul::run_warmup(spec, &key),
            Kernel::QuantizedMatmul => quantized_matmul::run_warmup(spec, &key),
            Kernel::Attention => attention::run_warmup(spec, &key),
            Kernel::DecoderLayer => decoder_layer::run_warmup(spec, &key),
        }
        .map_err(|source| WarmupError::Op { kernel, source })?;
        let refs: Vec<&Array> = outputs.iter().collect();
        if let Err(source) = eval(&refs) {
            // A CPU body records its own failure; a GPU body's failure (its
            // module did not load, its launch failed) surfaces as MLX's
            // evaluation error, remembered here so later builds fall back.
            if backend != Backend::Cpu {
                registry::record_failure(kernel, backend, source.message.clone());
            }
            return Err(WarmupError::Eval { kernel, source });
        }
        report.ran += 1;
    }
    Ok(report)
}
