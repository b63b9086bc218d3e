//! [`Engine`]: the handle callers hold. Submission checks and tokenizes a
//! request on the caller's thread, so a bad request is refused at once with
//! its own error and never reaches a batch.

use super::bundle::ModelBundle;
use super::config::EngineConfig;
use super::error::EngineError;
use super::metrics::{EngineMetrics, MetricsSnapshot};
use super::request::{GenerateRequest, Prompt};
use super::scheduler::{Command, Pending, Scheduler};
use super::stop::TextOutput;
use super::stream::{self, EventStream};
use crate::model::LoadOptions;
use crate::runner::{ModelRunner, RequestId, ReturnOptions, RunnerConfig, RunnerInfo};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Instant;

/// A serving engine: a scheduler thread that owns the runner, reachable
/// from any thread. `Clone + Send + Sync`; the last clone dropped (or
/// [`shutdown`](Engine::shutdown)) aborts what is in flight and joins the
/// thread, which drops the runner.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    commands: mpsc::Sender<Command>,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    eos_token_ids: Arc<[u32]>,
    info: RunnerInfo,
    config: EngineConfig,
    metrics: Arc<EngineMetrics>,
    waiting: Arc<AtomicUsize>,
    next_id: AtomicU64,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Inner {
    fn stop(&self) {
        let _ = self.commands.send(Command::Shutdown);
        let join = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(join) = join {
            if join.thread().id() != thread::current().id() {
                let _ = join.join();
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

type Ready = Result<(Tokenizer, Option<ChatTemplate>, Vec<u32>, RunnerInfo), EngineError>;

impl Engine {
    /// Start the scheduler thread, build the bundle there with `make` (a
    /// runner holding MLX arrays stays on the thread that made it), and
    /// return once it is built or failed.
    pub fn start<R, F>(config: EngineConfig, make: F) -> Result<Engine, EngineError>
    where
        R: ModelRunner + 'static,
        F: FnOnce() -> Result<ModelBundle<R>, EngineError> + Send + 'static,
    {
        let metrics =
            Arc::new(EngineMetrics::new().map_err(|e| EngineError::Internal(e.to_string()))?);
        let waiting = Arc::new(AtomicUsize::new(0));
        let (commands, inbox) = mpsc::channel::<Command>();
        let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
        let (thread_metrics, thread_waiting, thread_config) =
            (Arc::clone(&metrics), Arc::clone(&waiting), config.clone());
        let join = thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                let bundle = match catch_unwind(AssertUnwindSafe(make)) {
                    Ok(Ok(b)) => b,
                    Ok(Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    Err(p) => {
                        let _ = ready_tx.send(Err(EngineError::Internal(format!(
                            "building the model bundle panicked: {}",
                            panic_message(p)
                        ))));
                        return;
                    }
                };
                let info = bundle.runner.info();
                let _ = ready_tx.send(Ok((
                    bundle.tokenizer,
                    bundle.chat_template,
                    bundle.eos_token_ids,
                    info,
                )));
                let scheduler =
                    Scheduler::new(bundle.runner, thread_config, thread_metrics, thread_waiting);
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| scheduler.run(inbox))) {
                    eprintln!(
                        "mlx-backend: the engine's scheduler panicked: {}",
                        panic_message(p)
                    );
                }
            })
            .map_err(|e| EngineError::Internal(format!("starting the engine thread: {e}")))?;
        let ready = ready_rx.recv();
        let (tokenizer, chat_template, eos, info) = match ready {
            Ok(Ok(parts)) => parts,
            Ok(Err(e)) => {
                let _ = join.join();
                return Err(e);
            }
            Err(_) => {
                let _ = join.join();
                return Err(EngineError::ShutDown);
            }
        };
        Ok(Engine {
            inner: Arc::new(Inner {
                commands,
                tokenizer,
                chat_template,
                eos_token_ids: eos.into(),
                info,
                config,
                metrics,
                waiting,
                next_id: AtomicU64::new(1),
                thread: Mutex::new(Some(join)),
            }),
        })
    }

    /// Load a model (GGUF file or HF folder) into a [`ModelBundle`] on the
    /// engine's thread and serve it.
    pub fn load(
        path: impl AsRef<Path>,
        options: LoadOptions,
        runner: RunnerConfig,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let path = path.as_ref().to_path_buf();
        Engine::start(config, move || ModelBundle::load(&path, &options, runner))
    }

    /// The served model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The served model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.chat_template.as_ref()
    }

    /// The one EOS set (the tokenizer's and the runner's).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_token_ids
    }

    /// What the runner said at start.
    pub fn runner_info(&self) -> &RunnerInfo {
        &self.inner.info
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The engine's metrics now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Every metric in Prometheus' text format.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render()
    }

    /// The token ids a prompt becomes (chat template, then tokenizer).
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        let tok = &self.inner.tokenizer;
        match prompt {
            Prompt::Tokens(ids) => {
                let vocab = self.inner.info.vocab_size;
                if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(EngineError::InvalidToken { token, vocab });
                }
                Ok(ids.clone())
            }
            Prompt::Text(text) => Ok(tok.encode_with(text, tok.add_bos_token(), true)?),
            Prompt::Chat(messages) => {
                let template = self
                    .inner
                    .chat_template
                    .as_ref()
                    .ok_or(EngineError::NoChatTemplate)?;
                let text = template.render(messages, true)?;
                Ok(tok.encode_with(&text, tok.add_bos_token(), true)?)
            }
        }
    }

    /// Check and queue a request; its events come on the returned stream.
    /// Dropping the stream cancels the request.
    pub fn submit(&self, request: GenerateRequest) -> Result<EventStream, EngineError> {
        let submitted = Instant::now();
        let inner = &*self.inner;
        let prompt = self.prompt_ids(&request.prompt)?;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        check_sampling(&request, inner.info.vocab_size)?;
        let max_context = inner.info.max_context;
        let left = max_context.saturating_sub(prompt.len());
        let max_tokens = match request.max_tokens {
            Some(0) => {
                return Err(EngineError::InvalidParameter {
                    name: "max_tokens",
                    message: "must be at least 1".into(),
                })
            }
            Some(n) => n,
            None => inner.config.default_max_tokens.max(1).min(left),
        };
        if left == 0 || max_tokens > left {
            return Err(EngineError::ContextTooLong {
                prompt_tokens: prompt.len(),
                max_tokens,
                max_context,
            });
        }
        let needed = prompt.len() + max_tokens;
        if needed > inner.info.kv_capacity_tokens {
            return Err(EngineError::ExceedsKvCapacity {
                needed,
                capacity: inner.info.kv_capacity_tokens,
            });
        }
        let limit = inner.config.max_waiting_requests;
        if inner
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < limit).then_some(w + 1)
            })
            .is_err()
        {
            return Err(EngineError::QueueFull { waiting: limit });
        }
        let id: RequestId = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, events) = stream::channel(id, prompt.len());
        let eos: Arc<[u32]> = if request.ignore_eos {
            Arc::from(Vec::new())
        } else {
            Arc::clone(&inner.eos_token_ids)
        };
        let output = TextOutput::new(
            &inner.tokenizer,
            request.skip_special_tokens,
            eos,
            request.stop_token_ids,
            request.stop,
            max_tokens,
        );
        let pending = Pending {
            id,
            prompt,
            max_tokens,
            sampling: request.sampling,
            returns: ReturnOptions {
                logprob: request.logprobs,
                top_logprobs: request.top_logprobs,
                logits: false,
            },
            output,
            sender,
            submitted,
        };
        if inner
            .commands
            .send(Command::Submit(Box::new(pending)))
            .is_err()
        {
            inner.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::ShutDown);
        }
        Ok(events)
    }

    /// Cancel a request by id; its stream ends with `Abort`.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.commands.send(Command::Abort(id));
    }

    /// Abort everything in flight, stop the scheduler and drop the runner.
    /// Later submissions fail with [`EngineError::ShutDown`].
    pub fn shutdown(&self) {
        self.inner.stop();
    }
}

/// The runner's own checks, made at submission so a bad value fails this
/// request alone instead of the batch it would join.
fn check_sampling(r: &GenerateRequest, vocab: usize) -> Result<(), EngineError> {
    let s = &r.sampling;
    let bad = |name: &'static str, message: &str| {
        Err(EngineError::InvalidParameter {
            name,
            message: message.to_string(),
        })
    };
    if !(s.temperature.is_finite() && s.temperature >= 0.0) {
        return bad("temperature", "must be a finite number >= 0");
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return bad("top_p", "must be in (0, 1]");
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        return bad("min_p", "must be in [0, 1]");
    }
    if !(s.repetition_penalty.is_finite() && s.repetition_penalty > 0.0) {
        return bad("repetition_penalty", "must be a finite number > 0");
    }
    if !s.presence_penalty.is_finite() {
        return bad("presence_penalty", "must be finite");
    }
    if !s.frequency_penalty.is_finite() {
        return bad("frequency_penalty", "must be finite");
    }
    for &(token, bias) in &s.logit_bias {
        if token as usize >= vocab {
            return Err(EngineError::InvalidToken { token, vocab });
        }
        if !bias.is_finite() {
            return bad("logit_bias", "values must be finite");
        }
    }
    if let Some(&token) = r.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::InvalidToken { token, vocab });
    }
    if r.top_logprobs > vocab {
        return bad("top_logprobs", "must not exceed the vocabulary");
    }
    Ok(())
}
