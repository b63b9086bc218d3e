// One query row's attention over a range of keys, for a block of
// kAttendWarps warps, and the merge of a row's split partial states. Shared
// by attention's CUDA body (any view through strides) and decoder_layer's
// (each row's own cache). Modelled on MLX's
// backend/cuda/scaled_dot_product_attention.cu (sdpa_vector): the block's
// warps take interleaved keys, each keeps an online softmax (running max,
// running sum, the weighted sum of values) in f32, and the warps' states
// are merged through shared memory at the end. A lane holds head elements
// lane, lane + 32, ... of q and of its accumulator, so every key and value
// row is read as whole coalesced warp loads.
#pragma once

#include "common/cuda_common.cuh"

namespace mlx_backend_cuda {

constexpr int kAttendWarps = 4;
// Largest head_dim (elements per lane times 32); the ops check it.
constexpr int kAttendMaxPerLane = 8;

// Where a row's keys and values are: a head's first key and value rows and
// their row and element strides, in elements.
template <typename T>
struct KeyValueRows {
  const T* k;
  const T* v;
  long long k_row, k_elem, v_row, v_elem;
};

// A row's partial state as a split leaves it: max, sum, then the
// unnormalised output (head_dim floats).
__device__ __forceinline__ float* partial_of(float* partials, long long row_index, int split, int splits, int d) {
  return partials + (row_index * splits + split) * (d + 2);
}

// softmax(q·kᵀ·scale)·v over keys first_key..end_key - 1 for the query row
// at `q` (element stride q_elem). With `partial` null, writes the
// normalised row to `out`; otherwise the block's partial state.
template <typename T, int PER_LANE>
__device__ void attend_keys(
    const T* q,
    long long q_elem,
    float scale,
    const KeyValueRows<T>& kv,
    int d,
    int first_key,
    int end_key,
    T* out,
    float* partial) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  float qv[PER_LANE];
  float acc[PER_LANE];
#pragma unroll
  for (int t = 0; t < PER_LANE; t++) {
    const int e = lane + 32 * t;
    qv[t] = e < d ? to_f32(q[e * q_elem]) * scale : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = first_key + warp; j < end_key; j += kAttendWarps) {
    const T* kr = kv.k + j * kv.k_row;
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        dot += qv[t] * to_f32(kr[e * kv.k_elem]);
      }
    }
    const float s = warp_sum(dot);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new);
    const float p = __expf(s - m_new);
    l = l * corr + p;
    const T* vr = kv.v + j * kv.v_row;
#pragma unroll
    for (int t = 0; t < PER_LANE; t++) {
      const int e = lane + 32 * t;
      if (e < d) {
        acc[t] = acc[t] * corr + p * to_f32(vr[e * kv.v_elem]);
      }
    }
    m = m_new;
  }

  // Merge the warps' states: out = Σ_w acc_w·e^(m_w - M) / Σ_w l_w·e^(m_w - M).
  __shared__ float maxes[kAttendWarps];
  __shared__ float sums[kAttendWarps];
  __shared__ float states[kAttendWarps][kAttendMaxPerLane * 32];
  if (lane == 0) {
    maxes[warp] = m;
    sums[warp] = l;
  }
#pragma unroll
  for (int t = 0; t < PER_LANE; t++) {
    states[warp][lane + 32 * t] = acc[t];
  }
  __syncthreads();
  float big = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttendWarps; w++) {
    big = fmaxf(big, maxes[w]);
  }
  float weight[kAttendWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kAttendWarps; w++) {
    // A warp that saw no key has m = -inf and weighs nothing.
    weight[w] = maxes[w] == -INFINITY ? 0.0f : __expf(maxes[w] - big);
    total += sums[w] * weight[w];
  }
  if (partial) {
    if (threadIdx.x == 0) {
      partial[0] = big;
      partial[1] = total;
    }
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kAttendWarps; w++) {
        o += states[w][e] * weight[w];
      }
      partial[2 + e] = o;
    }
    return;
  }
  const float inv = 1.0f / total;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttendWarps; w++) {
      o += states[w][e] * weight[w];
    }
    out[e] = from_f32<T>(o * inv);
  }
}

// attend_keys with the fewest elements per lane that cover head_dim.
template <typename T>
__device__ void attend_keys_any_dim(
    const T* q,
    long long q_elem,
    float scale,
    const KeyValueRows<T>& kv,
    int d,
    int first_key,
    int end_key,
    T* out,
    float* partial) {
  switch ((d + 31) / 32) {
    case 1:
      attend_keys<T, 1>(q, q_elem, scale, kv, d, first_key, end_key, out, partial);
      break;
    case 2:
      attend_keys<T, 2>(q, q_elem, scale, kv, d, first_key, end_key, out, partial);
      break;
    case 3:
    case 4:
      attend_keys<T, 4>(q, q_elem, scale, kv, d, first_key, end_key, out, partial);
      break;
    default:
      attend_keys<T, kAttendMaxPerLane>(q, q_elem, scale, kv, d, first_key, end_key, out, partial);
      break;
  }
}

// out = Σ_s acc_s·e^(m_s - M) / Σ_s l_s·e^(m_s - M) over a row's `splits`
// partial states starting at `first` (a split that saw no key has
// m = -inf and weighs nothing).
template <typename T>
__device__ void merge_partials(const float* first, T* out, int d, int splits) {
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
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float m = first[s * (d + 2)];
      if (m != -INFINITY) {
        o += first[s * (d + 2) + 2 + e] * __expf(m - big);
      }
    }
    out[e] = from_f32<T>(o * inv);
  }
}

// The keys split `split` of `splits` takes out of keys 0..last.
__device__ __forceinline__ void split_range(int last, int split, int splits, int& first_key, int& end_key) {
  const int per_split = (last + splits) / splits;
  first_key = split * per_split;
  end_key = min(last + 1, first_key + per_split);
}

} // namespace mlx_backend_cuda
