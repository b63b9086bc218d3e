//! A serving engine on the runner: what an engine author would otherwise
//! write around [`ModelRunner`](crate::runner::ModelRunner).
//!
//! * [`ModelBundle`]: runner, tokenizer, chat template and one EOS set from
//!   one load.
//! * [`Engine`]: continuous batching over any `ModelRunner`
//!   ([`MlxModelRunner`](crate::runner::MlxModelRunner) on the engine's own
//!   thread, or a [`RunnerHandle`](crate::runner::RunnerHandle)); admission
//!   by KV budget with a bounded waiting queue; chunked prefill interleaved
//!   with decode; stop strings, stop ids and EOS; cancellation; a prefix
//!   cache; metrics in Prometheus' format.
//! * [`GenerateRequest`] in, [`EventStream`] of [`Event`]s out: text deltas
//!   with their token ids and logprobs, then one [`Finished`] with the
//!   reason, usage and time to first token.
//!
//! ```no_run
//! use mlx_backend::engine::{Engine, EngineConfig, Event, GenerateRequest};
//! use mlx_backend::model::{fetch, LoadOptions};
//! use mlx_backend::runner::RunnerConfig;
//! use mlx_backend::tokenizer::ChatMessage;
//! use mlx_backend::Device;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = fetch::resolve(None)?;
//! let engine = Engine::load(path, LoadOptions::for_device(Device::Cpu),
//!                           RunnerConfig::default(), EngineConfig::default())?;
//! let request = GenerateRequest::chat(vec![ChatMessage::user("Hi!")]).with_max_tokens(32);
//! for event in engine.submit(request)? {
//!     match event {
//!         Event::Delta { text, .. } => print!("{text}"),
//!         Event::Finished(f) => println!("\n[{}] {:?}", f.reason.as_str(), f.usage),
//!     }
//! }
//! # Ok(()) }
//! ```

mod api;
mod bundle;
mod config;
mod error;
mod metrics;
mod prefix_cache;
mod request;
mod scheduler;
mod stop;
mod stream;

pub use api::Engine;
pub use bundle::{merge_eos, ModelBundle, TensorParallelPart};
pub use config::EngineConfig;
pub use error::EngineError;
pub use metrics::MetricsSnapshot;
pub use request::{Event, FinishReason, Finished, GenerateRequest, Prompt, SampledToken, Usage};
pub use stream::{Collected, EventStream};
