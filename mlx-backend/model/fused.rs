//! The fused ops the model layers call: each is a custom Primitive with a
//! CPU kernel where eligible (see `crate::kernels`), else MLX's own graph.

pub use crate::kernels::{
    gate_qmv_silu_mul, gather_gate_qmv_silu_mul, moe_combine, quantized_matmul, rms_norm,
};
