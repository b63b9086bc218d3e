//! Counters the runner keeps, readable from Rust.

use std::time::Duration;

#[derive(Clone, Debug, Default)]
/// A runner's counters since it was made.
pub struct RunnerMetrics {
    /// Batches run.
    pub forwards: u64,
    /// Prompt tokens run.
    pub tokens_prefilled: u64,
    /// Decode tokens run.
    pub tokens_decoded: u64,
    /// Time building and evaluating the model graph, all batches.
    pub forward_time: Duration,
    /// Time sampling, all batches.
    pub sample_time: Duration,
    /// Graph time of the last batch.
    pub last_forward_time: Duration,
    /// Sampling time of the last batch.
    pub last_sample_time: Duration,
    /// Requests holding KV state now.
    pub active_requests: usize,
    /// Tokens cached across all requests now.
    pub cached_tokens: usize,
    /// Released caches waiting for reuse.
    pub pooled_caches: usize,
    /// Fused calls and fallbacks (by reason) of every kernel, process-wide.
    pub kernels: crate::kernels::Snapshot,
}
