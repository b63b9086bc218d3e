// attention's CUDA body (the contract is in mlx-backend/kernels/attention/mod.rs):
// softmax(q·kᵀ·scale)·v for one query row per block, causal (lower-right
// aligned) or unmasked, grouped-query heads. Modelled on MLX's
// backend/cuda/scaled_dot_product_attention.cu (sdpa_vector): the block's
// warps take interleaved keys, each keeps an online softmax (running max,
// running sum, the weighted sum of values) in f32, and the warps' partial
// states are merged through shared memory at the end. A lane holds head
// elements lane, lane + 32, ... of q and of its accumulator, so every key
// and value row is read as whole coalesced warp loads; q, k and v are read
// in place through their strides (the KV cache's slices and the heads'
// transpose need no copy; any other view works too, less coalesced).
#include "common/cuda_common.cuh"

using namespace mlx_backend_cuda;

namespace {

constexpr int kWarps = 4;
// Largest head_dim (elements per lane times 32); the op checks it.
constexpr int kMaxPerLane = 8;

struct Strides {
  long long batch, head, row, elem;
};

template <typename T, int PER_LANE>
__device__ void attend_row(
    const T* q,
    const T* k,
    const T* v,
    T* out,
    Strides qs,
    Strides ks,
    Strides vs,
    int hq,
    int hkv,
    int l_len,
    int s_len,
    int d,
    float scale,
    bool causal) {
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int kv_head = head / (hq / hkv);
  // Keys 0..=last are visible to this row.
  const int last = causal ? row + s_len - l_len : s_len - 1;

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
  for (int j = warp; j <= last; j += kWarps) {
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
  const float inv = 1.0f / total;
  T* orow = out + ((static_cast<long long>(batch) * hq + head) * l_len + row) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      o += partial[w][e] * weight[w];
    }
    orow[e] = from_f32<T>(o * inv);
  }
}

template <typename T>
__device__ void attend(
    const T* q,
    const T* k,
    const T* v,
    T* out,
    Strides qs,
    Strides ks,
    Strides vs,
    int hq,
    int hkv,
    int l_len,
    int s_len,
    int d,
    float scale,
    bool causal) {
  // Elements per lane, the fewest that cover head_dim.
  switch ((d + 31) / 32) {
    case 1:
      attend_row<T, 1>(q, k, v, out, qs, ks, vs, hq, hkv, l_len, s_len, d, scale, causal);
      break;
    case 2:
      attend_row<T, 2>(q, k, v, out, qs, ks, vs, hq, hkv, l_len, s_len, d, scale, causal);
      break;
    case 3:
    case 4:
      attend_row<T, 4>(q, k, v, out, qs, ks, vs, hq, hkv, l_len, s_len, d, scale, causal);
      break;
    default:
      attend_row<T, kMaxPerLane>(q, k, v, out, qs, ks, vs, hq, hkv, l_len, s_len, d, scale, causal);
      break;
  }
}

} // namespace

#define ATTENTION_KERNEL(S, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(kWarps * 32) mlx_backend_attention_##S(          \
      const T* q, const T* k, const T* v, T* out, Strides qs, Strides ks, Strides vs, int hq,  \
      int hkv, int l_len, int s_len, int d, float scale, bool causal) {                        \
    attend<T>(q, k, v, out, qs, ks, vs, hq, hkv, l_len, s_len, d, scale, causal);              \
  }

ATTENTION_KERNEL(f32, float)
ATTENTION_KERNEL(f16, __half)
ATTENTION_KERNEL(bf16, __nv_bfloat16)
