// MoE combine's CUDA body (the contract is in mlx-backend/kernels/moe_combine/mod.rs):
// one block per token row, each thread a slice of the hidden axis, the top-k
// products accumulated in f32 in ascending k with separate multiply and add
// (no fused multiply-add), as the contract and the CPU body do.
#include "common/cuda_common.cuh"

using namespace mlx_backend_cuda;

namespace {

constexpr int kMaxTopK = 64;

template <typename T, typename S, int N>
__device__ void combine_rows(const T* y, const S* scores, T* out, int rows, int top_k, int hidden) {
  int row = blockIdx.x;
  if (row >= rows) {
    return;
  }
  __shared__ float weights[kMaxTopK];
  for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
    weights[k] = to_f32(scores[static_cast<size_t>(row) * top_k + k]);
  }
  __syncthreads();
  const T* yr = y + static_cast<size_t>(row) * top_k * hidden;
  auto* ov = reinterpret_cast<Vec<T, N>*>(out + static_cast<size_t>(row) * hidden);
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) {
      acc[j] = 0.0f;
    }
    for (int k = 0; k < top_k; k++) {
      Vec<T, N> a = reinterpret_cast<const Vec<T, N>*>(yr + static_cast<size_t>(k) * hidden)[i];
#pragma unroll
      for (int j = 0; j < N; j++) {
        acc[j] = __fadd_rn(acc[j], __fmul_rn(to_f32(a.v[j]), weights[k]));
      }
    }
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; j++) {
      o.v[j] = from_f32<T>(acc[j]);
    }
    ov[i] = o;
  }
}

} // namespace

#define MOE_COMBINE_KERNEL(YS, T, SS, S)                                                   \
  extern "C" __global__ void mlx_backend_moe_combine_##YS##_##SS(                          \
      const T* y, const S* scores, T* out, int rows, int top_k, int hidden, bool vec) {    \
    if (vec) {                                                                             \
      combine_rows<T, S, vec_width<T>()>(y, scores, out, rows, top_k, hidden);             \
    } else {                                                                               \
      combine_rows<T, S, 1>(y, scores, out, rows, top_k, hidden);                          \
    }                                                                                      \
  }

#define MOE_COMBINE_KERNELS(YS, T)            \
  MOE_COMBINE_KERNEL(YS, T, f32, float)       \
  MOE_COMBINE_KERNEL(YS, T, f16, __half)      \
  MOE_COMBINE_KERNEL(YS, T, bf16, __nv_bfloat16)

MOE_COMBINE_KERNELS(f32, float)
MOE_COMBINE_KERNELS(f16, __half)
MOE_COMBINE_KERNELS(bf16, __nv_bfloat16)
