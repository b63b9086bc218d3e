//! How the engine schedules.

/// Scheduler limits. The KV budget and the maximum context come from the
/// runner ([`crate::runner::RunnerInfo`]).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Requests admitted at once (prefilling or decoding).
    pub max_running_requests: usize,
    /// Requests waiting for admission; a submission beyond it is refused
    /// with [`EngineError::QueueFull`](super::EngineError::QueueFull).
    pub max_waiting_requests: usize,
    /// Prompt tokens prefilled per step, across requests, on top of one
    /// decode token per running request: a long prompt is cut into chunks
    /// of at most this size, so the running streams keep their pace.
    pub prefill_tokens_per_step: usize,
    /// Tokens to generate when a request names no limit (capped by what is
    /// left of the context).
    pub default_max_tokens: usize,
    /// Reuse the KV of prompt prefixes that earlier requests computed.
    pub prefix_cache: bool,
    /// The shortest prefix worth copying instead of recomputing.
    pub prefix_cache_min_tokens: usize,
    /// Finished requests whose KV the prefix cache keeps at most. The KV
    /// budget counts tokens, but a cache holds whole growth steps (256
    /// positions by default), so a short entry can hold several times its
    /// tokens' memory: the count bounds that.
    pub prefix_cache_max_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_running_requests: 128,
            max_waiting_requests: 1024,
            prefill_tokens_per_step: 256,
            default_max_tokens: 256,
            prefix_cache: true,
            prefix_cache_min_tokens: 16,
            prefix_cache_max_entries: 32,
        }
    }
}
