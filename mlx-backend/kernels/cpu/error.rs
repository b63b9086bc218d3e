//! Argument errors of the CPU kernel bodies; kernels never panic on bad input.

use thiserror::Error;

/// Why a CPU kernel refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum KernelError {
    /// A slice length does not match the shape it is supposed to have.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A dtype or quantisation parameter the kernel does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An index array (expert id, row id) points outside its table.
    #[error("index out of range: {0}")]
    IndexOutOfRange(String),
}

/// Fails unless `slice_len == expected`; `expected` is `None` when the shape overflowed.
pub(crate) fn check_len(
    name: &str,
    slice_len: usize,
    expected: Option<usize>,
) -> Result<(), KernelError> {
    match expected {
        Some(e) if e == slice_len => Ok(()),
        Some(e) => Err(KernelError::Shape(format!(
            "{name} has {slice_len} elements, expected {e}"
        ))),
        None => Err(KernelError::Shape(format!("{name}: shape overflows usize"))),
    }
}
