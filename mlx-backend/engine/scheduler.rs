//! The scheduler loop (SGLang's scheduler, TGI's router): one thread owns
//! the runner and, step after step, builds one forward batch from
//!
//! 1. one decode token for every running request that has finished its
//!    prefill (continuous batching: requests join and leave between steps);
//! 2. prompt chunks, in admission order, up to
//!    [`EngineConfig::prefill_tokens_per_step`] tokens, so a long prompt is
//!    prefilled over several steps while the running streams keep their
//!    pace;
//! 3. newly admitted requests, first come first served, while the budget
//!    lasts: a request is admitted when its prompt plus `max_tokens` fit the
//!    KV capacity next to what the running requests reserved, evicting
//!    prefix-cache entries (least recently used first) to make room. The
//!    head of the queue waits rather than being overtaken.
//!
//! Reserving `max_tokens` up front means a running request never runs out
//! of KV, so nothing is ever preempted; what is reserved but not yet used
//! is what the prefix cache may hold meanwhile.
//!
//! Cancelled requests (stream dropped, aborted) are removed at the start of
//! a step and their KV released. A batch the runner rejects changes nothing
//! in the runner; the request it names fails alone and the rest run again.

use super::config::EngineConfig;
use super::error::EngineError;
use super::metrics::EngineMetrics;
use super::prefix_cache::PrefixCache;
use super::request::{Event, FinishReason, Finished, SampledToken, Usage};
use super::stop::TextOutput;
use super::stream::EventSender;
use crate::runner::{
    ForwardBatch, ForwardMode, ForwardOutput, ModelRunner, RequestId, RequestInput, ReturnOptions,
    RunnerError, SamplingParams,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum Command {
    Submit(Box<Pending>),
    Abort(RequestId),
    Shutdown,
}

/// A checked request waiting for admission.
pub(crate) struct Pending {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub returns: ReturnOptions,
    pub output: TextOutput,
    pub sender: EventSender,
    pub submitted: Instant,
}

/// An admitted request.
struct Active {
    req: Pending,
    /// Prompt tokens the runner holds (copied from the prefix cache or prefilled).
    prefilled: usize,
    generated: Vec<u32>,
    /// Generated tokens fed back (all but the last, once decoding).
    fed_generated: usize,
    /// KV tokens reserved: prompt plus `max_tokens`.
    reserved: usize,
    cached_prefix: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Registered in the prefix cache as a running donor.
    donor: bool,
}

impl Active {
    /// Tokens the runner holds for it.
    fn cached(&self) -> usize {
        self.prefilled + self.fed_generated
    }

    fn prefill_done(&self) -> bool {
        self.prefilled == self.req.prompt.len()
    }

    /// Every token whose KV the runner holds for it.
    fn fed(&self) -> Vec<u32> {
        let mut t = self.req.prompt[..self.prefilled].to_vec();
        t.extend_from_slice(&self.generated[..self.fed_generated]);
        t
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Decode,
    Chunk { tokens: usize, last: bool },
}

pub(crate) struct Scheduler<R: ModelRunner> {
    runner: R,
    config: EngineConfig,
    capacity: usize,
    waiting: VecDeque<Pending>,
    /// In admission order.
    active: Vec<Active>,
    /// KV tokens reserved by `active`.
    reserved: usize,
    prefix: PrefixCache,
    metrics: Arc<EngineMetrics>,
    /// Shared with the submitting side, which refuses past the limit.
    waiting_count: Arc<AtomicUsize>,
    /// (time, tokens sampled so far) over the last few seconds.
    rate_window: VecDeque<(Instant, u64)>,
    /// The runner thread is gone; everything left fails.
    runner_dead: Option<RunnerError>,
}

impl<R: ModelRunner> Scheduler<R> {
    pub fn new(
        runner: R,
        config: EngineConfig,
        metrics: Arc<EngineMetrics>,
        waiting_count: Arc<AtomicUsize>,
    ) -> Self {
        let capacity = runner.info().kv_capacity_tokens;
        metrics.kv_capacity.set(capacity as i64);
        Scheduler {
            runner,
            prefix: PrefixCache::new(config.prefix_cache_min_tokens),
            config,
            capacity,
            waiting: VecDeque::new(),
            active: Vec::new(),
            reserved: 0,
            metrics,
            waiting_count,
            rate_window: VecDeque::new(),
            runner_dead: None,
        }
    }

    fn idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Take one command; false: shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit(p) => self.waiting.push_back(*p),
            Command::Abort(id) => {
                if let Some(p) = self.waiting.iter().find(|p| p.id == id) {
                    p.sender.cancel();
                }
                if let Some(a) = self.active.iter().find(|a| a.req.id == id) {
                    a.req.sender.cancel();
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    /// Serve until shut down or every engine handle is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        'serve: loop {
            if self.idle() {
                self.update_gauges();
                match commands.recv() {
                    Ok(c) => {
                        if !self.handle(c) {
                            break 'serve;
                        }
                    }
                    Err(_) => break 'serve,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(c) => {
                        if !self.handle(c) {
                            break 'serve;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break 'serve,
                }
            }
            self.drop_cancelled();
            if self.runner_dead.is_some() {
                self.fail_everything();
                continue;
            }
            self.step();
            self.update_gauges();
        }
        self.shut_down();
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].sender.cancelled() {
                let p = self.waiting.remove(i).expect("index in range");
                self.waiting_count.fetch_sub(1, Ordering::AcqRel);
                self.finish_waiting(p, FinishReason::Abort, None);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].req.sender.cancelled() {
                self.finish(i, FinishReason::Abort, None);
            } else {
                i += 1;
            }
        }
    }

    /// Build and run one batch.
    fn step(&mut self) {
        let mut inputs = Vec::new();
        let mut slots: Vec<(RequestId, Slot)> = Vec::new();
        for a in self.active.iter().filter(|a| a.prefill_done()) {
            let Some(&token) = a.generated.last() else {
                continue;
            };
            inputs.push(
                RequestInput::decode(a.req.id, token, a.cached(), a.req.sampling.clone())
                    .with_returns(a.req.returns.clone()),
            );
            slots.push((a.req.id, Slot::Decode));
        }
        let mut budget = self.config.prefill_tokens_per_step.max(1);
        for i in 0..self.active.len() {
            if budget == 0 {
                break;
            }
            if !self.active[i].prefill_done() {
                budget -= self.push_chunk(i, budget, &mut inputs, &mut slots);
            }
        }
        while budget > 0 && self.active.len() < self.config.max_running_requests.max(1) {
            let Some(i) = self.admit() else { break };
            budget -= self.push_chunk(i, budget, &mut inputs, &mut slots);
        }
        if inputs.is_empty() {
            return;
        }
        let decodes = slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Decode))
            .count();
        let mode = match decodes {
            0 => ForwardMode::Extend,
            n if n == inputs.len() => ForwardMode::Decode,
            _ => ForwardMode::Mixed,
        };
        let batch = ForwardBatch::new(mode, inputs);
        self.metrics.steps.inc();
        self.metrics.batch_size.observe(batch.requests.len() as f64);
        match self.runner.forward(&batch) {
            Ok(out) => self.apply(out, &slots),
            Err(e) => self.fail_batch(e, &slots),
        }
    }

    /// Add active request `i`'s next prompt chunk (at most `budget` tokens);
    /// returns its size.
    fn push_chunk(
        &self,
        i: usize,
        budget: usize,
        inputs: &mut Vec<RequestInput>,
        slots: &mut Vec<(RequestId, Slot)>,
    ) -> usize {
        let a = &self.active[i];
        let start = a.prefilled;
        let n = (a.req.prompt.len() - start).min(budget);
        let last = start + n == a.req.prompt.len();
        inputs.push(
            RequestInput::chunk(
                a.req.id,
                a.req.prompt[start..start + n].to_vec(),
                start,
                last,
                a.req.sampling.clone(),
            )
            .with_returns(a.req.returns.clone()),
        );
        slots.push((a.req.id, Slot::Chunk { tokens: n, last }));
        n
    }

    /// Admit the head of the queue if its reservation fits (evicting prefix
    /// cache entries as needed); returns its index in `active`.
    fn admit(&mut self) -> Option<usize> {
        let need = {
            let p = self.waiting.front()?;
            p.prompt.len() + p.max_tokens
        };
        while self.reserved + self.prefix.retained_tokens() + need > self.capacity {
            let (id, _) = self.prefix.evict_lru()?;
            self.runner.release(&[id]);
        }
        let req = self.waiting.pop_front()?;
        self.waiting_count.fetch_sub(1, Ordering::AcqRel);
        let mut prefilled = 0;
        if self.config.prefix_cache {
            if let Some((donor, n)) = self.prefix.lookup(&req.prompt) {
                // A failed copy only costs the prefill it would have saved.
                if self.runner.copy_prefix(donor, req.id, n).is_ok() {
                    prefilled = n;
                }
            }
        }
        let m = &self.metrics;
        m.prompt_tokens.inc_by(req.prompt.len() as u64);
        m.prefix_query_tokens.inc_by(req.prompt.len() as u64);
        m.prefix_hit_tokens.inc_by(prefilled as u64);
        self.reserved += need;
        self.active.push(Active {
            req,
            prefilled,
            generated: Vec::new(),
            fed_generated: 0,
            reserved: need,
            cached_prefix: prefilled,
            first_token: None,
            last_token: None,
            donor: false,
        });
        Some(self.active.len() - 1)
    }

    fn position(&self, id: RequestId) -> Option<usize> {
        self.active.iter().position(|a| a.req.id == id)
    }

    fn apply(&mut self, out: ForwardOutput, slots: &[(RequestId, Slot)]) {
        let now = Instant::now();
        let mut ended: Vec<(RequestId, FinishReason, Option<EngineError>)> = Vec::new();
        for (&(id, slot), o) in slots.iter().zip(out.outputs) {
            let Some(i) = self.position(id) else { continue };
            let a = &mut self.active[i];
            match slot {
                Slot::Decode => a.fed_generated += 1,
                Slot::Chunk { tokens, last } => {
                    a.prefilled += tokens;
                    if last && self.config.prefix_cache {
                        self.prefix.add_running(id, &a.req.prompt);
                        a.donor = true;
                    }
                }
            }
            let Some(token) = o.next_token else { continue };
            a.generated.push(token);
            match a.last_token {
                None => {
                    self.metrics
                        .time_to_first_token
                        .observe((now - a.req.submitted).as_secs_f64());
                    a.first_token = Some(now);
                }
                Some(t) => self
                    .metrics
                    .inter_token_latency
                    .observe((now - t).as_secs_f64()),
            }
            a.last_token = Some(now);
            self.metrics.generation_tokens.inc();
            let sampled = SampledToken {
                id: token,
                logprob: o.logprob.filter(|_| a.req.returns.logprob),
                top_logprobs: o.top_logprobs,
            };
            match a.req.output.push(token) {
                Ok((text, end)) => {
                    a.req.sender.send(Event::Delta {
                        text,
                        token: Some(sampled),
                    });
                    if let Some(reason) = end {
                        ended.push((id, reason, None));
                    }
                }
                Err(e) => ended.push((id, FinishReason::Error, Some(e.into()))),
            }
        }
        for (id, reason, error) in ended {
            if let Some(i) = self.position(id) {
                self.finish(i, reason, error);
            }
        }
    }

    /// The runner rejected the batch (and changed nothing). A request it
    /// names fails alone; otherwise every request of the batch fails.
    fn fail_batch(&mut self, e: RunnerError, slots: &[(RequestId, Slot)]) {
        let culprit = match &e {
            RunnerError::UnknownRequest(id)
            | RunnerError::DuplicateRequest(id)
            | RunnerError::EmptyTokens(id) => Some(*id),
            RunnerError::InvalidToken { id, .. }
            | RunnerError::CachedMismatch { id, .. }
            | RunnerError::ContextTooLong { id, .. }
            | RunnerError::BadDecode { id, .. }
            | RunnerError::BadMode { id, .. }
            | RunnerError::BadSampling { id, .. } => Some(*id),
            _ => None,
        };
        if matches!(e, RunnerError::Stopped | RunnerError::Panicked(_)) {
            self.runner_dead = Some(e);
            return;
        }
        let failed: Vec<RequestId> = match culprit.and_then(|id| self.position(id).map(|_| id)) {
            Some(id) => vec![id],
            None => slots.iter().map(|(id, _)| *id).collect(),
        };
        for id in failed {
            if let Some(i) = self.position(id) {
                self.finish(i, FinishReason::Error, Some(EngineError::Runner(e.clone())));
            }
        }
    }

    /// End active request `i`: its last event, its metrics, its KV (kept
    /// by the prefix cache after a normal end, released otherwise).
    fn finish(&mut self, i: usize, reason: FinishReason, error: Option<EngineError>) {
        let a = self.active.remove(i);
        self.reserved -= a.reserved;
        let id = a.req.id;
        let normal = matches!(reason, FinishReason::Stop | FinishReason::Length);
        if normal && self.config.prefix_cache {
            let mut release = self.prefix.add_finished(id, a.fed());
            while self.prefix.retained_entries() > self.config.prefix_cache_max_entries {
                match self.prefix.evict_lru() {
                    Some((old, _)) => release.push(old),
                    None => break,
                }
            }
            if !release.is_empty() {
                self.runner.release(&release);
            }
        } else {
            if a.donor {
                self.prefix.remove_running(id);
            }
            self.runner.release(&[id]);
        }
        let usage = Usage {
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: a.generated.len(),
            cached_tokens: a.cached_prefix,
        };
        let ttft = a.first_token.map(|t| t - a.req.submitted);
        self.send_finished(&a.req, reason, usage, ttft, error);
    }

    fn finish_waiting(&mut self, p: Pending, reason: FinishReason, error: Option<EngineError>) {
        let usage = Usage {
            prompt_tokens: p.prompt.len(),
            ..Usage::default()
        };
        self.send_finished(&p, reason, usage, None, error);
    }

    fn send_finished(
        &self,
        req: &Pending,
        reason: FinishReason,
        usage: Usage,
        ttft: Option<Duration>,
        error: Option<EngineError>,
    ) {
        let total = req.submitted.elapsed();
        self.metrics
            .finished
            .with_label_values(&[reason.as_str()])
            .inc();
        self.metrics.request_latency.observe(total.as_secs_f64());
        req.sender.send(Event::Finished(Finished {
            reason,
            usage,
            time_to_first_token: ttft,
            total_time: total,
            error,
        }));
    }

    fn fail_everything(&mut self) {
        let e = self.runner_dead.clone().unwrap_or(RunnerError::Stopped);
        while !self.active.is_empty() {
            self.finish(0, FinishReason::Error, Some(EngineError::Runner(e.clone())));
        }
        while let Some(p) = self.waiting.pop_front() {
            self.waiting_count.fetch_sub(1, Ordering::AcqRel);
            self.finish_waiting(p, FinishReason::Error, Some(EngineError::Runner(e.clone())));
        }
        self.update_gauges();
    }

    /// Abort everything in flight and give all KV back.
    fn shut_down(&mut self) {
        while !self.active.is_empty() {
            self.finish(0, FinishReason::Abort, None);
        }
        while let Some(p) = self.waiting.pop_front() {
            self.waiting_count.fetch_sub(1, Ordering::AcqRel);
            self.finish_waiting(p, FinishReason::Abort, None);
        }
        let retained = self.prefix.drain();
        if !retained.is_empty() {
            self.runner.release(&retained);
        }
        self.update_gauges();
    }

    fn update_gauges(&mut self) {
        let m = &self.metrics;
        m.waiting.set(self.waiting.len() as i64);
        m.running.set(self.active.len() as i64);
        let held: usize = self.active.iter().map(Active::cached).sum();
        m.kv_request_tokens.set(held as i64);
        m.kv_prefix_cache_tokens
            .set(self.prefix.retained_tokens() as i64);
        m.kv_reserved_tokens.set(self.reserved as i64);
        m.prefix_entries.set(self.prefix.retained_entries() as i64);
        m.kv_usage
            .set((held + self.prefix.retained_tokens()) as f64 / self.capacity.max(1) as f64);
        let queried = m.prefix_query_tokens.get();
        if queried > 0 {
            m.prefix_hit_rate
                .set(m.prefix_hit_tokens.get() as f64 / queried as f64);
        }
        let now = Instant::now();
        self.rate_window.push_back((now, m.generation_tokens.get()));
        while self
            .rate_window
            .front()
            .is_some_and(|(t, _)| now - *t > Duration::from_secs(5))
        {
            self.rate_window.pop_front();
        }
        let rate = match (self.rate_window.front(), self.rate_window.back()) {
            (Some(&(t0, n0)), Some(&(t1, n1))) if t1 > t0 => {
                (n1 - n0) as f64 / (t1 - t0).as_secs_f64()
            }
            _ => 0.0,
        };
        m.tokens_per_second.set(rate);
    }
}
