// Shared by the Metal bodies' shaders (`<op>/*.metal`): MLX's bfloat16_t
// (backend/metal/kernels/bf16.h), f32 conversions, roundings, and a
// threadgroup sum built from simdgroup reductions as MLX's
// backend/metal/kernels/rms_norm.metal reduces.
#pragma once

#include <metal_stdlib>

#include "mlx/backend/metal/kernels/bf16.h"

using namespace metal;

namespace mlx_backend_metal {

// Threads per simdgroup on every Apple GPU MLX runs on.
constant constexpr int kSimd = 32;

template <typename T>
inline float to_f32(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T from_f32(float v) {
  return static_cast<T>(v);
}

// f rounded to T and back: where the unfused graph materializes a T.
template <typename T>
inline float round_to(float f) {
  return static_cast<float>(static_cast<T>(f));
}

// The sum of `v` over the threadgroup, returned to every thread. `scratch`
// holds one float per simdgroup (32 at most: 1024 threads).
inline float group_sum(
    float v,
    threadgroup float* scratch,
    uint simd_lane,
    uint simd_group,
    uint simd_groups) {
  v = simd_sum(v);
  if (simd_lane == 0) {
    scratch[simd_group] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = simd_lane < simd_groups ? scratch[simd_lane] : 0.0f;
  total = simd_sum(total);
  // The scratch is free again only once every simdgroup has read it.
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

} // namespace mlx_backend_metal

// Instantiates `kernel<...>` under the host name `name` (MLX's
// `instantiate_kernel` in backend/metal/kernels/utils.h).
#define MLX_BACKEND_INSTANTIATE(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
