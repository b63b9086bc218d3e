//! [`MlxModelRunner`]: validates a batch completely before touching any
//! state, runs prompt chunks one request at a time and every decode row in
//! one ragged batch, samples on the device and reads back only tokens.

use super::batch::{
    ForwardBatch, ForwardMode, ForwardOutput, RequestId, RequestInput, RequestOutput,
};
use super::error::RunnerError;
use super::kv::KvStore;
use super::metrics::RunnerMetrics;
use super::sampler::{self, Sampled};
use super::{ModelRunner, RunnerInfo};
use crate::model::{self, LayerKvCache, LoadOptions, Logits, Transformer};
use crate::Array;
use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

/// How the runner sizes and manages its state.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// KV cache budget in tokens across all requests.
    pub kv_budget_tokens: usize,
    /// Longest context one request may reach (capped by the model's).
    pub max_context: Option<usize>,
    /// KV caches grow in steps of this many positions.
    pub kv_step: i32,
    /// Released caches kept for reuse.
    pub pool_limit: usize,
    /// SGLang's stale cleanup: a Decode batch releases running requests it omits.
    pub release_missing_on_decode: bool,
    /// Run the fused kernels once on the model's shapes at load, so a kernel
    /// that cannot run is found (and remembered as failed) before serving.
    pub warmup_kernels: bool,
    /// Tensor parallelism over this many ranks, the group of the
    /// environment (`mlx.launch` or `distributed::launch`); such a runner is
    /// started with [`tensor_parallel::start`](super::tensor_parallel::start).
    /// `None`: one process.
    pub tensor_parallel: Option<usize>,
    /// Under tensor parallelism: how long rank 0 waits for a step (or for
    /// the group to form) before failing with a typed error, and how long a
    /// follower waits to hear from rank 0 before exiting. It must exceed
    /// the slowest step.
    pub peer_timeout: std::time::Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            kv_budget_tokens: 65536,
            max_context: None,
            kv_step: 256,
            pool_limit: 64,
            release_missing_on_decode: false,
            warmup_kernels: true,
            tensor_parallel: None,
            peer_timeout: std::time::Duration::from_secs(60),
        }
    }
}

/// The runner over one [`Transformer`]: a KV cache per request within a
/// token budget, chunked prefill, ragged decode batches, and sampling.
pub struct MlxModelRunner {
    model: Transformer,
    kv: KvStore,
    config: RunnerConfig,
    max_context: usize,
    metrics: RunnerMetrics,
    /// Seeds requests that bring none.
    unseeded: u64,
}

/// A validated request: whether it decodes (joins the ragged batch) or extends.
struct Planned<'a> {
    input: &'a RequestInput,
    decode: bool,
}

impl Planned<'_> {
    /// Its token is the argmax of its logits and nothing else is returned.
    fn plain_greedy(&self) -> bool {
        let (s, r) = (&self.input.sampling, &self.input.returns);
        s.temperature <= 0.0
            && !s.uses_history()
            && s.logit_bias.is_empty()
            && !r.logprob
            && r.top_logprobs == 0
            && !r.logits
    }
}

impl MlxModelRunner {
    /// Wraps a loaded model (no kernel warmup: see [`MlxModelRunner::load`]).
    pub fn new(model: Transformer, config: RunnerConfig) -> MlxModelRunner {
        let model_max = model.config.max_context().max(1);
        let max_context = config.max_context.map_or(model_max, |m| m.min(model_max));
        MlxModelRunner {
            kv: KvStore::new(config.kv_budget_tokens, config.kv_step, config.pool_limit),
            model,
            config,
            max_context,
            metrics: RunnerMetrics::default(),
            unseeded: 0x5eed,
        }
    }

    /// Load a GGUF file or HF folder and wrap it.
    pub fn load(
        path: impl AsRef<Path>,
        options: &LoadOptions,
        config: RunnerConfig,
    ) -> Result<MlxModelRunner, RunnerError> {
        if config.tensor_parallel.is_some_and(|n| n > 1) {
            return Err(RunnerError::Unsupported(
                "tensor_parallel in MlxModelRunner::load (use runner::tensor_parallel::start)",
            ));
        }
        let loaded = model::load(path, options)?;
        Ok(Self::warmed_up(loaded.model, config))
    }

    /// Load this rank's shard of a model for tensor parallelism over
    /// `group` (see [`model::load_shard`]); what
    /// [`tensor_parallel::start`](super::tensor_parallel::start) runs on
    /// every rank.
    pub fn load_shard(
        path: impl AsRef<Path>,
        options: &LoadOptions,
        config: RunnerConfig,
        group: &crate::distributed::Group,
    ) -> Result<MlxModelRunner, RunnerError> {
        let loaded = model::load_shard(path, options, group)?;
        Ok(Self::warmed_up(loaded.model, config))
    }

    fn warmed_up(model: Transformer, config: RunnerConfig) -> MlxModelRunner {
        let warmup = config.warmup_kernels;
        let runner = MlxModelRunner::new(model, config);
        if warmup {
            // A failing kernel is remembered and falls back; serving goes on.
            if let Err(e) = crate::kernels::warmup_for_model(&runner.model.kernel_dims()) {
                eprintln!("mlx-backend: kernel warmup: {e}");
            }
        }
        runner
    }

    /// The model it runs.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// Drop pooled cache buffers.
    pub fn clear_pool(&mut self) {
        self.kv.clear_pool();
    }

    fn validate<'a>(&self, batch: &'a ForwardBatch) -> Result<Vec<Planned<'a>>, RunnerError> {
        let vocab = self.model.config.vocab_size;
        let mut seen = HashSet::new();
        let mut plan = Vec::with_capacity(batch.requests.len());
        let mut new_tokens = 0usize;
        for r in &batch.requests {
            if !seen.insert(r.id) {
                return Err(RunnerError::DuplicateRequest(r.id));
            }
            if let Some(&token) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(RunnerError::InvalidToken {
                    id: r.id,
                    token,
                    vocab,
                });
            }
            let s = &r.sampling;
            for (name, value, ok) in [
                (
                    "temperature",
                    s.temperature,
                    s.temperature >= 0.0 && s.temperature.is_finite(),
                ),
                ("top_p", s.top_p, s.top_p > 0.0 && s.top_p <= 1.0),
                ("min_p", s.min_p, (0.0..=1.0).contains(&s.min_p)),
                (
                    "repetition_penalty",
                    s.repetition_penalty,
                    s.repetition_penalty > 0.0,
                ),
            ] {
                if !ok {
                    return Err(RunnerError::BadSampling {
                        id: r.id,
                        name,
                        value,
                    });
                }
            }
            if let Some(&(token, _)) = s.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
                return Err(RunnerError::InvalidToken {
                    id: r.id,
                    token,
                    vocab,
                });
            }
            let actual = self.kv.get(r.id).map_or(0, |s| s.cached());
            let known = self.kv.contains(r.id);
            let decode = match batch.mode {
                ForwardMode::Idle => {
                    return Err(RunnerError::BadMode {
                        id: r.id,
                        mode: batch.mode,
                        reason: "an Idle batch carries no requests",
                    })
                }
                ForwardMode::Decode => {
                    if !known {
                        return Err(RunnerError::UnknownRequest(r.id));
                    }
                    if r.tokens.len() != 1 {
                        return Err(RunnerError::BadDecode {
                            id: r.id,
                            got: r.tokens.len(),
                        });
                    }
                    true
                }
                ForwardMode::Extend => false,
                ForwardMode::Mixed => known && r.tokens.len() == 1 && actual > 0 && r.last_chunk,
            };
            if r.tokens.is_empty() {
                return Err(RunnerError::EmptyTokens(r.id));
            }
            if r.cached_tokens != actual || (!known && r.cached_tokens != 0) {
                return Err(RunnerError::CachedMismatch {
                    id: r.id,
                    claimed: r.cached_tokens,
                    actual,
                });
            }
            let length = actual + r.tokens.len();
            if length > self.max_context {
                return Err(RunnerError::ContextTooLong {
                    id: r.id,
                    length,
                    max: self.max_context,
                });
            }
            new_tokens += r.tokens.len();
            plan.push(Planned { input: r, decode });
        }
        let cached = self.kv.cached_tokens();
        let available = self.kv.budget_tokens.saturating_sub(cached);
        if new_tokens > available {
            return Err(RunnerError::KvBudgetExceeded {
                needed: new_tokens,
                available,
                budget: self.kv.budget_tokens,
            });
        }
        Ok(plan)
    }

    /// Build the logits rows (`[V]` each) of the plan's prefill entries that
    /// sample (their last chunks), and the decode rows' logits as one
    /// `[n, V]` array with the plan index of each of its rows.
    fn run_model(&mut self, plan: &[Planned<'_>]) -> Result<ModelOutput, RunnerError> {
        let mut rows: Vec<Option<Array>> = vec![None; plan.len()];
        for (i, p) in plan.iter().enumerate().filter(|(_, p)| !p.decode) {
            let r = p.input;
            if !self.kv.contains(r.id) {
                self.kv.allocate(r.id, &self.model);
            }
            let state = self.kv.get_mut(r.id).expect("allocated above");
            let tokens = Array::from_slice(&r.tokens, &[1, r.tokens.len() as i32]).map_err(host)?;
            let logits = self
                .model
                .forward(&tokens, &mut state.caches, Logits::Last)?;
            if r.last_chunk {
                rows[i] = Some(logits.reshape(&[-1])?);
            } else if r.tokens.len() == 1 {
                // One token runs as a fused decode node that writes the
                // caches in place when it is evaluated; its caches look
                // evaluated already, so only its output makes it run.
                crate::eval(&[&logits])?;
            }
        }
        let decode: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].decode).collect();
        if !decode.is_empty() {
            let tokens: Vec<u32> = decode.iter().map(|&i| plan[i].input.tokens[0]).collect();
            let tokens = Array::from_slice(&tokens, &[tokens.len() as i32, 1]).map_err(host)?;
            let ids: Vec<RequestId> = decode.iter().map(|&i| plan[i].input.id).collect();
            let mut taken: Vec<Vec<LayerKvCache>> = ids
                .iter()
                .map(|id| std::mem::take(&mut self.kv.get_mut(*id).expect("validated").caches))
                .collect();
            let result = {
                let mut views: Vec<&mut [LayerKvCache]> =
                    taken.iter_mut().map(|c| c.as_mut_slice()).collect();
                self.model.forward_decode_batch(&tokens, &mut views)
            };
            for (id, caches) in ids.iter().zip(taken) {
                self.kv.get_mut(*id).expect("validated").caches = caches;
            }
            return Ok((rows, Some((result?, decode))));
        }
        Ok((rows, None))
    }

    /// Undo a failed batch: caches back to their lengths, new requests gone.
    fn roll_back(&mut self, before: &[(RequestId, Option<usize>)]) {
        for &(id, len) in before {
            match len {
                None => self.kv.release(id),
                Some(len) => {
                    if let Some(state) = self.kv.get_mut(id) {
                        for c in &mut state.caches {
                            c.truncate(len as i32);
                        }
                    }
                }
            }
        }
    }

    fn forward_inner(&mut self, plan: &[Planned<'_>]) -> Result<ForwardOutput, RunnerError> {
        let start = Instant::now();
        let (mut rows, decode_block) = self.run_model(plan)?;
        // A decode block whose rows all pick greedily and return nothing
        // else reads its logits back once and takes each row's argmax on
        // the host (`sampler::greedy_rows`), instead of a slice, an argmax
        // and a read per row (at batch 8, ~30 graph nodes and 8
        // evaluations fewer per step); otherwise each row is sliced out and
        // sampled on its own.
        // On a GPU the argmax runs there instead, and only the tokens come
        // back: the logits live in managed memory, and a host read of batch
        // 32's (6 MB) migrates their pages.
        let mut greedy_block = None;
        if let Some((logits, idx)) = decode_block {
            if idx.iter().all(|&i| plan[i].plain_greedy()) {
                let picked = if matches!(crate::Stream::current().device(), crate::Device::Gpu(_)) {
                    GreedyBlock::Tokens(logits.argmax(-1, false)?.astype(crate::Dtype::U32)?)
                } else {
                    GreedyBlock::Logits(logits.astype(crate::Dtype::F32)?)
                };
                greedy_block = Some((picked, idx));
            } else {
                for (row, &i) in idx.iter().enumerate() {
                    let row = row as i32;
                    rows[i] = Some(logits.slice_axis(0, row, row + 1)?.reshape(&[-1])?);
                }
            }
        }
        let mut sampled: Vec<Option<Sampled>> = Vec::with_capacity(plan.len());
        for (p, row) in plan.iter().zip(&rows) {
            let Some(logits) = row else {
                sampled.push(None);
                continue;
            };
            let r = p.input;
            let state = self.kv.get(r.id).expect("ran above");
            let mut history = state.history.clone();
            history.extend_from_slice(&r.tokens);
            let seed = r.sampling.seed.unwrap_or(self.unseeded ^ r.id);
            // Greedy picks use no key: none is made.
            let key = if r.sampling.temperature > 0.0 {
                Some(sampler::step_key(seed, state.sampled)?)
            } else {
                None
            };
            sampled.push(Some(sampler::sample(
                logits,
                &r.sampling,
                &history,
                &r.returns,
                key.as_ref(),
            )?));
        }
        let mut to_eval: Vec<&Array> = Vec::new();
        to_eval.extend(greedy_block.iter().map(|(picked, _)| picked.array()));
        for s in sampled.iter().flatten() {
            to_eval.push(&s.token);
            to_eval.extend(s.logprob.iter());
            if let Some((ids, vals)) = &s.top {
                to_eval.push(ids);
                to_eval.push(vals);
            }
            to_eval.extend(s.logits.iter());
        }
        // Caches must be materialised too, so later steps never recompute
        // them: their whole buffers (slicing each to its length first cost
        // two graph nodes per layer and row, ~1 ms a step at batch 8). Those
        // the fused decode wrote in place are evaluated already: handing
        // MLX 960 of them at batch 16 cost ~0.2 ms a step.
        to_eval.extend(
            plan.iter()
                .filter_map(|p| self.kv.get(p.input.id))
                .flat_map(|s| s.caches.iter().filter_map(|c| c.buffers()))
                .flat_map(|(k, v)| [k, v])
                .filter(|c| c.is_pending()),
        );
        let build_time = start.elapsed();
        crate::eval(&to_eval)?;
        let forward_time = start.elapsed();
        let sample_start = Instant::now();
        let mut block_tokens = vec![None; plan.len()];
        if let Some((picked, idx)) = &greedy_block {
            let tokens = match picked {
                GreedyBlock::Tokens(tokens) => tokens.to_vec::<u32>().map_err(host)?,
                GreedyBlock::Logits(logits) => {
                    let vocab = logits.shape().last().map_or(0, |&v| v.max(0) as usize);
                    // MLX's own buffer where it is dense (the fused head's
                    // is): a copy of batch 16's logits cost ~0.1 ms.
                    match logits.host_slice::<f32>().map_err(host)? {
                        Some(all) => sampler::greedy_rows(all, vocab),
                        None => sampler::greedy_rows(&logits.to_vec::<f32>().map_err(host)?, vocab),
                    }
                }
            };
            for (&i, t) in idx.iter().zip(tokens) {
                block_tokens[i] = Some(t);
            }
        }
        let mut outputs = Vec::with_capacity(plan.len());
        for ((p, s), block_token) in plan.iter().zip(sampled).zip(block_tokens) {
            let r = p.input;
            let mut out = RequestOutput {
                id: r.id,
                next_token: block_token,
                logprob: None,
                top_logprobs: Vec::new(),
                logits: None,
            };
            if let Some(s) = s {
                out.next_token = Some(read_u32(&s.token)?);
                if let Some(lp) = &s.logprob {
                    out.logprob = Some(lp.to_vec::<f32>().map_err(host)?[0]);
                }
                if let Some((ids, vals)) = &s.top {
                    let ids = ids
                        .astype(crate::Dtype::U32)?
                        .to_vec::<u32>()
                        .map_err(host)?;
                    let vals = vals.to_vec::<f32>().map_err(host)?;
                    let mut top: Vec<(u32, f32)> = ids.into_iter().zip(vals).collect();
                    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    out.top_logprobs = top;
                }
                if let Some(l) = &s.logits {
                    out.logits = Some(l.to_vec::<f32>().map_err(host)?);
                }
            }
            outputs.push(out);
        }
        for p in plan {
            let r = p.input;
            let state = self.kv.get_mut(r.id).expect("ran above");
            state.history.extend_from_slice(&r.tokens);
            if r.last_chunk || p.decode {
                state.sampled += 1;
            }
        }
        let sample_time = sample_start.elapsed();
        Ok(ForwardOutput {
            outputs,
            forward_time,
            build_time,
            sample_time,
        })
    }
}

/// Kernels whose body runs on `device`'s backend (the table of bodies, the
/// switches and the failures; a call's own inputs can still fall back).
fn fused_kernels(device: crate::Device) -> Vec<crate::kernels::Kernel> {
    use crate::kernels::{registry, Backend, Kernel};
    let backend = Backend::of(device);
    Kernel::ALL
        .into_iter()
        .filter(|&k| registry::is_fused_on(k, backend))
        .collect()
}

fn host(e: crate::HostDataError) -> RunnerError {
    RunnerError::Op(crate::OpError::new("runner", e.to_string()))
}

/// What [`MlxModelRunner::run_model`] builds: the logits row of each
/// prefill entry that samples, and the decode rows' `[n, V]` logits with
/// their plan indices.
type ModelOutput = (Vec<Option<Array>>, Option<(Array, Vec<usize>)>);

/// A decode block's greedy picks: its logits, to be read and reduced on the
/// host (CPU), or the tokens the device picked (GPU).
enum GreedyBlock {
    Logits(Array),
    Tokens(Array),
}

impl GreedyBlock {
    fn array(&self) -> &Array {
        match self {
            GreedyBlock::Logits(a) | GreedyBlock::Tokens(a) => a,
        }
    }
}

fn read_u32(a: &Array) -> Result<u32, RunnerError> {
    let v = a
        .astype(crate::Dtype::U32)?
        .reshape(&[-1])?
        .to_vec::<u32>()
        .map_err(host)?;
    Ok(v[0])
}

impl ModelRunner for MlxModelRunner {
    fn info(&self) -> RunnerInfo {
        let c = &self.model.config;
        let device = crate::Stream::current().device();
        RunnerInfo {
            architecture: c.architecture.name().to_string(),
            vocab_size: c.vocab_size,
            eos_token_ids: c.eos_token_ids.clone(),
            max_context: self.max_context,
            kv_capacity_tokens: self.kv.budget_tokens,
            dtype: self.model.dtype(),
            device,
            fused_kernels: fused_kernels(device),
        }
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, RunnerError> {
        if batch.mode == ForwardMode::Idle && batch.requests.is_empty() {
            return Ok(ForwardOutput {
                outputs: Vec::new(),
                forward_time: Default::default(),
                build_time: Default::default(),
                sample_time: Default::default(),
            });
        }
        let plan = self.validate(batch)?;
        if batch.mode == ForwardMode::Decode && self.config.release_missing_on_decode {
            let present: HashSet<RequestId> = batch.requests.iter().map(|r| r.id).collect();
            for id in self.kv.ids() {
                if !present.contains(&id) {
                    self.kv.release(id);
                }
            }
        }
        let before: Vec<(RequestId, Option<usize>)> = plan
            .iter()
            .map(|p| (p.input.id, self.kv.get(p.input.id).map(|s| s.cached())))
            .collect();
        match self.forward_inner(&plan) {
            Ok(out) => {
                let m = &mut self.metrics;
                m.forwards += 1;
                for p in &plan {
                    if p.decode {
                        m.tokens_decoded += 1;
                    } else {
                        m.tokens_prefilled += p.input.tokens.len() as u64;
                    }
                }
                m.last_forward_time = out.forward_time;
                m.last_sample_time = out.sample_time;
                m.forward_time += out.forward_time;
                m.sample_time += out.sample_time;
                Ok(out)
            }
            Err(e) => {
                self.roll_back(&before);
                Err(e)
            }
        }
    }

    fn release(&mut self, ids: &[RequestId]) {
        for &id in ids {
            self.kv.release(id);
        }
    }

    fn copy_prefix(
        &mut self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
    ) -> Result<(), RunnerError> {
        let held = self
            .kv
            .get(from)
            .map(|s| s.cached())
            .ok_or(RunnerError::UnknownRequest(from))?;
        if self.kv.contains(to) || from == to {
            return Err(RunnerError::DuplicateRequest(to));
        }
        if tokens == 0 || tokens > held {
            return Err(RunnerError::CachedMismatch {
                id: from,
                claimed: tokens,
                actual: held,
            });
        }
        let available = self
            .kv
            .budget_tokens
            .saturating_sub(self.kv.cached_tokens());
        if tokens > available {
            return Err(RunnerError::KvBudgetExceeded {
                needed: tokens,
                available,
                budget: self.kv.budget_tokens,
            });
        }
        self.kv.copy_prefix(from, to, tokens, &self.model)
    }

    fn metrics(&self) -> RunnerMetrics {
        RunnerMetrics {
            active_requests: self.kv.active(),
            cached_tokens: self.kv.cached_tokens(),
            pooled_caches: self.kv.pooled(),
            kernels: crate::kernels::registry::snapshot(),
            ..self.metrics.clone()
        }
    }
}
