//! The bridge to MLX's C++ API, `extern "C++"` only, in sections: shared
//! types, devices and streams, memory, arrays and host I/O, evaluation, ops,
//! fast ops, random, files, and the builders of this crate's custom
//! Primitives.
//!
//! Calls the other way, from C++ into Rust, go through bridges of their own
//! that depend on this one and never the reverse: each kernel's CPU body
//! has one (`kernels/<op>/bridge.rs`), and GPU bodies report to the
//! registry through `kernels/registry_bridge.rs`. The decoder stack's
//! shared structs live here because both its builder and its CPU body
//! take them.
//!
//! Everything that can throw in C++ is declared `Result`: cxx catches the
//! exception and hands back MLX's message. Safe wrappers live in the rest of
//! the crate; nothing outside the crate sees this module.

#[cxx::bridge(namespace = "mlx_backend")]
pub(crate) mod bridge {
    // ---- shared types

    /// A device: `device_type` 0 is the CPU, 1 the GPU.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct DeviceSpec {
        device_type: i32,
        device_index: i32,
    }

    /// A stream: an index into MLX's stream table plus its device.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct StreamSpec {
        index: i32,
        device: DeviceSpec,
    }

    /// What a decoder stack node starts from (`decoder_stack_cpu`).
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct StackInput {
        /// Token ids (`[B, 1]`, `tokens_dtype`) to look up in the stack's
        /// embedding table, instead of x.
        tokens: bool,
        tokens_dtype: i32,
        /// The table's quantization and the MLX dtype code of its scales
        /// and biases.
        bits: i32,
        group_size: i32,
        params_dtype: i32,
        vocab: i32,
    }

    /// The final norm and quantized head a decoder stack node may end with
    /// (`decoder_stack_cpu`).
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct StackHead {
        /// Whether the node ends with them (f32 logits instead of x).
        head: bool,
        bits: i32,
        group_size: i32,
        /// MLX dtype codes of the head's scales and biases, and of the norm.
        params_dtype: i32,
        norm_dtype: i32,
        eps: f32,
        /// `ActivationPrecision` code of the head's matmul.
        activations: i32,
        vocab: i32,
    }

    /// The geometry of one decoder block for `decoder_stack_push` (`batch`
    /// is set per call by C++).
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct DecoderLayerSpec {
        batch: usize,
        hidden: usize,
        intermediate: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        eps: f32,
        attn_scale: f32,
        rope_dims: usize,
        rope_traditional: bool,
        rope_base: f32,
        rope_scale: f32,
        rope_mscale: f32,
        has_freqs: bool,
        has_qkv_bias: bool,
        has_qk_norm: bool,
        /// `ActivationPrecision` code of the projections.
        activations: i32,
        /// MLX dtype code of the projections' scales and biases (filled by C++).
        params_dtype: i32,
        /// MLX dtype code of the norms and q/k/v biases (filled by C++).
        norms_dtype: i32,
    }

    unsafe extern "C++" {
        include!("mlx-backend/mlx-kernels-cpp/bridge.h");

        #[namespace = "mlx::core"]
        type array;
        type ArrayList;
        type SafetensorsFile;
        type GgufFile;
        type DecoderStack;
        type DistGroup;

        // ---- devices and streams
        fn default_device() -> DeviceSpec;
        fn set_default_device(device: DeviceSpec) -> Result<()>;
        fn device_is_available(device: DeviceSpec) -> bool;
        fn device_count(device_type: i32) -> Result<i32>;
        fn default_stream(device: DeviceSpec) -> Result<StreamSpec>;
        fn new_stream(device: DeviceSpec) -> Result<StreamSpec>;
        fn set_default_stream(stream: StreamSpec) -> Result<()>;
        fn synchronize(stream: StreamSpec) -> Result<()>;

        // ---- distributed
        fn distributed_is_available(backend: &str) -> Result<bool>;
        fn distributed_init(strict: bool, backend: &str) -> Result<UniquePtr<DistGroup>>;
        fn dist_group_rank(g: &DistGroup) -> i32;
        fn dist_group_size(g: &DistGroup) -> i32;
        fn dist_group_clone(g: &DistGroup) -> UniquePtr<DistGroup>;
        fn dist_all_sum(x: &array, g: &DistGroup, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn dist_all_gather(x: &array, g: &DistGroup, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn dist_send(x: &array, dst: i32, g: &DistGroup, s: StreamSpec)
            -> Result<UniquePtr<array>>;
        fn dist_recv(
            shape: &[i32],
            dtype: i32,
            src: i32,
            g: &DistGroup,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;

        // ---- memory
        fn active_memory() -> usize;
        fn peak_memory() -> usize;
        fn reset_peak_memory();
        fn cache_memory() -> usize;
        fn set_memory_limit(limit: usize) -> usize;
        fn memory_limit() -> usize;
        fn set_cache_limit(limit: usize) -> usize;
        fn clear_cache();

        // ---- arrays and host I/O
        fn from_bytes(data: &[u8], shape: &[i32], dtype: i32) -> Result<UniquePtr<array>>;
        fn full(shape: &[i32], value: f64, dtype: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn arange(
            start: f64,
            stop: f64,
            step: f64,
            dtype: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn array_clone(a: &array) -> UniquePtr<array>;
        fn array_shape(a: &array) -> Vec<i32>;
        fn array_dtype(a: &array) -> i32;
        fn array_size(a: &array) -> usize;
        fn array_nbytes(a: &array) -> usize;
        /// Built by an op and not yet scheduled for evaluation.
        fn array_is_pending(a: &array) -> bool;
        /// The address of an evaluated array's data when MLX holds it
        /// dense and row-major (0 for a view or an empty array), once the
        /// computation has finished.
        fn array_host_data(a: &array) -> Result<usize>;
        fn copy_to_host(a: &array, out: &mut [u8]) -> Result<()>;

        fn new_array_list() -> UniquePtr<ArrayList>;
        fn array_list_push(list: Pin<&mut ArrayList>, a: &array);
        fn array_list_len(list: &ArrayList) -> usize;
        fn array_list_get(list: &ArrayList, index: usize) -> Result<UniquePtr<array>>;

        // ---- evaluation
        fn eval(a: &array) -> Result<()>;
        fn eval_list(list: &ArrayList) -> Result<()>;
        fn async_eval_list(list: &ArrayList) -> Result<()>;

        // ---- ops
        fn unary(op: i32, a: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn binary(op: i32, a: &array, b: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn reduce(
            op: i32,
            a: &array,
            axes: &[i32],
            keepdims: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn arg_reduce(
            op: i32,
            a: &array,
            axis: i32,
            keepdims: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn reshape(a: &array, shape: &[i32], s: StreamSpec) -> Result<UniquePtr<array>>;
        fn transpose(a: &array, axes: &[i32], s: StreamSpec) -> Result<UniquePtr<array>>;
        fn squeeze(a: &array, axes: &[i32], s: StreamSpec) -> Result<UniquePtr<array>>;
        fn expand_dims(a: &array, axes: &[i32], s: StreamSpec) -> Result<UniquePtr<array>>;
        fn broadcast_to(a: &array, shape: &[i32], s: StreamSpec) -> Result<UniquePtr<array>>;
        fn flatten(
            a: &array,
            start_axis: i32,
            end_axis: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn slice(
            a: &array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn slice_update(
            src: &array,
            update: &array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn slice_dynamic(
            a: &array,
            start: &array,
            axes: &[i32],
            size: &[i32],
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn slice_update_dynamic(
            src: &array,
            update: &array,
            start: &array,
            axes: &[i32],
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn concatenate(arrays: &ArrayList, axis: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn stack(arrays: &ArrayList, axis: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn split_sections(
            a: &array,
            indices: &[i32],
            axis: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<ArrayList>>;
        fn take(a: &array, indices: &array, axis: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn take_along_axis(
            a: &array,
            indices: &array,
            axis: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn put_along_axis(
            a: &array,
            indices: &array,
            values: &array,
            axis: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn where_(cond: &array, x: &array, y: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn astype(a: &array, dtype: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn contiguous(a: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn clip(a: &array, lo: f64, hi: f64, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn argpartition(a: &array, kth: i32, axis: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn topk(a: &array, k: i32, axis: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn sort(a: &array, axis: i32, indices: bool, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn cumsum(
            a: &array,
            axis: i32,
            reverse: bool,
            inclusive: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn softmax(
            a: &array,
            axes: &[i32],
            precise: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn matmul(a: &array, b: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn addmm(c: &array, a: &array, b: &array, s: StreamSpec) -> Result<UniquePtr<array>>;
        fn quantize(
            w: &array,
            group_size: i32,
            bits: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<ArrayList>>;
        unsafe fn dequantize(
            w: &array,
            scales: &array,
            biases: *const array,
            group_size: i32,
            bits: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        unsafe fn quantized_matmul(
            x: &array,
            w: &array,
            scales: &array,
            biases: *const array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        unsafe fn gather_qmm(
            x: &array,
            w: &array,
            scales: &array,
            biases: *const array,
            lhs_indices: *const array,
            rhs_indices: *const array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            sorted_indices: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn gather_mm(
            a: &array,
            b: &array,
            lhs_indices: *const array,
            rhs_indices: *const array,
            sorted_indices: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;

        // ---- fast ops
        unsafe fn fast_rms_norm(
            x: &array,
            weight: *const array,
            eps: f32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn fast_layer_norm(
            x: &array,
            weight: *const array,
            bias: *const array,
            eps: f32,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        unsafe fn fast_rope(
            x: &array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
            freqs: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        unsafe fn fast_rope_dynamic(
            x: &array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: &array,
            freqs: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn fast_sdpa(
            q: &array,
            k: &array,
            v: &array,
            scale: f32,
            mask_mode: &str,
            mask: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;

        // ---- random
        fn random_key(seed: u64) -> Result<UniquePtr<array>>;
        fn random_seed(seed: u64);
        fn random_split(key: &array, num: i32, s: StreamSpec) -> Result<UniquePtr<array>>;
        unsafe fn random_uniform(
            low: &array,
            high: &array,
            shape: &[i32],
            dtype: i32,
            key: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn random_normal(
            shape: &[i32],
            dtype: i32,
            loc: f32,
            scale: f32,
            key: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn random_categorical(
            logits: &array,
            axis: i32,
            key: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        unsafe fn random_gumbel(
            shape: &[i32],
            dtype: i32,
            key: *const array,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;

        // ---- files
        fn load_safetensors(path: &str) -> Result<UniquePtr<SafetensorsFile>>;
        fn safetensors_names(f: &SafetensorsFile) -> Vec<String>;
        fn safetensors_get(f: &SafetensorsFile, name: &str) -> Result<UniquePtr<array>>;
        fn safetensors_metadata_keys(f: &SafetensorsFile) -> Vec<String>;
        fn safetensors_metadata_get(f: &SafetensorsFile, key: &str) -> Result<String>;
        fn save_safetensors(
            path: &str,
            names: &Vec<String>,
            arrays: &ArrayList,
            metadata_keys: &Vec<String>,
            metadata_values: &Vec<String>,
        ) -> Result<()>;

        fn load_gguf(path: &str) -> Result<UniquePtr<GgufFile>>;
        fn gguf_names(f: &GgufFile) -> Vec<String>;
        fn gguf_get(f: &GgufFile, name: &str) -> Result<UniquePtr<array>>;
        fn gguf_metadata_keys(f: &GgufFile) -> Vec<String>;
        fn gguf_metadata_kind(f: &GgufFile, key: &str) -> i32;
        fn gguf_metadata_array(f: &GgufFile, key: &str) -> Result<UniquePtr<array>>;
        fn gguf_metadata_string(f: &GgufFile, key: &str) -> Result<String>;
        fn gguf_metadata_strings(f: &GgufFile, key: &str) -> Result<Vec<String>>;
    }

    // ---- custom primitives: each op builds the fused Primitive when `fused`
    // is set and MLX's fallback graph otherwise; both check the contract.
    unsafe extern "C++" {
        fn kernel_rms_norm(
            x: &array,
            w: &array,
            eps: f32,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        fn kernel_rms_norm_residual(
            x: &array,
            residual: &array,
            w: &array,
            eps: f32,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<ArrayList>>;
        fn kernel_moe_combine(
            y: &array,
            scores: &array,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        /// `gate` and `up` are `[weight, scales, biases]`; `activations` is
        /// an `ActivationPrecision` code.
        #[allow(clippy::too_many_arguments)]
        fn kernel_gate_qmv_silu_mul(
            x: &array,
            gate: &ArrayList,
            up: &ArrayList,
            group_size: i32,
            bits: i32,
            activations: i32,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        fn kernel_gather_gate_qmv_silu_mul(
            x: &array,
            indices: &array,
            gate: &ArrayList,
            up: &ArrayList,
            group_size: i32,
            bits: i32,
            activations: i32,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        /// `w` is `[weight, scales, biases]`.
        fn kernel_quantized_matmul(
            x: &array,
            w: &ArrayList,
            group_size: i32,
            bits: i32,
            activations: i32,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        /// Causal (lower-right) or unmasked attention; `q [B, Hq, L, D]`,
        /// `k, v [B, Hkv, S, D]`.
        fn kernel_attention(
            q: &array,
            k: &array,
            v: &array,
            scale: f32,
            causal: bool,
            fused: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<array>>;
        /// An empty stack of decoder blocks.
        fn new_decoder_stack() -> UniquePtr<DecoderStack>;
        /// Checks, evaluates and appends one block: `params` in the order
        /// of `kernels::decoder_layer`, `quant` its `(bits, group_size)`
        /// per projection.
        fn decoder_stack_push(
            stack: Pin<&mut DecoderStack>,
            params: &ArrayList,
            spec: &DecoderLayerSpec,
            quant: &[i32],
        ) -> Result<()>;
        /// Checks, evaluates and sets the stack's token embedding table
        /// (`[w, scales, biases]`, `[vocab, hidden]` quantized).
        fn decoder_stack_set_embedding(
            stack: Pin<&mut DecoderStack>,
            table: &ArrayList,
            bits: i32,
            group_size: i32,
        ) -> Result<()>;
        /// Checks, evaluates and sets the stack's final norm and quantized
        /// head (`[norm, w, scales, biases]`, w `[vocab, hidden]`).
        fn decoder_stack_set_head(
            stack: Pin<&mut DecoderStack>,
            params: &ArrayList,
            eps: f32,
            bits: i32,
            group_size: i32,
            activations: i32,
        ) -> Result<()>;
        /// Blocks `first..first + count` of `stack` as one node, for decode
        /// rows `x [B, 1, H]` (or token ids `[B, 1]` when `tokens`);
        /// `caches` keys and values per block and row (block-major),
        /// `offsets` per block and row. Returns `[out, caches'...]`, or
        /// `[out]` when `fused && in_place`: then the kernel writes each
        /// row's new key and value into the given caches' own buffers,
        /// which `DecoderStack::caches_writable_in_place` must allow
        /// (checked again at evaluation: a typed error otherwise).
        #[allow(clippy::too_many_arguments)]
        fn kernel_decoder_stack(
            input: &array,
            tokens: bool,
            stack: &DecoderStack,
            first: usize,
            count: usize,
            caches: &ArrayList,
            offsets: &[i32],
            fused: bool,
            in_place: bool,
            s: StreamSpec,
        ) -> Result<UniquePtr<ArrayList>>;
        /// The address of `cache`'s buffer when a decoder stack node may
        /// write it in place (evaluated, dense, row-contiguous, the only
        /// array holding its buffer), 0 otherwise.
        fn cache_buffer_in_place(cache: &array) -> usize;
        /// Test support: vjp of op `kernel` (0 rms_norm, 1 rms_norm_residual,
        /// 2 moe_combine) built fused or as the fallback. Only the test
        /// hooks call it (feature `testing`).
        #[allow(dead_code)]
        fn kernel_vjp(
            kernel: i32,
            fused: bool,
            primals: &ArrayList,
            cotangents: &ArrayList,
            eps: f32,
            s: StreamSpec,
        ) -> Result<UniquePtr<ArrayList>>;
    }
}

pub(crate) use bridge::*;
