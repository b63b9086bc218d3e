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
//! * [`model`]: model loading (GGUF files, HF and mlx-community folders, hub
//!   ids) and the forward pass over per-layer KV caches.
//! * [`distributed`]: MLX's distributed groups and collectives, and a
//!   launcher for local ranks; tensor parallelism builds on them.
//! * [`runner`]: [`MlxModelRunner`](runner::MlxModelRunner), what a serving
//!   engine calls once per forward batch; [`engine`]: a continuous-batching
//!   engine around it.
//!
//! # Example
//!
//! Eight greedy tokens from the default model (SmolLM2-135M-Instruct,
//! fetched once into the cache) through the runner: the prompt as one
//! chunk, then one decode step per token.
//!
//! ```no_run
//! use mlx_backend::model::{fetch, LoadOptions};
//! use mlx_backend::runner::{
//!     ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestInput, RunnerConfig,
//!     SamplingParams,
//! };
//! use mlx_backend::{tokenizer, Device};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = fetch::resolve(None)?; // None: the default model
//! let (tok, _chat_template) = tokenizer::for_model(&path)?;
//! let options = LoadOptions::for_device(Device::Cpu);
//! let mut runner = MlxModelRunner::load(&path, &options, RunnerConfig::default())?;
//!
//! let prompt = tok.encode("The capital of France is", true)?;
//! let greedy = SamplingParams::greedy();
//! let first = RequestInput::prompt(1, prompt.clone(), greedy.clone());
//! let out = runner.forward(&ForwardBatch::new(ForwardMode::Extend, vec![first]))?;
//! // The last prompt chunk samples the first token.
//! let mut tokens = vec![out.outputs[0].next_token.expect("a last chunk samples")];
//! while tokens.len() < 8 {
//!     let last = *tokens.last().unwrap();
//!     // `cached_tokens`: the prompt and every token but the one being fed.
//!     let cached = prompt.len() + tokens.len() - 1;
//!     let step = RequestInput::decode(1, last, cached, greedy.clone());
//!     let out = runner.forward(&ForwardBatch::new(ForwardMode::Decode, vec![step]))?;
//!     tokens.push(out.outputs[0].next_token.expect("a decode step samples"));
//! }
//! runner.release(&[1]);
//! println!("{}", tok.decode(&tokens, true)?);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod array;
mod device;
pub mod distributed;
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

// README.md's Rust snippets, compiled (and those that need no model run) as
// doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
