//! Engine errors. A request that is rejected at submission or fails while
//! running is reported to its own caller; the other requests go on.

use crate::model::ModelLoadError;
use crate::runner::RunnerError;
use crate::tokenizer::{TemplateError, TokenizerError};
use crate::LoadError;
use thiserror::Error;

#[derive(Debug, Clone, Error)]
pub enum EngineError {
    /// A request parameter is out of range (the name is the API's).
    #[error("invalid value for {name}: {message}")]
    InvalidParameter { name: &'static str, message: String },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    InvalidToken { token: u32, vocab: usize },
    /// The prompt plus the tokens to generate can never fit one context.
    #[error("{prompt_tokens} prompt tokens plus {max_tokens} tokens to generate exceed the maximum context of {max_context} tokens")]
    ContextTooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        max_context: usize,
    },
    /// The request alone needs more KV cache than the runner has.
    #[error("the request needs {needed} tokens of KV cache, the runner has {capacity}")]
    ExceedsKvCapacity { needed: usize, capacity: usize },
    #[error("the queue is full ({waiting} requests waiting)")]
    QueueFull { waiting: usize },
    #[error("the model has no chat template")]
    NoChatTemplate,
    #[error("rendering the chat template failed")]
    Template(#[from] TemplateError),
    #[error("tokenizing or detokenizing failed")]
    Tokenizer(#[from] TokenizerError),
    #[error("the runner failed")]
    Runner(#[from] RunnerError),
    #[error("loading the model failed")]
    Model(#[from] ModelLoadError),
    #[error("reading the model file failed")]
    Load(#[from] LoadError),
    #[error("the engine has shut down")]
    ShutDown,
    #[error("engine failure: {0}")]
    Internal(String),
}

impl EngineError {
    /// Whether the request itself is at fault (an HTTP 4xx), as opposed to
    /// the engine's state (queue full, shut down) or a failure inside it.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidParameter { .. }
                | EngineError::EmptyPrompt
                | EngineError::InvalidToken { .. }
                | EngineError::ContextTooLong { .. }
                | EngineError::ExceedsKvCapacity { .. }
                | EngineError::NoChatTemplate
                | EngineError::Template(_)
        )
    }
}
