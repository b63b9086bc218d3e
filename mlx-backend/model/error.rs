//! Errors of model loading and the forward pass.

use crate::error::{EvalError, LoadError, OpError};
use thiserror::Error;

/// Loading a model (config, weights) failed.
#[derive(Debug, Clone, Error)]
pub enum ModelLoadError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: missing required config key '{key}'")]
    MissingConfigKey { path: String, key: String },
    #[error("{path}: config key '{key}': {message}")]
    BadConfigValue {
        path: String,
        key: String,
        message: String,
    },
    #[error(
        "unsupported architecture '{0}' (supported: llama, qwen2, qwen3, qwen2_moe, qwen3_moe)"
    )]
    UnsupportedArchitecture(String),
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}': expected shape {expected:?}, found {found:?}")]
    WrongShape {
        name: String,
        expected: Vec<i32>,
        found: Vec<i32>,
    },
    #[error("tensor '{name}': {message}")]
    BadTensor { name: String, message: String },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Eval(#[from] EvalError),
}

/// A forward pass failed.
#[derive(Debug, Clone, Error)]
pub enum ForwardError {
    #[error("expected {expected} layer caches, got {got}")]
    CacheCount { expected: usize, got: usize },
    #[error("tokens must be a [batch, length] integer array, got shape {0:?}")]
    BadTokens(Vec<i32>),
    #[error(transparent)]
    Op(#[from] OpError),
}
