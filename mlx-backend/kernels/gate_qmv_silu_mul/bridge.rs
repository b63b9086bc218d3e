//! The callback bridge of the quantized SwiGLU projection: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/gate_qmv_silu_mul/gate_qmv_silu_mul.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/gate_qmv_silu_mul/bridge.rs.h`).

use super::cpu::{gate_qmv_silu_mul_cpu, gather_gate_qmv_silu_mul_cpu};

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        #[allow(clippy::too_many_arguments)]
        fn gate_qmv_silu_mul_cpu(
            dtype: i32,
            params_dtype: i32,
            x: &[u8],
            gate_w: &[u32],
            gate_scales: &[u8],
            gate_biases: &[u8],
            up_w: &[u32],
            up_scales: &[u8],
            up_biases: &[u8],
            bits: u32,
            group_size: usize,
            out: &mut [u8],
            m: usize,
            n: usize,
            k: usize,
            activations: i32,
        ) -> bool;
        #[allow(clippy::too_many_arguments)]
        fn gather_gate_qmv_silu_mul_cpu(
            dtype: i32,
            params_dtype: i32,
            x: &[u8],
            x_row_for: &[u32],
            experts: &[u32],
            gate_w: &[u32],
            gate_scales: &[u8],
            gate_biases: &[u8],
            up_w: &[u32],
            up_scales: &[u8],
            up_biases: &[u8],
            bits: u32,
            group_size: usize,
            num_experts: usize,
            out: &mut [u8],
            n: usize,
            k: usize,
            activations: i32,
        ) -> bool;
    }
}
