//! Typed errors of the tokenizer and chat-template layer. Each names the file
//! (or GGUF file) and, where one is missing or malformed, the key.

use crate::error::LoadError;
use thiserror::Error;

/// Building or running a [`Tokenizer`](super::Tokenizer) failed.
#[derive(Debug, Clone, Error)]
pub enum TokenizerError {
    #[error("{path}: file not found")]
    NotFound { path: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: missing metadata key '{key}'")]
    MissingKey { path: String, key: String },
    #[error("{path}: metadata key '{key}': {message}")]
    InvalidKey {
        path: String,
        key: String,
        message: String,
    },
    #[error("{path}: tokenizer model '{model}' (key 'tokenizer.ggml.model') is not supported; only 'gpt2' byte-level BPE is")]
    UnsupportedModel { path: String, model: String },
    #[error("{path}: pre-tokenizer '{pre}' (key 'tokenizer.ggml.pre') is not supported")]
    UnsupportedPreTokenizer { path: String, pre: String },
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
    /// Reading the model file the tokenizer comes from failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The model's chat template is present but unusable.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// Loading or rendering a [`ChatTemplate`](super::ChatTemplate) failed.
#[derive(Debug, Clone, Error)]
pub enum TemplateError {
    #[error("{path}: file not found")]
    NotFound { path: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: no chat template (missing key '{key}')")]
    MissingKey { path: String, key: String },
    #[error("{path}: no chat template named '{name}' (available: {available:?})")]
    MissingNamed {
        path: String,
        name: String,
        available: Vec<String>,
    },
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("rendering the chat template failed: {0}")]
    Render(String),
    /// Reading the GGUF file the template comes from failed.
    #[error(transparent)]
    Load(#[from] LoadError),
}
