// Device helpers shared by the CUDA bodies (compiled by nvcc in build.rs,
// never by the host compiler): element conversions, vector loads and
// reductions. Modelled on MLX's backend/cuda/device/utils.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace mlx_backend_cuda {

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Rounds through T (what storing to a T array and reading it back does).
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

// N elements of T loaded or stored as one 16-byte (or smaller) access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Elements of T per 16-byte access.
template <typename T>
__host__ __device__ constexpr int vec_width() {
  return 16 / sizeof(T);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

// The sum of `v` over the block, returned to every thread. blockDim.x is a
// multiple of 32 (at most 1024); `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x % 32;
  int warp = threadIdx.x / 32;
  int warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads(); // scratch may still be read by a previous call
  if (lane == 0) {
    scratch[warp] = v;
  }
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

} // namespace mlx_backend_cuda
