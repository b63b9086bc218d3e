//! Errors of model loading and the forward pass.

use crate::error::{EvalError, LoadError, OpError};
use thiserror::Error;

/// Loading a model (config, weights) failed.
#[derive(Debug, Clone, Error)]
pub enum ModelLoadError {
    /// Reading a model file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's explanation.
        message: String,
    },
    /// `config.json` (or the GGUF metadata) lacks a required key.
    #[error("{path}: missing required config key '{key}'")]
    MissingConfigKey {
        /// The config file.
        path: String,
        /// The missing key.
        key: String,
    },
    /// A config value is malformed or out of range.
    #[error("{path}: config key '{key}': {message}")]
    BadConfigValue {
        /// The config file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong with its value.
        message: String,
    },
    /// A model family this crate does not implement.
    #[error(
        "unsupported architecture '{0}' (supported: llama, qwen2, qwen3, qwen2_moe, qwen3_moe)"
    )]
    UnsupportedArchitecture(String),
    /// The checkpoint lacks a tensor the architecture needs.
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    /// A tensor's shape does not match the config.
    #[error("tensor '{name}': expected shape {expected:?}, found {found:?}")]
    WrongShape {
        /// The tensor.
        name: String,
        /// The shape the config implies.
        expected: Vec<i32>,
        /// The checkpoint's shape.
        found: Vec<i32>,
    },
    /// A tensor is unusable for another reason (dtype, quantization layout).
    #[error("tensor '{name}': {message}")]
    BadTensor {
        /// The tensor.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// Tensor parallelism cannot split the model over the group: `size`
    /// (heads, a width, experts) does not divide into `ranks` parts (or
    /// not at quantization-group boundaries). Raised before loading.
    #[error("{what} = {size} cannot be split over {ranks} tensor-parallel ranks")]
    NotShardable {
        /// What does not divide.
        what: String,
        /// Its size.
        size: usize,
        /// The group's size.
        ranks: usize,
    },
    /// Reading a tensor file failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Building an op while preparing the weights failed.
    #[error(transparent)]
    Op(#[from] OpError),
    /// Evaluating the prepared weights failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
}

/// A forward pass failed.
#[derive(Debug, Clone, Error)]
pub enum ForwardError {
    /// The number of KV caches differs from the number of layers.
    #[error("expected {expected} layer caches, got {got}")]
    CacheCount {
        /// The model's layer count.
        expected: usize,
        /// Caches passed.
        got: usize,
    },
    /// The token array is not a 2-D integer array.
    #[error("tokens must be a [batch, length] integer array, got shape {0:?}")]
    BadTokens(Vec<i32>),
    /// Building the graph failed.
    #[error(transparent)]
    Op(#[from] OpError),
}
