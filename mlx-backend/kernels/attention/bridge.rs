//! The callback bridge of the attention Primitive: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/attention/attention.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/attention/bridge.rs.h`).

use super::cpu::attention_cpu;

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        #[allow(clippy::too_many_arguments)]
        fn attention_cpu(
            dtype: i32,
            q: &[u8],
            q_strides: &[usize],
            k: &[u8],
            k_strides: &[usize],
            v: &[u8],
            v_strides: &[usize],
            out: &mut [u8],
            b: usize,
            hq: usize,
            hkv: usize,
            l: usize,
            s: usize,
            d: usize,
            scale: f32,
            causal: bool,
        ) -> bool;
    }
}
