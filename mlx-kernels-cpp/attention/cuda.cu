// attention's CUDA body (the contract is in mlx-backend/kernels/attention/mod.rs):
// softmax(q·kᵀ·scale)·v for one query row per block, causal (lower-right
// aligned) or unmasked, grouped-query heads. Modelled on MLX's
// backend/cuda/scaled_dot_product_attention.cu (sdpa_vector): the block's
// warps take interleaved keys, each keeps an online softmax (running max,
// running sum, the weighted sum of values) in f32, and the warps' partial
// states are merged through shared memory at the end. When there are few
// rows (decode) and many keys, the keys are also split over several blocks
// per row (MLX's sdpa_vector_2pass, "flash decoding"): each block writes
// its partial state (max, sum, unnormalised output) in f32 and a second
// kernel merges a row's partials. A lane holds head
// elements lane, lane + 32, ... of q and of its accumulator, so every key
// and value row is read as whole coalesced warp loads; q, k and v are read
// in place through their strides (the KV cache's slices and the heads'
// transpose need no copy; any other view works too, less coalesced).
#include "attention/cuda_args.h"
#include "common/cuda_common.cuh"

using namespace mlx_backend_cuda;
using mlx_backend::AttentionArgs;

namespace {

constexpr int kWarps = 4;
// Largest head_dim (elements per lane times 32); the op checks it.
constexpr int kMaxPerLane = 8;

// A row's partial state as the first pass leaves it: max, sum, then the
// unnormalised output (head_dim floats).
__device__ __forceinline__ float* partial_of(float* partials, long long row_index, int split, int splits, int d) {
  return partials + (row_index * splits + split) * (d + 2);
}

template <typename T, int PER_LANE>
__device__ void attend_row(const AttentionArgs& a) {
  const auto qs = a.qs, ks = a.ks, vs = a.vs;
  const int hq = a.hq, hkv = a.hkv, l_len = a.l_len, s_len = a.s_len, d = a.d, splits = a.splits;
  const float scale = a.scale;
  const bool causal = a.causal;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  float* partials = a.partials;
  const int row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int kv_head = head / (hq / hkv);
  // Keys 0..=last are visible to this row; this block takes its split's
  // share of them.
  const int last = causal ? row + s_len - l_len : s_len - 1;
  const int per_split = (last + splits) / splits;
  const int first_key = split * per_split;
  const int end_key = min(last + 1, first_key + per_split);

  const T* qr = q + batch * qs.batch + head * qs.head + row * qs.row;
  const T* kb = k + batch * ks.batch + kv_head * ks.head;
  const T* vb = v + batch * vs.batch + kv_head * vs.head;

  float qv[PER_LANE];
  float acc[PER_LANE];
#pragma unroll
  for (int t = 0; t < PER_LANE; t++) {
    const int e = lane + 32 * t;
    qv[t] = e < d ? to_f32(qr[e * qs.elem]) * scale : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = first_key + warp; j < end_key; j += kWarps) {
    const T* kr = kb + j * ks.row;
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        dot += qv[t] * to_f32(kr[e * ks.elem]);
      }
    }
    const float s = warp_sum(dot);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new);
    const float p = __expf(s - m_new);
    l = l * corr + p;
    const T* vr = vb + j * vs.row;
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        acc[t] = acc[t] * corr + p * to_f32(vr[e * vs.elem]);
      }
    }
    m = m_new;
  }

  // Merge the warps' states: out = Σ_w acc_w·e^(m_w - M) / Σ_w l_w·e^(m_w - M).
  __shared__ float maxes[kWarps];
  __shared__ float sums[kWarps];
  __shared__ float partial[kWarps][kMaxPerLane * 32];
  if (lane == 0) {
    maxes[warp] = m;
    sums[warp] = l;
  }
#pragma unroll
  for (int t = 0; t < PER_LANE; t++) {
    partial[warp][lane + 32 * t] = acc[t];
  }
  __syncthreads();
  float big = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; w++) {
    big = fmaxf(big, maxes[w]);
  }
  float weight[kWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; w++) {
    // A warp that saw no key has m = -inf and weighs nothing.
    weight[w] = maxes[w] == -INFINITY ? 0.0f : __expf(maxes[w] - big);
    total += sums[w] * weight[w];
  }
  const long long row_index = (static_cast<long long>(batch) * hq + head) * l_len + row;
  if (splits > 1) {
    float* part = partial_of(partials, row_index, split, splits, d);
    if (threadIdx.x == 0) {
      part[0] = big;
      part[1] = total;
    }
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; w++) {
        o += partial[w][e] * weight[w];
      }
      part[2 + e] = o;
    }
    return;
  }
  const float inv = 1.0f / total;
  T* orow = out + row_index * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      o += partial[w][e] * weight[w];
    }
    orow[e] = from_f32<T>(o * inv);
  }
}

// The second pass: out = Σ_s acc_s·e^(m_s - M) / Σ_s l_s·e^(m_s - M) over a
// row's splits (a split that saw no key has m = -inf and weighs nothing).
template <typename T>
__device__ void merge_splits(const float* partials, T* out, int hq, int l_len, int d, int splits) {
  const long long row_index =
      (static_cast<long long>(blockIdx.z) * hq + blockIdx.y) * l_len + blockIdx.x;
  const float* first = partials + row_index * splits * (d + 2);
  float big = -INFINITY;
  for (int s = 0; s < splits; s++) {
    big = fmaxf(big, first[s * (d + 2)]);
  }
  float total = 0.0f;
  for (int s = 0; s < splits; s++) {
    const float m = first[s * (d + 2)];
    total += m == -INFINITY ? 0.0f : first[s * (d + 2) + 1] * __expf(m - big);
  }
  const float inv = 1.0f / total;
  T* orow = out + row_index * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float m = first[s * (d + 2)];
      if (m != -INFINITY) {
        o += first[s * (d + 2) + 2 + e] * __expf(m - big);
      }
    }
    orow[e] = from_f32<T>(o * inv);
  }
}

template <typename T>
__device__ void attend(const AttentionArgs& a) {
  // Elements per lane, the fewest that cover head_dim.
  switch ((a.d + 31) / 32) {
    case 1:
      attend_row<T, 1>(a);
      break;
    case 2:
      attend_row<T, 2>(a);
      break;
    case 3:
    case 4:
      attend_row<T, 4>(a);
      break;
    default:
      attend_row<T, kMaxPerLane>(a);
      break;
  }
}

} // namespace

#define ATTENTION_KERNEL(S, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(kWarps * 32) mlx_backend_attention_##S(          \
      AttentionArgs a) {                                                                       \
    attend<T>(a);                                                                              \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kWarps * 32) mlx_backend_attention_merge_##S(    \
      const float* partials, T* out, int hq, int l_len, int d, int splits) {                   \
    merge_splits<T>(partials, out, hq, l_len, d, splits);                                      \
  }

ATTENTION_KERNEL(f32, float)
ATTENTION_KERNEL(f16, __half)
ATTENTION_KERNEL(bf16, __nv_bfloat16)
