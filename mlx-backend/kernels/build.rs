//! The one path every op build takes: the fused-or-fallback decision for
//! the current stream's backend, counted in the registry, plus eligibility
//! rules shared by several kernels.

use super::backend::Backend;
use super::registry::{self, FallbackReason, Kernel};
use crate::array::Array;
use crate::error::OpError;

/// Decides fused or fallback on the current stream's backend (the
/// kernel's `eligibility` for that backend, then the registry's table of
/// bodies, switches and failures), builds the op, and counts the decision
/// once the build succeeded (an invalid call counts nothing). The C++ op
/// picks the body by the stream's device, as MLX's `fast.cpp` ops do.
pub(crate) fn build<R>(
    kernel: Kernel,
    eligibility: impl FnOnce(Backend) -> Result<(), FallbackReason>,
    make: impl FnOnce(bool) -> Result<R, OpError>,
) -> Result<R, OpError> {
    let backend = Backend::current();
    let decision = registry::decide(kernel, backend, eligibility(backend));
    let out = make(decision.is_ok())?;
    registry::count(kernel, backend, decision);
    Ok(out)
}

/// The most rows of x the CUDA gate_qmv_silu_mul body takes (decode
/// batches; from 5 rows on, MLX's own quantized matmul is faster than its
/// `common/qmv.cuh` kernels, docs/performance.md). quantized_matmul's CUDA
/// body takes any number of rows: up to this many run the same decode
/// kernels, more its tiled kernels (`common/qmm.cuh`).
pub const CUDA_QMV_MAX_ROWS: usize = 4;

/// The most rows of x the Metal quantized bodies take (quantized_matmul
/// and gate_qmv_silu_mul alike: `common/metal_qmv.h` has only decode
/// kernels; MLX's own Metal quantized matmul serves prefill).
pub const METAL_QMV_MAX_ROWS: usize = 4;

/// The shapes the GPU quantized bodies cover: K a multiple of 32 (whole
/// 16-byte weight reads and 32-value k-steps on CUDA, whole words per
/// group on Metal), groups of 32, 64 or 128; CUDA at any number of rows,
/// Metal at most [`METAL_QMV_MAX_ROWS`]. The CPU: no limit here.
pub(crate) fn quantized_k_eligibility(
    backend: Backend,
    x: &Array,
    group_size: i32,
) -> Result<(), FallbackReason> {
    if backend == Backend::Cpu {
        return Ok(());
    }
    if !matches!(group_size, 32 | 64 | 128) {
        return Err(FallbackReason::UnsupportedQuantization);
    }
    let k = x.shape().last().copied().unwrap_or(0);
    if k <= 0 || k % 32 != 0 {
        return Err(FallbackReason::UnsupportedShape);
    }
    if backend == Backend::Metal && x.size() / k as usize > METAL_QMV_MAX_ROWS {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}

/// [`quantized_k_eligibility`] and, on CUDA, at most [`CUDA_QMV_MAX_ROWS`]
/// rows of x: the decode-only bodies (`common/qmv.cuh`).
pub(crate) fn quantized_shape_eligibility(
    backend: Backend,
    x: &Array,
    group_size: i32,
) -> Result<(), FallbackReason> {
    quantized_k_eligibility(backend, x, group_size)?;
    let k = x.shape().last().copied().unwrap_or(0);
    if backend == Backend::Cuda && x.size() / k as usize > CUDA_QMV_MAX_ROWS {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}
