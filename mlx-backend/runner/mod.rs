//! The model runner: what a serving engine calls once per forward batch, as
//! SGLang's worker calls its MlxModelRunner. [`MlxModelRunner`] owns the
//! model, one KV cache per request and the sampler; [`RunnerHandle`] puts it
//! on a thread of its own so an async, multi-threaded engine can share it.
//! [`tensor_parallel`] splits one model over a distributed group.

mod batch;
mod error;
mod handle;
mod kv;
mod metrics;
mod mlx_runner;
pub mod sampler;
pub mod tensor_parallel;

pub use batch::{
    ForwardBatch, ForwardMode, ForwardOutput, RequestId, RequestInput, RequestOutput,
    ReturnOptions, SamplingParams,
};
pub use error::RunnerError;
pub use handle::{ForwardFuture, RunnerHandle};
pub use metrics::RunnerMetrics;
pub use mlx_runner::{MlxModelRunner, RunnerConfig};

use crate::kernels::Kernel;
use crate::{Device, Dtype};

/// What the runner serves, for the engine's scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerInfo {
    /// The model family, e.g. `"llama"`.
    pub architecture: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The longest context one request may reach.
    pub max_context: usize,
    /// KV cache capacity in tokens across all requests.
    pub kv_capacity_tokens: usize,
    /// The activations' dtype.
    pub dtype: Dtype,
    /// The device it runs on.
    pub device: Device,
    /// Kernels whose fused body serves this runner on `device`'s backend:
    /// it has one there, it is switched on and it has not failed. The rest
    /// run MLX's built-in graphs, as does any call whose own inputs a body
    /// does not cover.
    pub fused_kernels: Vec<Kernel>,
}

/// The per-forward-batch contract.
pub trait ModelRunner {
    /// What the runner serves.
    fn info(&self) -> RunnerInfo;
    /// Run one batch. A rejected batch changes no request's state.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, RunnerError>;
    /// Free the KV state of finished or cancelled requests (unknown ids are ignored).
    fn release(&mut self, ids: &[RequestId]);
    /// The runner's counters now.
    fn metrics(&self) -> RunnerMetrics;
    /// Start request `to` from the first `tokens` tokens request `from`
    /// holds (running, or finished but not released), as if `to` had
    /// prefilled them: its first chunk then says `cached_tokens = tokens`.
    /// What a prefix cache needs. The KV is copied, `from` is unchanged, and
    /// the copy counts against the KV budget. Runners without it answer
    /// `RunnerError::Unsupported`.
    fn copy_prefix(
        &mut self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
    ) -> Result<(), RunnerError> {
        let _ = (from, to, tokens);
        Err(RunnerError::Unsupported("copy_prefix"))
    }
}
