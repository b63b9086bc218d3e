// RMSNorm's Metal body (the contract is in mlx-backend/kernels/rms_norm/mod.rs;
// the CUDA twin is rms_norm/cuda.cu): one threadgroup per row, f32
// accumulation, a simdgroup then threadgroup sum of x², then a second pass
// that scales and writes. Modelled on MLX's
// backend/metal/kernels/rms_norm.metal (rms_looped: threads stride the row,
// simd_sum, one partial per simdgroup in threadgroup memory).
#include "common/metal_common.h"

using namespace mlx_backend_metal;

template <typename T>
[[kernel]] void rms_norm(
    const device T* x [[buffer(0)]],
    const device T* w [[buffer(1)]],
    device T* out [[buffer(2)]],
    constant float& eps [[buffer(3)]],
    constant int& hidden [[buffer(4)]],
    uint row [[threadgroup_position_in_grid]],
    uint tid [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]],
    uint simd_lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]],
    uint simd_groups [[simdgroups_per_threadgroup]]) {
  threadgroup float scratch[32];
  const size_t base = static_cast<size_t>(row) * hidden;
  float ss = 0.0f;
  for (int i = tid; i < hidden; i += threads) {
    const float v = to_f32(x[base + i]);
    ss += v * v;
  }
  ss = group_sum(ss, scratch, simd_lane, simd_group, simd_groups);
  const float scale = metal::precise::rsqrt(ss / static_cast<float>(hidden) + eps);
  for (int i = tid; i < hidden; i += threads) {
    out[base + i] = from_f32<T>(to_f32(x[base + i]) * scale * to_f32(w[i]));
  }
}

// sum = x + residual (rounded to T, as the unfused add), then its norm.
template <typename T>
[[kernel]] void rms_norm_residual(
    const device T* x [[buffer(0)]],
    const device T* r [[buffer(1)]],
    const device T* w [[buffer(2)]],
    device T* normed [[buffer(3)]],
    device T* sum [[buffer(4)]],
    constant float& eps [[buffer(5)]],
    constant int& hidden [[buffer(6)]],
    uint row [[threadgroup_position_in_grid]],
    uint tid [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]],
    uint simd_lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]],
    uint simd_groups [[simdgroups_per_threadgroup]]) {
  threadgroup float scratch[32];
  const size_t base = static_cast<size_t>(row) * hidden;
  float ss = 0.0f;
  for (int i = tid; i < hidden; i += threads) {
    const T s = from_f32<T>(to_f32(x[base + i]) + to_f32(r[base + i]));
    sum[base + i] = s;
    const float v = to_f32(s);
    ss += v * v;
  }
  ss = group_sum(ss, scratch, simd_lane, simd_group, simd_groups);
  const float scale = metal::precise::rsqrt(ss / static_cast<float>(hidden) + eps);
  // Each thread re-reads only the sums it wrote itself: no barrier needed.
  for (int i = tid; i < hidden; i += threads) {
    normed[base + i] = from_f32<T>(to_f32(sum[base + i]) * scale * to_f32(w[i]));
  }
}

#define RMS_NORM_KERNELS(SUFFIX, T)                                      \
  MLX_BACKEND_INSTANTIATE("mlx_backend_rms_norm_" #SUFFIX, rms_norm, T) \
  MLX_BACKEND_INSTANTIATE("mlx_backend_rms_norm_residual_" #SUFFIX, rms_norm_residual, T)

RMS_NORM_KERNELS(f32, float)
RMS_NORM_KERNELS(f16, half)
RMS_NORM_KERNELS(bf16, bfloat16_t)
