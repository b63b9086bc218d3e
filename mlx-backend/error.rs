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
    /// MLX's explanation (or the failed kernel's).
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
    /// The Rust element type does not match the array's dtype.
    #[error("array has dtype {actual}, but {requested} was requested")]
    DtypeMismatch {
        /// The array's dtype.
        actual: Dtype,
        /// The dtype of the Rust element type asked for.
        requested: Dtype,
    },
    /// The host slice's length does not fit the shape.
    #[error("host data has {len} elements but shape {shape:?} needs {expected}")]
    LengthMismatch {
        /// Elements given.
        len: usize,
        /// The shape asked for.
        shape: Vec<i32>,
        /// Elements the shape holds.
        expected: usize,
    },
    /// A single value was read from an array of more than one element.
    #[error("item() needs a single-element array, this one has shape {shape:?}")]
    NotScalar {
        /// The array's shape.
        shape: Vec<i32>,
    },
    /// MLX reported a dtype this crate has no [`Dtype`] for.
    #[error("dtype code {0} is not one this crate knows")]
    UnknownDtype(i32),
    /// Evaluating the array before reading it failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// MLX raised an error while copying.
    #[error("{0}")]
    Mlx(String),
}

/// Choosing a device or stream failed.
#[derive(Debug, Clone, Error)]
pub enum DeviceError {
    /// This MLX build cannot run on the device (e.g. a GPU on a CPU-only build).
    #[error("device {0} is not available in this MLX build")]
    Unavailable(String),
    /// MLX raised an error.
    #[error("{0}")]
    Mlx(String),
}

/// Loading a tensor file (safetensors or GGUF) failed.
#[derive(Debug, Clone, Error)]
pub enum LoadError {
    /// The file does not exist.
    #[error("{path}: file not found")]
    NotFound {
        /// The file.
        path: String,
    },
    /// The file is not a valid file of its format.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The file has no tensor of that name.
    #[error("{path}: no tensor named '{name}'")]
    MissingTensor {
        /// The file.
        path: String,
        /// The tensor asked for.
        name: String,
    },
    /// The file has no metadata entry of that key.
    #[error("{path}: no metadata key '{key}'")]
    MissingMetadata {
        /// The file.
        path: String,
        /// The key asked for.
        key: String,
    },
    /// A metadata entry has another type than the one asked for.
    #[error("{path}: metadata key '{key}' is {found}, expected {expected}")]
    MetadataType {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The entry's type.
        found: String,
    },
    /// A metadata entry could not be copied out.
    #[error("{path}: metadata key '{key}' could not be read")]
    MetadataRead {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// Why reading failed.
        #[source]
        source: HostDataError,
    },
}

/// Saving a tensor file failed.
#[derive(Debug, Clone, Error)]
#[error("saving {path}: {message}")]
pub struct SaveError {
    /// The file being written.
    pub path: String,
    /// MLX's (or the file system's) explanation.
    pub message: String,
}

/// Any error of this crate's array layer, for callers that do not need to
/// tell them apart (`?` converts every specific error into it).
#[derive(Debug, Clone, Error)]
pub enum Error {
    /// An op could not be built.
    #[error(transparent)]
    Op(#[from] OpError),
    /// An evaluation failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// Copying between host memory and an array failed.
    #[error(transparent)]
    HostData(#[from] HostDataError),
    /// Choosing a device or stream failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Loading a tensor file failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Saving a tensor file failed.
    #[error(transparent)]
    Save(#[from] SaveError),
}
