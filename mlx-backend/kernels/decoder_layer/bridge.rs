//! The callback bridge of the decoder stack Primitive: the CPU body C++ calls from
//! `eval_cpu` (`mlx-kernels-cpp/decoder_layer/decoder_layer.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/decoder_layer/bridge.rs.h`).
//! The stack's shared structs are the MLX-facing bridge's (its builder
//! takes them too), named here through `cxx::ExternType`.

use super::cpu::decoder_stack_cpu;

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    unsafe extern "C++" {
        include!("mlx-backend/mlx-backend/ffi.rs.h");
        type StackInput = crate::ffi::StackInput;
        type StackHead = crate::ffi::StackHead;
        type DecoderLayerSpec = crate::ffi::DecoderLayerSpec;
    }

    // Called from the Primitive's `eval_cpu` on MLX's stream thread; never
    // unwinds: `false` means failed, with the failure recorded in the
    // registry.
    extern "Rust" {
        /// Every block of a stack in turn, from x or (`input.tokens`) from
        /// the rows of token ids in `embedding`'s table (w, scales,
        /// biases), ending with the final norm and head (`head.head`;
        /// `head_params`: norm, w, scales, biases) or not. `x`, `params` (each block's
        /// `param_counts[l]` buffers, concatenated) and `outputs` (out, then
        /// keys and values per block and row): `(address, bytes)` pairs of
        /// MLX buffers. `quant`: 14 per block; `offsets`, `capacities`: per
        /// block and row.
        #[allow(clippy::too_many_arguments)]
        fn decoder_stack_cpu(
            input: &StackInput,
            embedding: &[usize],
            head: &StackHead,
            head_params: &[usize],
            specs: &[DecoderLayerSpec],
            copied_caches: usize,
            quant: &[i32],
            offsets: &[i32],
            capacities: &[i32],
            x: &[usize],
            params: &[usize],
            param_counts: &[usize],
            outputs: &[usize],
        ) -> bool;
    }
}
