//! What a kernel warmup runs ([`WarmupSpec`]), the model dimensions it is
//! derived from, and what it reports. The runs themselves are driven from
//! the kernels' module, which knows every kernel.

use super::registry::Kernel;
use crate::dtype::Dtype;
use crate::error::{EvalError, OpError};
use crate::ops::QuantSpec;
use thiserror::Error;

/// One warmup run: a kernel, a dtype and a shape (per kernel: `[rows,
/// hidden]` for rms_norm, `[tokens, top_k, hidden]` for moe_combine,
/// `[rows, K, N]` or `[rows, K, N, E, top_k]` for gate_qmv_silu_mul,
/// `[rows, K, N]` for quantized_matmul, `[B, Hq, Hkv, L, S, D]` for attention).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupSpec {
    /// The kernel to run.
    pub kernel: Kernel,
    /// The activations' dtype.
    pub dtype: Dtype,
    /// The shape, as the type's docs lay it out per kernel.
    pub shape: Vec<i32>,
    /// The weights' quantization, for the quantized kernels.
    pub quant: Option<QuantSpec>,
}

/// The mixture-of-experts part of [`ModelDims`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDims {
    /// Experts in each MoE layer.
    pub num_experts: i32,
    /// Experts each token is routed to.
    pub top_k: i32,
    /// Each expert's intermediate size.
    pub intermediate_size: i32,
}

/// The dimensions of a model, for [`warmup_for_model`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelDims {
    /// The residual stream's width.
    pub hidden_size: i32,
    /// The dense MLP's intermediate size.
    pub intermediate_size: i32,
    /// The activations' dtype.
    pub dtype: Dtype,
    /// The MLP's quantization; `None` for unquantized models.
    pub quant: Option<QuantSpec>,
    /// The MoE layers' sizes; `None` for dense models.
    pub moe: Option<MoeDims>,
    /// Attention heads, for the decoder_layer warmup.
    pub attention: Option<AttentionDims>,
}

/// The attention part of [`ModelDims`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Query heads.
    pub n_heads: i32,
    /// Key/value heads.
    pub n_kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
}

/// What a warmup did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarmupReport {
    /// Specs evaluated.
    pub ran: usize,
    /// Specs skipped because their kernel is disabled or failed earlier.
    pub skipped: usize,
}

/// A warmup run failed.
#[derive(Debug, Clone, Error)]
pub enum WarmupError {
    #[error("warmup of {kernel}: {source}")]
    /// Building a warmup op failed.
    Op {
        /// The kernel being warmed up.
        kernel: Kernel,
        /// Why the build failed.
        source: OpError,
    },
    #[error("warmup of {kernel}: {source}")]
    /// Evaluating a warmup op failed (the kernel is then marked failed).
    Eval {
        /// The kernel being warmed up.
        kernel: Kernel,
        /// Why the evaluation failed.
        source: EvalError,
    },
}
