// attention's CUDA body (the contract is in mlx-backend/kernels/attention/mod.rs).
//
// Decode (up to kAttentionDecodeMaxRows query rows per head): one query row
// per block, causal (lower-right aligned) or unmasked, grouped-query heads
// (the row's work is common/attend.cuh). When there are few rows and many
// keys, the keys are also split over several blocks per row (MLX's
// sdpa_vector_2pass, "flash decoding"): each block writes its partial
// state in f32 and a second kernel merges a row's partials.
//
// Prefill (more rows): a block per tile of query rows (attention/flash.cuh),
// tensor cores for f16/bf16, exact f32 on the CUDA cores for f32.
//
// q, k and v are read in place through their strides (the KV cache's
// slices and the heads' transpose need no copy; any other view works too,
// less coalesced).
#include "attention/cuda_args.h"
#include "attention/flash.cuh"
#include "common/attend.cuh"

using namespace mlx_backend_cuda;
using mlx_backend::AttentionArgs;

namespace {

template <typename T>
__device__ void attend_row(const AttentionArgs& a) {
  const auto qs = a.qs, ks = a.ks, vs = a.vs;
  const int row = blockIdx.x / a.splits;
  const int split = blockIdx.x % a.splits;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (a.hq / a.hkv);
  // Keys 0..=last are visible to this row; this block takes its split's
  // share of them.
  const int last = a.causal ? row + a.s_len - a.l_len : a.s_len - 1;
  int first_key, end_key;
  split_range(last, split, a.splits, first_key, end_key);
  const T* q = static_cast<const T*>(a.q) + batch * qs.batch + head * qs.head + row * qs.row;
  const KeyValueRows<T> kv{
      static_cast<const T*>(a.k) + batch * ks.batch + kv_head * ks.head,
      static_cast<const T*>(a.v) + batch * vs.batch + kv_head * vs.head,
      ks.row,
      ks.elem,
      vs.row,
      vs.elem};
  const long long row_index = (static_cast<long long>(batch) * a.hq + head) * a.l_len + row;
  T* out = static_cast<T*>(a.out) + row_index * a.d;
  float* partial = a.splits > 1 ? partial_of(a.partials, row_index, split, a.splits, a.d) : nullptr;
  attend_keys_any_dim<T>(q, qs.elem, a.scale, kv, a.d, first_key, end_key, out, partial);
}

// The second pass: one block per row merges the row's splits.
template <typename T>
__device__ void merge_splits(const float* partials, T* out, int hq, int l_len, int d, int splits) {
  const long long row_index =
      (static_cast<long long>(blockIdx.z) * hq + blockIdx.y) * l_len + blockIdx.x;
  merge_partials<T>(partials + row_index * splits * (d + 2), out + row_index * d, d, splits);
}

} // namespace

#define ATTENTION_KERNEL(S, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(kAttendWarps * 32) mlx_backend_attention_##S(    \
      AttentionArgs a) {                                                                       \
    attend_row<T>(a);                                                                          \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kAttendWarps * 32)                               \
      mlx_backend_attention_merge_##S(                                                         \
          const float* partials, T* out, int hq, int l_len, int d, int splits) {               \
    merge_splits<T>(partials, out, hq, l_len, d, splits);                                      \
  }

ATTENTION_KERNEL(f32, float)
ATTENTION_KERNEL(f16, __half)
ATTENTION_KERNEL(bf16, __nv_bfloat16)

// Prefill kernels, one per dtype and padded head size (kFlashDims):
// mlx_backend_attention_flash_<dtype>_d<DP>.
#define FLASH_TC_KERNEL(S, T, DP)                                                                 \
  extern "C" __global__ void __launch_bounds__(mlx_backend::kFlashThreads)                        \
      mlx_backend_attention_flash_##S##_d##DP(AttentionArgs a) {                                 \
    flash_tc<T, DP>(a);                                                                          \
  }
#define FLASH_F32_KERNEL(DP)                                                                      \
  extern "C" __global__ void __launch_bounds__(mlx_backend::kFlashThreads)                        \
      mlx_backend_attention_flash_f32_d##DP(AttentionArgs a) {                                   \
    flash_f32<DP / 16>(a);                                                                       \
  }
#define FLASH_KERNELS(DP)             \
  FLASH_TC_KERNEL(f16, __half, DP)    \
  FLASH_TC_KERNEL(bf16, __nv_bfloat16, DP) \
  FLASH_F32_KERNEL(DP)

FLASH_KERNELS(32)
FLASH_KERNELS(64)
FLASH_KERNELS(96)
FLASH_KERNELS(128)
FLASH_KERNELS(192)
FLASH_KERNELS(256)
