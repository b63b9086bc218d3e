//! Typed errors, one enum per kind of operation (as llama-cpp-2 does), each
//! carrying MLX's own message where MLX raised it. Nothing here aborts: a
//! failed call leaves every array and the process usable.

use crate::dtype::Dtype;
use thiserror::Error;

/// Building an op failed (invalid shapes, axes or dtypes). MLX checks these
/// eagerly, so the graph is never extended with a bad node.
#[derive(Debug, Clone, Error)]
#[error("{op}: {message}")]
pub struct OpError {
    /// The op that was being built, e.g. `"matmul"`.
    pub op: &'static str,
    /// MLX's (or our contract check's) explanation.
    pub message: String,
}

impl OpError {
    pub(crate) fn new(op: &'static str, message: impl Into<String>) -> Self {
        OpError {
            op,
            message: message.into(),
        }
    }

    pub(crate) fn from_cxx(op: &'static str) -> impl FnOnce(cxx::Exception) -> OpError {
        move |e| OpError::new(op, e.what())
    }
}

/// Evaluating a graph failed: an error raised while a kernel ran.
#[derive(Debug, Clone, Error)]
#[error("evaluation failed: {message}")]
pub struct EvalError {
    pub message: String,
}

impl From<cxx::Exception> for EvalError {
    fn from(e: cxx::Exception) -> Self {
        EvalError {
            message: e.what().to_string(),
        }
    }
}

/// Moving data between Rust memory and an array failed.
#[derive(Debug, Clone, Error)]
pub enum HostDataError {
    #[error("array has dtype {actual}, but {requested} was requested")]
    DtypeMismatch { actual: Dtype, requested: Dtype },
    #[error("host data has {len} elements but shape {shape:?} needs {expected}")]
    LengthMismatch {
        len: usize,
        shape: Vec<i32>,
        expected: usize,
    },
    #[error("item() needs a single-element array, this one has shape {shape:?}")]
    NotScalar { shape: Vec<i32> },
    #[error("dtype code {0} is not one this crate knows")]
    UnknownDtype(i32),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("{0}")]
    Mlx(String),
}

/// Choosing a device or stream failed.
#[derive(Debug, Clone, Error)]
pub enum DeviceError {
    #[error("device {0} is not available in this MLX build")]
    Unavailable(String),
    #[error("{0}")]
    Mlx(String),
}

/// Loading a tensor file (safetensors or GGUF) failed.
#[derive(Debug, Clone, Error)]
pub enum LoadError {
    #[error("{path}: file not found")]
    NotFound { path: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: no tensor named '{name}'")]
    MissingTensor { path: String, name: String },
    #[error("{path}: no metadata key '{key}'")]
    MissingMetadata { path: String, key: String },
    #[error("{path}: metadata key '{key}' is {found}, expected {expected}")]
    MetadataType {
        path: String,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{path}: metadata key '{key}' could not be read")]
    MetadataRead {
        path: String,
        key: String,
        #[source]
        source: HostDataError,
    },
}

/// Saving a tensor file failed.
#[derive(Debug, Clone, Error)]
#[error("saving {path}: {message}")]
pub struct SaveError {
    pub path: String,
    pub message: String,
}

/// Any error of this crate's array layer, for callers that do not need to
/// tell them apart (`?` converts every specific error into it).
#[derive(Debug, Clone, Error)]
pub enum Error {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error(transparent)]
    HostData(#[from] HostDataError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Save(#[from] SaveError),
}
