//! The callback bridge of the MoE combine Primitive: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/moe_combine/moe_combine.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/moe_combine/bridge.rs.h`).

use super::cpu::moe_combine_cpu;

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        #[allow(clippy::too_many_arguments)]
        fn moe_combine_cpu(
            y_dtype: i32,
            scores_dtype: i32,
            y: &[u8],
            scores: &[u8],
            out: &mut [u8],
            rows: usize,
            top_k: usize,
            hidden: usize,
        ) -> bool;
    }
}
