//! Each custom kernel's contract on every device against a
//! higher-precision reference, one module per kernel, as one test binary
//! (each links libmlx). Tests that change process-wide kernel state (the
//! switches, forced failures, the environment) are binaries of their own:
//! `kernels_registry`, `kernels_failure`, `kernels_env`, and
//! `kernels_decoder_layer`, which switches its kernel on and off.

#[path = "../kernels_common/mod.rs"]
mod kernels_common;

mod attention;
mod gate_qmv;
mod integer_activations;
mod moe_combine;
mod quantized_matmul;
mod rms_norm;
