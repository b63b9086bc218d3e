//! Engine errors. A request that is rejected at submission or fails while
//! running is reported to its own caller; the other requests go on.

use crate::model::ModelLoadError;
use crate::runner::RunnerError;
use crate::tokenizer::{TemplateError, TokenizerError};
use crate::LoadError;
use thiserror::Error;

/// Why the engine rejected or failed a request.
#[derive(Debug, Clone, Error)]
pub enum EngineError {
    /// A request parameter is out of range (the name is the API's).
    #[error("invalid value for {name}: {message}")]
    InvalidParameter {
        /// The parameter, as the API spells it.
        name: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A prompt token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    InvalidToken {
        /// The offending token id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The prompt plus the tokens to generate can never fit one context.
    #[error("{prompt_tokens} prompt tokens plus {max_tokens} tokens to generate exceed the maximum context of {max_context} tokens")]
    ContextTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// The runner's maximum context.
        max_context: usize,
    },
    /// The request alone needs more KV cache than the runner has.
    #[error("the request needs {needed} tokens of KV cache, the runner has {capacity}")]
    ExceedsKvCapacity {
        /// Tokens of cache the request needs.
        needed: usize,
        /// The runner's KV capacity in tokens.
        capacity: usize,
    },
    /// The waiting queue is at its bound; try again later.
    #[error("the queue is full ({waiting} requests waiting)")]
    QueueFull {
        /// Requests waiting now.
        waiting: usize,
    },
    /// A chat request for a model without a chat template.
    #[error("the model has no chat template")]
    NoChatTemplate,
    /// Rendering the chat template failed.
    #[error("rendering the chat template failed")]
    Template(#[from] TemplateError),
    /// Tokenizing the prompt or detokenizing the output failed.
    #[error("tokenizing or detokenizing failed")]
    Tokenizer(#[from] TokenizerError),
    /// The runner failed the request's batch.
    #[error("the runner failed")]
    Runner(#[from] RunnerError),
    /// Loading the model failed.
    #[error("loading the model failed")]
    Model(#[from] ModelLoadError),
    /// Reading the model file failed.
    #[error("reading the model file failed")]
    Load(#[from] LoadError),
    /// The engine is shutting down or gone.
    #[error("the engine has shut down")]
    ShutDown,
    /// An internal invariant failed (a bug); the message says which.
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
