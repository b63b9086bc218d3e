//! The fused ops the model layers call: each is a custom Primitive with a
//! CPU kernel where eligible (see `crate::kernels`), else MLX's own graph.
//! The quantized ones take the model's `ActivationPrecision` (from
//! `LoadOptions::activations`).

pub use crate::kernels::{
    gate_qmv_silu_mul_with, gather_gate_qmv_silu_mul_with, moe_combine, quantized_matmul_with,
    rms_norm,
};
