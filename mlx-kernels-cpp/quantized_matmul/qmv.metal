// quantized_matmul's Metal body for decode-size batches (the contract is in
// mlx-backend/kernels/quantized_matmul/mod.rs; the CUDA twin is the
// `mlx_backend_qmv_*` half of quantized_matmul/cuda.cu): out[r, n] =
// Σ_k x[r, k]·w[n, k], f32 accumulation, one rounding to the output dtype.
// Modelled on MLX's backend/metal/kernels/quantized.h (qmv_fast: a
// simdgroup per block of output columns, simd_sum of the lanes' partials).
#include "common/metal_qmv.h"

using namespace mlx_backend_metal;

template <typename T, typename P, int BITS, int ROWS, int COLS>
[[kernel]] void qmv(
    const device T* x [[buffer(0)]],
    const device uint32_t* w [[buffer(1)]],
    const device P* scales [[buffer(2)]],
    const device P* biases [[buffer(3)]],
    device T* out [[buffer(4)]],
    constant int& rows [[buffer(5)]],
    constant int& k_len [[buffer(6)]],
    constant int& n_len [[buffer(7)]],
    constant int& group_size [[buffer(8)]],
    uint3 tg [[threadgroup_position_in_grid]],
    uint simd_lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  const int n0 = static_cast<int>(tg.x * kQmvSimdgroups + simd_group) * COLS;
  if (n0 >= n_len) {
    return;
  }
  QuantMatrices<P, 1> mats;
  mats.m[0] = {w, scales, biases};
  QmvAcc<1, COLS, ROWS> acc;
  for (int col = 0; col < COLS; col++) {
    for (int r = 0; r < ROWS; r++) {
      acc.v[0][col][r] = 0.0f;
    }
  }
  qmv_lane<T, P, BITS, 1, COLS, ROWS>(x, mats, n0, n_len, rows, k_len, group_size, simd_lane, acc);
  for (int col = 0; col < COLS; col++) {
    for (int r = 0; r < ROWS; r++) {
      const float v = simd_sum(acc.v[0][col][r]);
      if (simd_lane == 0 && r < rows && n0 + col < n_len) {
        out[static_cast<size_t>(r) * n_len + n0 + col] = from_f32<T>(v);
      }
    }
  }
}

#define QMV_KERNEL(XS, T, PS, P, BITS, ROWS, COLS) \
  MLX_BACKEND_INSTANTIATE(                         \
      "mlx_backend_qmv_" #XS "_" #PS "_b" #BITS "_r" #ROWS, qmv, T, P, BITS, ROWS, COLS)

// Columns per simdgroup by rows, as common/qmv.cuh picks them: one row
// spreads the matrix over the most simdgroups; more rows reuse each
// dequantized weight for more columns.
#define QMV_KERNELS_BITS(XS, T, PS, P, BITS) \
  QMV_KERNEL(XS, T, PS, P, BITS, 1, 1)       \
  QMV_KERNEL(XS, T, PS, P, BITS, 2, 2)       \
  QMV_KERNEL(XS, T, PS, P, BITS, 4, 4)

#define QMV_KERNELS(XS, T, PS, P)   \
  QMV_KERNELS_BITS(XS, T, PS, P, 4) \
  QMV_KERNELS_BITS(XS, T, PS, P, 8)

QMV_KERNELS(f32, float, f32, float)
QMV_KERNELS(f16, half, f16, half)
QMV_KERNELS(bf16, bfloat16_t, bf16, bfloat16_t)
QMV_KERNELS(f32, float, f16, half)
QMV_KERNELS(f32, float, bf16, bfloat16_t)
