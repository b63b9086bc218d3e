//! The engine's metrics: Prometheus collectors (updated by the scheduler
//! thread, read from any thread) and a plain snapshot for Rust callers.

use prometheus::{
    exponential_buckets, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// A point-in-time view of the engine's metrics ([`Engine::metrics`](super::Engine::metrics)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Requests queued, not yet admitted.
    pub waiting_requests: usize,
    /// Admitted requests (prefilling or decoding).
    pub running_requests: usize,
    /// KV tokens the runner holds for running requests.
    pub kv_request_tokens: usize,
    /// KV tokens the prefix cache keeps for finished requests.
    pub kv_prefix_cache_tokens: usize,
    /// Finished requests the prefix cache keeps.
    pub prefix_cache_entries: usize,
    /// The runner's KV capacity in tokens.
    pub kv_capacity_tokens: usize,
    /// Prompt tokens of all admitted requests.
    pub prompt_tokens_total: u64,
    /// Tokens generated for all requests.
    pub generation_tokens_total: u64,
    /// Prompt tokens of admitted requests, and those the prefix cache served.
    pub prefix_cache_query_tokens: u64,
    /// Of those, the tokens the prefix cache served.
    pub prefix_cache_hit_tokens: u64,
    /// Requests that ended, for any reason.
    pub requests_finished: u64,
}

/// Collectors of one engine (their own registry, so several engines in a
/// process do not clash).
pub struct EngineMetrics {
    registry: Registry,
    pub(crate) waiting: IntGauge,
    pub(crate) running: IntGauge,
    pub(crate) finished: IntCounterVec,
    pub(crate) prompt_tokens: IntCounter,
    pub(crate) generation_tokens: IntCounter,
    pub(crate) tokens_per_second: Gauge,
    pub(crate) time_to_first_token: Histogram,
    pub(crate) inter_token_latency: Histogram,
    pub(crate) request_latency: Histogram,
    pub(crate) prefix_query_tokens: IntCounter,
    pub(crate) prefix_hit_tokens: IntCounter,
    pub(crate) prefix_hit_rate: Gauge,
    pub(crate) prefix_entries: IntGauge,
    pub(crate) kv_capacity: IntGauge,
    pub(crate) kv_request_tokens: IntGauge,
    pub(crate) kv_prefix_cache_tokens: IntGauge,
    pub(crate) kv_reserved_tokens: IntGauge,
    pub(crate) kv_usage: Gauge,
    pub(crate) steps: IntCounter,
    pub(crate) batch_size: Histogram,
}

const REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

impl EngineMetrics {
    pub(crate) fn new() -> Result<EngineMetrics, prometheus::Error> {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let fgauge = |name: &str, help: &str| -> Result<Gauge, prometheus::Error> {
            let g = Gauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram =
            |name: &str, help: &str, buckets: Vec<f64>| -> Result<Histogram, prometheus::Error> {
                let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        let finished = IntCounterVec::new(
            Opts::new(
                "mlx_engine_requests_finished_total",
                "Requests finished, by finish reason",
            ),
            &["finish_reason"],
        )?;
        registry.register(Box::new(finished.clone()))?;
        for r in REASONS {
            finished.with_label_values(&[r]);
        }
        // 1 ms to ~65 s: a token on a busy CPU to a long queue wait.
        let latency = exponential_buckets(0.001, 2.0, 17)?;
        Ok(EngineMetrics {
            waiting: gauge(
                "mlx_engine_waiting_requests",
                "Requests waiting for admission",
            )?,
            running: gauge(
                "mlx_engine_running_requests",
                "Requests admitted (prefilling or decoding)",
            )?,
            prompt_tokens: counter("mlx_engine_prompt_tokens_total", "Prompt tokens admitted")?,
            generation_tokens: counter("mlx_engine_generation_tokens_total", "Tokens sampled")?,
            tokens_per_second: fgauge(
                "mlx_engine_generation_tokens_per_second",
                "Tokens sampled per second over the last 5 seconds",
            )?,
            time_to_first_token: histogram(
                "mlx_engine_time_to_first_token_seconds",
                "From submission to the first sampled token",
                latency.clone(),
            )?,
            inter_token_latency: histogram(
                "mlx_engine_inter_token_latency_seconds",
                "Between two sampled tokens of a request",
                latency.clone(),
            )?,
            request_latency: histogram(
                "mlx_engine_request_latency_seconds",
                "From submission to the end of a request",
                latency,
            )?,
            prefix_query_tokens: counter(
                "mlx_engine_prefix_cache_query_tokens_total",
                "Prompt tokens looked up in the prefix cache",
            )?,
            prefix_hit_tokens: counter(
                "mlx_engine_prefix_cache_hit_tokens_total",
                "Prompt tokens whose KV the prefix cache served",
            )?,
            prefix_hit_rate: fgauge(
                "mlx_engine_prefix_cache_hit_rate",
                "Hit tokens over query tokens since start",
            )?,
            prefix_entries: gauge(
                "mlx_engine_prefix_cache_entries",
                "Finished requests whose KV the prefix cache keeps",
            )?,
            kv_capacity: gauge(
                "mlx_engine_kv_capacity_tokens",
                "KV cache capacity of the runner, in tokens",
            )?,
            kv_request_tokens: gauge(
                "mlx_engine_kv_request_tokens",
                "KV tokens held by running requests",
            )?,
            kv_prefix_cache_tokens: gauge(
                "mlx_engine_kv_prefix_cache_tokens",
                "KV tokens the prefix cache keeps for finished requests",
            )?,
            kv_reserved_tokens: gauge(
                "mlx_engine_kv_reserved_tokens",
                "KV tokens reserved by running requests (prompt plus max_tokens)",
            )?,
            kv_usage: fgauge(
                "mlx_engine_kv_usage_ratio",
                "KV tokens held (requests and prefix cache) over capacity",
            )?,
            steps: counter("mlx_engine_steps_total", "Forward batches run")?,
            batch_size: histogram(
                "mlx_engine_batch_requests",
                "Requests per forward batch",
                exponential_buckets(1.0, 2.0, 10)?,
            )?,
            finished,
            registry,
        })
    }

    /// Everything in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |g: &IntGauge| g.get().max(0) as usize;
        MetricsSnapshot {
            waiting_requests: g(&self.waiting),
            running_requests: g(&self.running),
            kv_request_tokens: g(&self.kv_request_tokens),
            kv_prefix_cache_tokens: g(&self.kv_prefix_cache_tokens),
            prefix_cache_entries: g(&self.prefix_entries),
            kv_capacity_tokens: g(&self.kv_capacity),
            prompt_tokens_total: self.prompt_tokens.get(),
            generation_tokens_total: self.generation_tokens.get(),
            prefix_cache_query_tokens: self.prefix_query_tokens.get(),
            prefix_cache_hit_tokens: self.prefix_hit_tokens.get(),
            requests_finished: REASONS
                .iter()
                .map(|r| self.finished.with_label_values(&[*r]).get())
                .sum(),
        }
    }
}
