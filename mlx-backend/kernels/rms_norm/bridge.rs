//! The callback bridge of the RMSNorm Primitives: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/rms_norm/rms_norm.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/rms_norm/bridge.rs.h`).

use super::cpu::{rms_norm_cpu, rms_norm_residual_cpu};

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        fn rms_norm_cpu(
            dtype: i32,
            x: &[u8],
            w: &[u8],
            out: &mut [u8],
            rows: usize,
            hidden: usize,
            eps: f32,
        ) -> bool;
        #[allow(clippy::too_many_arguments)]
        fn rms_norm_residual_cpu(
            dtype: i32,
            x: &[u8],
            residual: &[u8],
            w: &[u8],
            normed: &mut [u8],
            sum: &mut [u8],
            rows: usize,
            hidden: usize,
            eps: f32,
        ) -> bool;
    }
}
