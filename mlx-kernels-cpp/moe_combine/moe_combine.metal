// MoE combine's Metal body (the contract is in
// mlx-backend/kernels/moe_combine/mod.rs; the CUDA twin is moe_combine/cuda.cu):
// one threadgroup per token row, each thread a slice of the hidden axis, the
// top-k products accumulated in f32 in ascending k with separate multiply
// and add, as the contract and the CPU body do. Modelled on MLX's
// backend/metal/kernels/binary.h element-per-thread loops over a row, with
// the row's scores staged once in threadgroup memory (as
// backend/metal/kernels/softmax.h stages its row state).
#include "common/metal_common.h"

using namespace mlx_backend_metal;

// The product and the sum are separate statements: a fused multiply-add
// would round once where the contract rounds twice, and with
// -fno-fast-math (build/metal.rs) the compiler contracts only within one
// expression.

// The most experts per token (CUDA_MAX_TOP_K in moe_combine/mod.rs).
constant constexpr int kMaxTopK = 64;

template <typename T, typename S>
[[kernel]] void moe_combine(
    const device T* y [[buffer(0)]],
    const device S* scores [[buffer(1)]],
    device T* out [[buffer(2)]],
    constant int& top_k [[buffer(3)]],
    constant int& hidden [[buffer(4)]],
    uint row [[threadgroup_position_in_grid]],
    uint tid [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
  threadgroup float weights[kMaxTopK];
  for (int k = tid; k < top_k; k += threads) {
    weights[k] = to_f32(scores[static_cast<size_t>(row) * top_k + k]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const device T* yr = y + static_cast<size_t>(row) * top_k * hidden;
  device T* orow = out + static_cast<size_t>(row) * hidden;
  for (int i = tid; i < hidden; i += threads) {
    float acc = 0.0f;
    for (int k = 0; k < top_k; k++) {
      const float p = to_f32(yr[static_cast<size_t>(k) * hidden + i]) * weights[k];
      acc = acc + p;
    }
    orow[i] = from_f32<T>(acc);
  }
}

#define MOE_COMBINE_KERNEL(YS, T, SS, S) \
  MLX_BACKEND_INSTANTIATE("mlx_backend_moe_combine_" #YS "_" #SS, moe_combine, T, S)

#define MOE_COMBINE_KERNELS(YS, T)      \
  MOE_COMBINE_KERNEL(YS, T, f32, float) \
  MOE_COMBINE_KERNEL(YS, T, f16, half)  \
  MOE_COMBINE_KERNEL(YS, T, bf16, bfloat16_t)

MOE_COMBINE_KERNELS(f32, float)
MOE_COMBINE_KERNELS(f16, half)
MOE_COMBINE_KERNELS(bf16, bfloat16_t)
