//! A model bundle: the runner, the tokenizer, the chat template and one EOS
//! set, from one load (a GGUF file is read once for all of them).

use super::error::EngineError;
use crate::io::GgufFile;
use crate::model::{self, LoadOptions};
use crate::runner::tensor_parallel::{self, Follower, Rank, TensorParallelRunner};
use crate::runner::{MlxModelRunner, ModelRunner, RunnerConfig};
use crate::tokenizer::{self, ChatTemplate, Tokenizer};
use std::path::Path;

/// What an engine serves. `R` is any runner: [`MlxModelRunner`] built on
/// the engine's thread, or a [`RunnerHandle`](crate::runner::RunnerHandle)
/// to one on a thread of its own.
pub struct ModelBundle<R> {
    /// The runner that executes forward batches.
    pub runner: R,
    /// Its EOS ids are [`eos_token_ids`](Self::eos_token_ids).
    pub tokenizer: Tokenizer,
    /// The model's chat template, if it has one.
    pub chat_template: Option<ChatTemplate>,
    /// Every id that ends generation, the model's declared EOS first; the
    /// tokenizer and the runner's `info()` report the same set.
    pub eos_token_ids: Vec<u32>,
}

/// The model's declared EOS ids first, then the tokenizer's (EOT, EOM and
/// end-of-turn tokens such as `<|im_end|>`), without repeats.
pub fn merge_eos(model: &[u32], tokenizer: &[u32]) -> Vec<u32> {
    let mut ids = Vec::with_capacity(model.len() + tokenizer.len());
    for &id in model.iter().chain(tokenizer) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

impl ModelBundle<MlxModelRunner> {
    /// Load a GGUF file or an HF-style folder. On this thread: the runner
    /// holds MLX arrays, which stay on the thread that made them.
    pub fn load(
        path: impl AsRef<Path>,
        options: &LoadOptions,
        config: RunnerConfig,
    ) -> Result<Self, EngineError> {
        let path = path.as_ref();
        // The model first: a bad config is the real problem even when the
        // tokenizer is missing too.
        let (mut loaded, tokenizer, chat_template) = if path.is_dir() {
            let loaded = model::load(path, options)?;
            let (tok, template) = tokenizer::for_model(path)?;
            (loaded, tok, template)
        } else {
            let gguf = GgufFile::load(path)?;
            let loaded = model::load_gguf(&gguf, options)?;
            let (tok, template) = tokenizer::for_gguf(&gguf)?;
            (loaded, tok, template)
        };
        let eos_token_ids = merge_eos(&loaded.model.config.eos_token_ids, tokenizer.eos_ids());
        loaded.model.config.eos_token_ids = eos_token_ids.clone();
        let tokenizer = tokenizer.with_eos_ids(eos_token_ids.clone());
        if config.warmup_kernels {
            // A failing kernel is remembered and falls back; serving goes on.
            if let Err(e) = crate::kernels::warmup_for_model(&loaded.model.kernel_dims()) {
                eprintln!("mlx-backend: kernel warmup: {e}");
            }
        }
        let runner = MlxModelRunner::new(loaded.model, config);
        debug_assert_eq!(runner.info().eos_token_ids, eos_token_ids);
        Ok(ModelBundle {
            runner,
            tokenizer,
            chat_template,
            eos_token_ids,
        })
    }
}

impl<R> ModelBundle<R> {
    /// The same tokenizer, template and EOS set around another runner (e.g.
    /// the runner moved onto a [`RunnerHandle`](crate::runner::RunnerHandle)).
    pub fn with_runner<S>(self, runner: S) -> (ModelBundle<S>, R) {
        (
            ModelBundle {
                runner,
                tokenizer: self.tokenizer,
                chat_template: self.chat_template,
                eos_token_ids: self.eos_token_ids,
            },
            self.runner,
        )
    }
}

impl ModelBundle<crate::runner::RunnerHandle> {
    /// [`load`](ModelBundle::load) with the runner on a thread of its own
    /// (a [`RunnerHandle`](crate::runner::RunnerHandle)); the bundle is `Send`.
    pub fn spawn(
        path: impl AsRef<Path>,
        options: LoadOptions,
        config: RunnerConfig,
    ) -> Result<Self, EngineError> {
        let path = path.as_ref().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = crate::runner::RunnerHandle::spawn(move || {
            match ModelBundle::load(&path, &options, config) {
                Ok(bundle) => {
                    let (parts, runner) = bundle.with_runner(());
                    let _ = tx.send(Ok(parts));
                    Ok(runner)
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    Err(crate::runner::RunnerError::Stopped)
                }
            }
        });
        // The load's own error, when it failed (the handle only says Stopped).
        let parts = match rx.recv() {
            Ok(r) => r?,
            Err(_) => {
                return Err(spawned
                    .err()
                    .unwrap_or(crate::runner::RunnerError::Stopped)
                    .into())
            }
        };
        Ok(parts.with_runner(spawned?).0)
    }
}

/// This process's part of a tensor-parallel bundle (see
/// [`crate::runner::tensor_parallel`]).
pub enum TensorParallelPart {
    /// Rank 0: the bundle to serve, over the group's runner.
    Leader(Box<ModelBundle<TensorParallelRunner>>),
    /// Any other rank: run [`Follower::follow`] until rank 0 shuts down.
    Follower(Box<Follower>),
}

impl ModelBundle<TensorParallelRunner> {
    /// Join the tensor-parallel group of the environment and load this
    /// rank's shard (`config.tensor_parallel` names the group's size); rank
    /// 0 also reads the tokenizer and chat template.
    pub fn load_tensor_parallel(
        path: impl AsRef<Path>,
        options: &LoadOptions,
        config: RunnerConfig,
    ) -> Result<TensorParallelPart, EngineError> {
        let path = path.as_ref();
        let mut runner = match tensor_parallel::start(path, options, config)? {
            Rank::Follower(f) => return Ok(TensorParallelPart::Follower(f)),
            Rank::Leader(r) => *r,
        };
        let (tokenizer, chat_template) = if path.is_dir() {
            tokenizer::for_model(path)?
        } else {
            tokenizer::for_gguf(&GgufFile::load(path)?)?
        };
        let eos_token_ids = merge_eos(&runner.info().eos_token_ids, tokenizer.eos_ids());
        runner.set_eos_token_ids(eos_token_ids.clone());
        let tokenizer = tokenizer.with_eos_ids(eos_token_ids.clone());
        Ok(TensorParallelPart::Leader(Box::new(ModelBundle {
            runner,
            tokenizer,
            chat_template,
            eos_token_ids,
        })))
    }
}
