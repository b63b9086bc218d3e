//! Runner errors. A rejected batch changes nothing: every other request's
//! state is as it was, and the runner keeps serving.

use super::batch::{ForwardMode, RequestId};
use crate::model::{ForwardError, ModelLoadError};
use crate::{EvalError, OpError};
use thiserror::Error;

/// Why the runner rejected a batch or a call.
#[derive(Debug, Clone, Error)]
pub enum RunnerError {
    /// A request the runner holds no state for.
    #[error("request {0} is not known to the runner (never extended, or released)")]
    UnknownRequest(RequestId),
    /// A request id that appears more than once in one batch.
    #[error("request {0} appears twice in the batch")]
    DuplicateRequest(RequestId),
    /// A token id outside the model's vocabulary.
    #[error("request {id}: token id {token} is outside the vocabulary of {vocab}")]
    InvalidToken {
        /// The request.
        id: RequestId,
        /// The offending token id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The batch's `cached_tokens` differs from what the runner holds.
    #[error("request {id}: the batch says {claimed} tokens are cached, the runner holds {actual}")]
    CachedMismatch {
        /// The request.
        id: RequestId,
        /// Cached tokens according to the batch.
        claimed: usize,
        /// Cached tokens the runner holds.
        actual: usize,
    },
    /// The request would grow past the maximum context.
    #[error("request {id}: {length} tokens exceed the maximum context of {max}")]
    ContextTooLong {
        /// The request.
        id: RequestId,
        /// Its length after this batch.
        length: usize,
        /// The runner's maximum context.
        max: usize,
    },
    /// A prompt chunk without tokens.
    #[error("request {0}: an Extend chunk needs at least one token")]
    EmptyTokens(RequestId),
    /// A decode entry without exactly one token.
    #[error("request {id}: a decode step takes exactly one token, got {got}")]
    BadDecode {
        /// The request.
        id: RequestId,
        /// Tokens it carried.
        got: usize,
    },
    /// A request entry the batch's mode cannot carry.
    #[error("request {id}: {mode:?} batches cannot carry this request ({reason})")]
    BadMode {
        /// The request.
        id: RequestId,
        /// The batch's mode.
        mode: ForwardMode,
        /// What does not fit.
        reason: &'static str,
    },
    /// A sampling parameter out of its range.
    #[error("request {id}: sampling parameter {name} = {value} is invalid")]
    BadSampling {
        /// The request.
        id: RequestId,
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: f32,
    },
    /// The batch needs more KV cache than the budget has free.
    #[error("KV budget exceeded: the batch needs {needed} tokens of cache, {available} of {budget} are free")]
    KvBudgetExceeded {
        /// Tokens of cache the batch needs.
        needed: usize,
        /// Tokens of cache free now.
        available: usize,
        /// The whole budget in tokens.
        budget: usize,
    },
    /// The model's forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(#[from] ForwardError),
    /// Building an op failed.
    #[error(transparent)]
    Op(#[from] OpError),
    /// Evaluating the batch failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// Loading the model failed.
    #[error(transparent)]
    Load(#[from] ModelLoadError),
    /// A tensor-parallel group failed: a peer was lost, timed out or the
    /// group could not be formed.
    #[error(transparent)]
    Distributed(#[from] crate::distributed::DistributedError),
    /// This runner does not implement the named call.
    #[error("this runner does not support {0}")]
    Unsupported(&'static str),
    /// The runner thread panicked (this call's batch is lost).
    #[error("the runner thread panicked: {0}")]
    Panicked(String),
    /// The runner thread is gone; the handle serves no more calls.
    #[error("the runner thread has stopped")]
    Stopped,
}
