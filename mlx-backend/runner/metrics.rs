//! Counters the runner keeps, readable from Rust.

use std::time::Duration;

#[derive(Clone, Debug, Default)]
pub struct RunnerMetrics {
    pub forwards: u64,
    pub tokens_prefilled: u64,
    pub tokens_decoded: u64,
    pub forward_time: Duration,
    pub sample_time: Duration,
    pub last_forward_time: Duration,
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
