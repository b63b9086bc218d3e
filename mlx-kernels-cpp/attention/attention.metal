// attention's Metal body for decode rows (the contract is in
// mlx-backend/kernels/attention/mod.rs; the CUDA twin is the row-per-block
// kernel of attention/cuda.cu on common/attend.cuh): one threadgroup per
// query row, its simdgroups taking interleaved keys, each keeping an online
// softmax (running max, running sum, the weighted sum of values) in f32,
// merged through threadgroup memory at the end. A lane holds head elements
// lane, lane + 32, ... of q and of its accumulator, so each key and value
// row is read as whole simdgroup loads. Modelled on MLX's
// backend/metal/kernels/sdpa_vector.h (sdpa_vector: simdgroups over keys,
// simd_sum for q·k, the simdgroups' maxima and sums merged in threadgroup
// memory). q, k and v are read through their strides, so the KV cache's
// slices and the heads' transpose are never copied.
#include "attention/metal_args.h"
#include "common/metal_common.h"

using namespace mlx_backend_metal;
using namespace mlx_backend_attention;

template <typename T, int PER_LANE>
[[kernel]] void attention_decode(
    const device T* q [[buffer(0)]],
    const device T* k [[buffer(1)]],
    const device T* v [[buffer(2)]],
    device T* out [[buffer(3)]],
    constant MetalAttentionArgs& a [[buffer(4)]],
    // The grid attributes share one vector width, as Metal requires.
    uint3 tg [[threadgroup_position_in_grid]],
    uint3 tid3 [[thread_position_in_threadgroup]],
    uint3 threads3 [[threads_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int kGroups = kMetalAttentionSimdgroups;
  const uint tid = tid3.x;
  const uint threads = threads3.x;
  const int row = tg.x;
  const int h = tg.y;
  const int b = tg.z;
  const int kvh = h / (a.hq / a.hkv);
  const int d = a.d;
  // Causal is lower-right aligned: row i sees keys 0 ..= i + S - L.
  const int end_key = a.causal ? min(a.s_len, row + a.s_len - a.l_len + 1) : a.s_len;
  const device T* qr = q + b * a.qs[0] + h * a.qs[1] + row * a.qs[2];
  const device T* kh = k + b * a.ks[0] + kvh * a.ks[1];
  const device T* vh = v + b * a.vs[0] + kvh * a.vs[1];

  float qv[PER_LANE];
  float acc[PER_LANE];
  for (int t = 0; t < PER_LANE; t++) {
    const int e = lane + 32 * t;
    qv[t] = e < d ? to_f32(qr[e * a.qs[3]]) * a.scale : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = sg; j < end_key; j += kGroups) {
    const device T* kr = kh + j * a.ks[2];
    float dot = 0.0f;
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        dot += qv[t] * to_f32(kr[e * a.ks[3]]);
      }
    }
    const float s = simd_sum(dot);
    const float m_new = max(m, s);
    const float corr = fast::exp(m - m_new);
    const float p = fast::exp(s - m_new);
    l = l * corr + p;
    const device T* vr = vh + j * a.vs[2];
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        acc[t] = acc[t] * corr + p * to_f32(vr[e * a.vs[3]]);
      }
    }
    m = m_new;
  }

  // Merge the simdgroups' states: out = Σ_w acc_w·e^(m_w - M) / Σ_w l_w·e^(m_w - M).
  threadgroup float maxes[kGroups];
  threadgroup float sums[kGroups];
  threadgroup float states[kGroups][kMetalAttentionMaxPerLane * 32];
  if (lane == 0) {
    maxes[sg] = m;
    sums[sg] = l;
  }
  for (int t = 0; t < PER_LANE; t++) {
    states[sg][lane + 32 * t] = acc[t];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float big = -INFINITY;
  for (int w = 0; w < kGroups; w++) {
    big = max(big, maxes[w]);
  }
  float weight[kGroups];
  float total = 0.0f;
  for (int w = 0; w < kGroups; w++) {
    // A simdgroup that saw no key has m = -inf and weighs nothing.
    weight[w] = maxes[w] == -INFINITY ? 0.0f : fast::exp(maxes[w] - big);
    total += sums[w] * weight[w];
  }
  const float inv = 1.0f / total;
  device T* orow = out + ((static_cast<size_t>(b) * a.hq + h) * a.l_len + row) * d;
  for (int e = tid; e < d; e += threads) {
    float o = 0.0f;
    for (int w = 0; w < kGroups; w++) {
      o += states[w][e] * weight[w];
    }
    orow[e] = from_f32<T>(o * inv);
  }
}

#define ATTENTION_KERNELS(SUFFIX, T)                                                          \
  MLX_BACKEND_INSTANTIATE("mlx_backend_attention_" #SUFFIX "_p4", attention_decode, T, 4) \
  MLX_BACKEND_INSTANTIATE("mlx_backend_attention_" #SUFFIX "_p8", attention_decode, T, 8)

ATTENTION_KERNELS(f32, float)
ATTENTION_KERNELS(f16, half)
ATTENTION_KERNELS(bf16, bfloat16_t)
