#pragma once

// The launch shape of the decode-size quantized projections, shared by the
// CUDA (common/qmv.cuh) and Metal (common/metal_qmv.h) bodies, whose
// kernels are instantiated for the same rows buckets and column counts.

namespace mlx_backend {

// The kernel shape for `rows` rows of x: its rows bucket (the `_r` suffix
// of the kernel's name) and output columns per warp or simdgroup.
struct QmvShape {
  int rows;
  int cols;
};

// `pair`: the gate form, whose two matrices halve the columns a warp takes
// at 4 rows.
inline QmvShape qmv_shape(int rows, bool pair) {
  if (rows <= 1) {
    return {1, 1};
  }
  if (rows <= 2) {
    return {2, 2};
  }
  return {4, pair ? 2 : 4};
}

// Which projection a qmv body launches.
enum class QmvForm {
  Plain, // out = x·wᵀ
  Gate, // out = silu(x·gateᵀ)·(x·upᵀ)
  GatherGate, // Gate with each (row, k) pair's expert from indices
};

} // namespace mlx_backend
