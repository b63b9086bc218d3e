//! # mlx-backend
//!
//! Rust bindings to Apple's MLX that form an execution backend for LLM
//! serving. MLX's C++ array graph is driven through one `cxx` bridge; the hot
//! ops are this crate's own MLX Primitives with a kernel per backend.
//!
//! * [`Array`]: an owned node of MLX's lazy graph; ops are methods and free
//!   functions in [`ops`]; every fallible call returns a typed error.
//! * [`Device`] / [`Stream`]: where ops run. Arrays are not `Send`, because MLX
//!   streams belong to the thread that made them.
//! * [`kernels`]: the custom Primitives (RMSNorm, MoE combine, quantized
//!   SwiGLU projection), their CPU kernels, registry and warmup.
//! * [`io`]: safetensors and GGUF files; [`memory`]: MLX's allocator.
//! * [`tokenizer`]: tokenizers (tokenizer.json or GGUF metadata), streaming
//!   detokenization and chat templates.

#![warn(missing_docs)]

mod array;
mod device;
mod dtype;
pub mod engine;
mod error;
mod ffi;
mod gguf_check;
pub mod io;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod ops;
pub mod runner;
pub mod tokenizer;

pub use array::{async_eval, eval, Array};
pub use device::{Device, Stream};
pub use dtype::{Dtype, Element};
pub use error::{DeviceError, Error, EvalError, HostDataError, LoadError, OpError, SaveError};
pub use gguf_check::{check as check_gguf, GgufCheckError};
pub use half::{bf16, f16};
