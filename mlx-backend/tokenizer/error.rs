//! Typed errors of the tokenizer and chat-template layer. Each names the file
//! (or GGUF file) and, where one is missing or malformed, the key.

use crate::error::LoadError;
use thiserror::Error;

/// Building or running a [`Tokenizer`](super::Tokenizer) failed.
#[derive(Debug, Clone, Error)]
pub enum TokenizerError {
    /// The tokenizer file does not exist.
    #[error("{path}: file not found")]
    NotFound {
        /// The file.
        path: String,
    },
    /// The tokenizer file is malformed.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A GGUF file lacks a tokenizer metadata key.
    #[error("{path}: missing metadata key '{key}'")]
    MissingKey {
        /// The file.
        path: String,
        /// The missing key.
        key: String,
    },
    /// A GGUF tokenizer metadata entry is malformed.
    #[error("{path}: metadata key '{key}': {message}")]
    InvalidKey {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A GGUF tokenizer of a kind other than byte-level BPE.
    #[error("{path}: tokenizer model '{model}' (key 'tokenizer.ggml.model') is not supported; only 'gpt2' byte-level BPE is")]
    UnsupportedModel {
        /// The file.
        path: String,
        /// The tokenizer model named in the file.
        model: String,
    },
    /// A GGUF pre-tokenizer this crate has no split pattern for.
    #[error("{path}: pre-tokenizer '{pre}' (key 'tokenizer.ggml.pre') is not supported")]
    UnsupportedPreTokenizer {
        /// The file.
        path: String,
        /// The pre-tokenizer named in the file.
        pre: String,
    },
    /// Encoding text failed.
    #[error("encoding failed: {0}")]
    Encode(String),
    /// Decoding token ids failed.
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
    /// The template's file does not exist.
    #[error("{path}: file not found")]
    NotFound {
        /// The file.
        path: String,
    },
    /// The template's file is malformed.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The file has no chat template.
    #[error("{path}: no chat template (missing key '{key}')")]
    MissingKey {
        /// The file.
        path: String,
        /// The key it was looked up under.
        key: String,
    },
    /// The file has named templates, but not the one asked for.
    #[error("{path}: no chat template named '{name}' (available: {available:?})")]
    MissingNamed {
        /// The file.
        path: String,
        /// The name asked for.
        name: String,
        /// The names the file has.
        available: Vec<String>,
    },
    /// The template is not valid Jinja.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// Rendering failed (an undefined value, a type error, ...).
    #[error("rendering the chat template failed: {0}")]
    Render(String),
    /// Reading the GGUF file the template comes from failed.
    #[error(transparent)]
    Load(#[from] LoadError),
}
