// gate_qmv_silu_mul's Metal bodies for decode-size batches (the contract is
// in mlx-backend/kernels/gate_qmv_silu_mul/mod.rs; the CUDA twin is
// gate_qmv_silu_mul/cuda.cu): both projections in one pass over x, then
// silu(g)·u with the unfused graph's roundings. The dense form computes
// every row of x per weight column; the expert-indexed form (mlx-lm's
// SwitchGLU) one (row, expert) pair per grid row, reading that expert's
// slice of the stacked weights, as MLX's backend/metal/kernels/quantized.h
// offsets its gather_qmv by the expert index.
#include "common/metal_qmv.h"

using namespace mlx_backend_metal;

template <typename T, typename P, int BITS, int ROWS, int COLS>
[[kernel]] void gate_qmv(
    const device T* x [[buffer(0)]],
    const device uint32_t* gw [[buffer(1)]],
    const device P* gs [[buffer(2)]],
    const device P* gb [[buffer(3)]],
    const device uint32_t* uw [[buffer(4)]],
    const device P* us [[buffer(5)]],
    const device P* ub [[buffer(6)]],
    device T* out [[buffer(7)]],
    constant int& rows [[buffer(8)]],
    constant int& k_len [[buffer(9)]],
    constant int& n_len [[buffer(10)]],
    constant int& group_size [[buffer(11)]],
    uint3 tg [[threadgroup_position_in_grid]],
    uint simd_lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  const int n0 = static_cast<int>(tg.x * kQmvSimdgroups + simd_group) * COLS;
  if (n0 >= n_len) {
    return;
  }
  QuantMatrices<P, 2> mats;
  mats.m[0] = {gw, gs, gb};
  mats.m[1] = {uw, us, ub};
  QmvAcc<2, COLS, ROWS> acc;
  for (int m = 0; m < 2; m++) {
    for (int col = 0; col < COLS; col++) {
      for (int r = 0; r < ROWS; r++) {
        acc.v[m][col][r] = 0.0f;
      }
    }
  }
  qmv_lane<T, P, BITS, 2, COLS, ROWS>(x, mats, n0, n_len, rows, k_len, group_size, simd_lane, acc);
  for (int col = 0; col < COLS; col++) {
    for (int r = 0; r < ROWS; r++) {
      // Every lane takes part in the reductions; lane 0 of a real
      // (row, column) stores.
      const float g = simd_sum(acc.v[0][col][r]);
      const float u = simd_sum(acc.v[1][col][r]);
      if (simd_lane == 0 && r < rows && n0 + col < n_len) {
        out[static_cast<size_t>(r) * n_len + n0 + col] = swiglu<T>(g, u);
      }
    }
  }
}

// Grid row p computes out[p, :] = swiglu of x row p / top_k against expert
// indices[p]; an index past the stack poisons its row with NaN (the CPU
// body's error leaves NaN too).
template <typename T, typename P, int BITS>
[[kernel]] void gather_gate_qmv(
    const device T* x [[buffer(0)]],
    const device uint32_t* indices [[buffer(1)]],
    const device uint32_t* gw [[buffer(2)]],
    const device P* gs [[buffer(3)]],
    const device P* gb [[buffer(4)]],
    const device uint32_t* uw [[buffer(5)]],
    const device P* us [[buffer(6)]],
    const device P* ub [[buffer(7)]],
    device T* out [[buffer(8)]],
    constant int& top_k [[buffer(9)]],
    constant int& experts [[buffer(10)]],
    constant int& k_len [[buffer(11)]],
    constant int& n_len [[buffer(12)]],
    constant int& group_size [[buffer(13)]],
    uint3 tg [[threadgroup_position_in_grid]],
    uint simd_lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  const int n = static_cast<int>(tg.x * kQmvSimdgroups + simd_group);
  const uint pair = tg.y;
  if (n >= n_len) {
    return;
  }
  device T* o = out + static_cast<size_t>(pair) * n_len + n;
  const uint32_t e = indices[pair];
  if (e >= static_cast<uint32_t>(experts)) {
    if (simd_lane == 0) {
      *o = from_f32<T>(NAN);
    }
    return;
  }
  const size_t words = static_cast<size_t>(n_len) * (k_len * BITS / 32) * e;
  const size_t groups = static_cast<size_t>(n_len) * (k_len / group_size) * e;
  QuantMatrices<P, 2> mats;
  mats.m[0] = {gw + words, gs + groups, gb + groups};
  mats.m[1] = {uw + words, us + groups, ub + groups};
  QmvAcc<2, 1, 1> acc;
  acc.v[0][0][0] = 0.0f;
  acc.v[1][0][0] = 0.0f;
  const device T* xr = x + static_cast<size_t>(pair / top_k) * k_len;
  qmv_lane<T, P, BITS, 2, 1, 1>(xr, mats, n, n_len, 1, k_len, group_size, simd_lane, acc);
  const float g = simd_sum(acc.v[0][0][0]);
  const float u = simd_sum(acc.v[1][0][0]);
  if (simd_lane == 0) {
    *o = swiglu<T>(g, u);
  }
}

#define GATE_KERNEL(XS, T, PS, P, BITS, ROWS, COLS) \
  MLX_BACKEND_INSTANTIATE(                          \
      "mlx_backend_gate_qmv_" #XS "_" #PS "_b" #BITS "_r" #ROWS, gate_qmv, T, P, BITS, ROWS, COLS)

#define GATHER_GATE_KERNEL(XS, T, PS, P, BITS) \
  MLX_BACKEND_INSTANTIATE(                     \
      "mlx_backend_gather_gate_qmv_" #XS "_" #PS "_b" #BITS, gather_gate_qmv, T, P, BITS)

// Columns per simdgroup by rows as common/qmv.cuh picks them for the
// gate/up pair (twice the accumulators of a plain projection).
#define GATE_KERNELS_BITS(XS, T, PS, P, BITS) \
  GATE_KERNEL(XS, T, PS, P, BITS, 1, 1)       \
  GATE_KERNEL(XS, T, PS, P, BITS, 2, 2)       \
  GATE_KERNEL(XS, T, PS, P, BITS, 4, 2)       \
  GATHER_GATE_KERNEL(XS, T, PS, P, BITS)

#define GATE_KERNELS(XS, T, PS, P)   \
  GATE_KERNELS_BITS(XS, T, PS, P, 4) \
  GATE_KERNELS_BITS(XS, T, PS, P, 8)

GATE_KERNELS(f32, float, f32, float)
GATE_KERNELS(f16, half, f16, half)
GATE_KERNELS(bf16, bfloat16_t, bf16, bfloat16_t)
GATE_KERNELS(f32, float, f16, half)
GATE_KERNELS(f32, float, bf16, bfloat16_t)
