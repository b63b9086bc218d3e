//! Runner errors. A rejected batch changes nothing: every other request's
//! state is as it was, and the runner keeps serving.

use super::batch::{ForwardMode, RequestId};
use crate::model::{ForwardError, ModelLoadError};
use crate::{EvalError, OpError};
use thiserror::Error;

#[derive(Debug, Clone, Error)]
pub enum RunnerError {
    #[error("request {0} is not known to the runner (never extended, or released)")]
    UnknownRequest(RequestId),
    #[error("request {0} appears twice in the batch")]
    DuplicateRequest(RequestId),
    #[error("request {id}: token id {token} is outside the vocabulary of {vocab}")]
    InvalidToken {
        id: RequestId,
        token: u32,
        vocab: usize,
    },
    #[error("request {id}: the batch says {claimed} tokens are cached, the runner holds {actual}")]
    CachedMismatch {
        id: RequestId,
        claimed: usize,
        actual: usize,
    },
    #[error("request {id}: {length} tokens exceed the maximum context of {max}")]
    ContextTooLong {
        id: RequestId,
        length: usize,
        max: usize,
    },
    #[error("request {0}: an Extend chunk needs at least one token")]
    EmptyTokens(RequestId),
    #[error("request {id}: a decode step takes exactly one token, got {got}")]
    BadDecode { id: RequestId, got: usize },
    #[error("request {id}: {mode:?} batches cannot carry this request ({reason})")]
    BadMode {
        id: RequestId,
        mode: ForwardMode,
        reason: &'static str,
    },
    #[error("request {id}: sampling parameter {name} = {value} is invalid")]
    BadSampling {
        id: RequestId,
        name: &'static str,
        value: f32,
    },
    #[error("KV budget exceeded: the batch needs {needed} tokens of cache, {available} of {budget} are free")]
    KvBudgetExceeded {
        needed: usize,
        available: usize,
        budget: usize,
    },
    #[error("forward pass failed: {0}")]
    Forward(#[from] ForwardError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error(transparent)]
    Load(#[from] ModelLoadError),
    #[error("this runner does not support {0}")]
    Unsupported(&'static str),
    #[error("the runner thread panicked: {0}")]
    Panicked(String),
    #[error("the runner thread has stopped")]
    Stopped,
}
