//! The callback bridge of the quantized matmul Primitive: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/quantized_matmul/quantized_matmul.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/quantized_matmul/bridge.rs.h`).

use super::cpu::quantized_matmul_cpu;

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul_cpu(
            dtype: i32,
            params_dtype: i32,
            x: &[u8],
            w: &[u32],
            scales: &[u8],
            biases: &[u8],
            bits: u32,
            group_size: usize,
            out: &mut [u8],
            m: usize,
            n: usize,
            k: usize,
            activations: i32,
        ) -> bool;
    }
}
