// decoder_layer's CUDA body (the contract is in
// mlx-backend/kernels/decoder_layer/mod.rs): the kernels a decode step
// enqueues for each block, in order (decoder_layer/cuda.cpp):
//   projection    RMSNorm of the running x, then q, k, v (+ bias) in one
//                 launch; later o (+ residual) and down (+ residual), and
//                 the head (final norm, f32 logits)
//   rope_append   q/k norm, RoPE at each row's offset, k and v written
//                 into each row's cache in place, q out
//   attention     each row's heads over its own cache (split over blocks
//                 for long caches, then merged)
//   gate          the post-attention RMSNorm, then gate and up in one
//                 pass, silu(g)·u
// plus the token lookup (embed) and a byte copy for caches that cannot be
// written in place. Each norm runs in the launch that reads it: every
// warp recomputes its rows' RMS (a few KB from L2) rather than a kernel of
// its own writing the normed rows, one launch fewer per norm in a step
// whose time is mostly launches. Every value is rounded to the activation dtype where
// the unfused graph (decoder_layer.cpp's fallback) rounds it, so the step
// equals the graph up to f32 summation order.
#include "common/attend.cuh"
#include "common/qmv.cuh"
#include "decoder_layer/cuda_args.h"

using namespace mlx_backend_cuda;
using mlx_backend::GateArgs;
using mlx_backend::ProjectionArgs;
using mlx_backend::RopeAppendArgs;
using mlx_backend::RowCaches;
using mlx_backend::StepAttentionArgs;

namespace {

constexpr int kEmbedThreads = 256;

// Row blockIdx.x of the table for token ids[row], in f32 (MLX's dequantize
// with the scales widened first); an id past the table poisons its row
// with NaN.
template <typename P, int BITS>
__device__ void embed_row(
    const uint32_t* ids,
    const uint32_t* w,
    const P* scales,
    const P* biases,
    float* out,
    int vocab,
    int hidden,
    int group_size) {
  constexpr int kPerWord = 32 / BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const uint32_t id = ids[blockIdx.x];
  float* o = out + static_cast<size_t>(blockIdx.x) * hidden;
  if (id >= static_cast<uint32_t>(vocab)) {
    for (int k = threadIdx.x; k < hidden; k += blockDim.x) {
      o[k] = __int_as_float(0x7fc00000);
    }
    return;
  }
  const uint32_t* wr = w + static_cast<size_t>(id) * (hidden / kPerWord);
  const size_t g0 = static_cast<size_t>(id) * (hidden / group_size);
  for (int k = threadIdx.x; k < hidden; k += blockDim.x) {
    const float q = static_cast<float>((wr[k / kPerWord] >> (BITS * (k % kPerWord))) & kMask);
    o[k] = to_f32(scales[g0 + k / group_size]) * q + to_f32(biases[g0 + k / group_size]);
  }
}

// A warp's COLS columns of the concatenated matrices, for up to ROWS rows
// of x (grid row blockIdx.y takes rows ROWS·y ..). The host keeps every
// matrix's columns a multiple of COLS, so a warp's columns lie in one.
template <typename X, typename P, typename O, int BITS, int COLS, int ROWS, bool ALIGNED, bool NORM>
__device__ void projection(const ProjectionArgs& a) {
  int n0 = (blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32) * COLS;
  if (n0 >= a.n_cols) {
    return;
  }
  int m = 0;
  int col0 = 0;
  while (m + 1 < a.mats && n0 - col0 >= a.n[m]) {
    col0 += a.n[m];
    m++;
  }
  const int local = n0 - col0;
  const int row0 = blockIdx.y * ROWS;
  const int rows = min(ROWS, a.rows - row0);
  const QuantMatrix<P> mats[1] = {
      {a.w[m], static_cast<const P*>(a.scales[m]), static_cast<const P*>(a.biases[m])}};
  float acc[1][COLS][ROWS] = {};
  const X* x = static_cast<const X*>(a.x) + static_cast<size_t>(row0) * a.k_len;
  float scale[ROWS];
  if constexpr (NORM) {
    rms_row_scales<X, ROWS>(x, rows, a.k_len, a.norm_eps, scale);
  }
  qmv_lane<X, P, BITS, 1, COLS, ROWS, ALIGNED, NORM>(
      x, mats, local, a.n[m], rows, a.k_len, a.group_size[m], acc, a.norm_w, scale);
  O* out = static_cast<O*>(a.out);
  const O* residual = static_cast<const O*>(a.residual);
  const float* bias = a.bias[m];
#pragma unroll
  for (int col = 0; col < COLS; col++) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      const float v = warp_sum(acc[0][col][r]);
      if (threadIdx.x % 32 == 0 && r < rows && local + col < a.n[m]) {
        float o = round_to<O>(v);
        if (bias) {
          o = round_to<O>(o + bias[local + col]);
        }
        const size_t at = static_cast<size_t>(row0 + r) * a.out_stride + n0 + col;
        if (residual) {
          o = to_f32(residual[at]) + o;
        }
        out[at] = from_f32<O>(o);
      }
    }
  }
}

template <typename T, typename P, int BITS, int COLS, int ROWS, bool ALIGNED, bool NORM>
__device__ void gate(const GateArgs& a) {
  const int n0 = (blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32) * COLS;
  if (n0 >= a.n_len) {
    return;
  }
  const int row0 = blockIdx.y * ROWS;
  const int rows = min(ROWS, a.rows - row0);
  const QuantMatrix<P> mats[2] = {
      {a.w[0], static_cast<const P*>(a.scales[0]), static_cast<const P*>(a.biases[0])},
      {a.w[1], static_cast<const P*>(a.scales[1]), static_cast<const P*>(a.biases[1])}};
  float acc[2][COLS][ROWS] = {};
  const T* x = static_cast<const T*>(a.x) + static_cast<size_t>(row0) * a.k_len;
  float scale[ROWS];
  if constexpr (NORM) {
    rms_row_scales<T, ROWS>(x, rows, a.k_len, a.norm_eps, scale);
  }
  qmv_lane<T, P, BITS, 2, COLS, ROWS, ALIGNED, NORM>(
      x, mats, n0, a.n_len, rows, a.k_len, a.group_size, acc, a.norm_w, scale);
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int col = 0; col < COLS; col++) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      const float g = warp_sum(acc[0][col][r]);
      const float u = warp_sum(acc[1][col][r]);
      if (threadIdx.x % 32 == 0 && r < rows && n0 + col < a.n_len) {
        out[static_cast<size_t>(row0 + r) * a.n_len + n0 + col] = swiglu<T>(g, u);
      }
    }
  }
}

// One warp per (head, row): grid (nq + 2 nkv, rows). Head h < nq is a
// query head, then the key heads, then the value heads.
template <typename T>
__device__ void rope_append(const RopeAppendArgs& a) {
  constexpr int kMaxD = kAttendMaxPerLane * 32;
  __shared__ float v[kMaxD];
  const int h = blockIdx.x;
  const int row = blockIdx.y;
  const int lane = threadIdx.x;
  const int d = a.d;
  const int heads = a.nq + 2 * a.nkv;
  const T* src = static_cast<const T*>(a.qkv) + (static_cast<size_t>(row) * heads + h) * d;
  const int offset = a.caches.offset[row];
  const size_t cache_at = (static_cast<size_t>(h < a.nq + a.nkv ? h - a.nq : h - a.nq - a.nkv) *
                               a.caches.capacity[row] +
                           offset) *
      d;
  if (h >= a.nq + a.nkv) {
    T* dst = static_cast<T*>(a.caches.v[row]) + cache_at;
    for (int e = lane; e < d; e += 32) {
      dst[e] = src[e];
    }
    return;
  }
  const bool query = h < a.nq;
  const float* norm = query ? a.q_norm : a.k_norm;
  float ss = 0.0f;
  for (int e = lane; e < d; e += 32) {
    const float x = to_f32(src[e]);
    v[e] = x;
    ss += x * x;
  }
  if (norm) {
    const float scale = rsqrtf(warp_sum(ss) / static_cast<float>(d) + a.eps);
    for (int e = lane; e < d; e += 32) {
      v[e] = round_to<T>(v[e] * scale * norm[e]);
    }
  }
  if (a.mscale != 1.0f) {
    const float mscale = round_to<T>(a.mscale);
    for (int e = lane; e < a.dims; e += 32) {
      v[e] = round_to<T>(v[e] * mscale);
    }
  }
  __syncwarp();
  T* dst = query ? static_cast<T*>(a.q_out) + (static_cast<size_t>(row) * a.nq + h) * d
                 : static_cast<T*>(a.caches.k[row]) + cache_at;
  const int half = a.dims / 2;
  const float position = a.position_scale * static_cast<float>(offset);
  for (int i = lane; i < half; i += 32) {
    const int p = a.traditional ? 2 * i : i;
    const int q = a.traditional ? 2 * i + 1 : i + half;
    float s, c;
    sincosf(position * a.inv_freqs[i], &s, &c);
    const float x1 = v[p];
    const float x2 = v[q];
    dst[p] = from_f32<T>(x1 * c - x2 * s);
    dst[q] = from_f32<T>(x1 * s + x2 * c);
  }
  for (int e = a.dims + lane; e < d; e += 32) {
    dst[e] = from_f32<T>(v[e]);
  }
}

// Grid (splits, nq, rows): a block per (split, head, row) over the row's
// keys 0..=offset.
template <typename T>
__device__ void step_attention(const StepAttentionArgs& a) {
  const int split = blockIdx.x;
  const int head = blockIdx.y;
  const int row = blockIdx.z;
  const int kv_head = head / (a.nq / a.nkv);
  const int cap = a.caches.capacity[row];
  int first_key, end_key;
  split_range(a.caches.offset[row], split, a.splits, first_key, end_key);
  const size_t head_at = static_cast<size_t>(kv_head) * cap * a.d;
  const KeyValueRows<T> kv{
      static_cast<const T*>(a.caches.k[row]) + head_at,
      static_cast<const T*>(a.caches.v[row]) + head_at,
      a.d,
      1,
      a.d,
      1};
  const long long row_index = static_cast<long long>(row) * a.nq + head;
  const T* q = static_cast<const T*>(a.q) + row_index * a.d;
  T* out = static_cast<T*>(a.out) + row_index * a.d;
  float* partial = a.splits > 1 ? partial_of(a.partials, row_index, split, a.splits, a.d) : nullptr;
  attend_keys_any_dim<T>(q, 1, a.scale, kv, a.d, first_key, end_key, out, partial);
}

} // namespace

// dst (dense) = src (any 4-D view, strides in elements), for caches that
// cannot be written in place.
template <typename W>
__device__ void copy_view(const mlx_backend::CopyArgs& a) {
  const W* src = static_cast<const W*>(a.src);
  W* dst = static_cast<W*>(a.dst);
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long rest = i;
    long long at = 0;
    for (int d = 3; d >= 0; d--) {
      at += (rest % a.shape[d]) * a.strides[d];
      rest /= a.shape[d];
    }
    dst[i] = src[at];
  }
}

extern "C" __global__ void mlx_backend_step_copy_b2(mlx_backend::CopyArgs a) {
  copy_view<uint16_t>(a);
}

extern "C" __global__ void mlx_backend_step_copy_b4(mlx_backend::CopyArgs a) {
  copy_view<uint32_t>(a);
}

#define STEP_ACTIVATION_KERNELS(S, T)                                                          \
  extern "C" __global__ void __launch_bounds__(32) mlx_backend_step_rope_append_##S(           \
      RopeAppendArgs a) {                                                                      \
    rope_append<T>(a);                                                                         \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kAttendWarps * 32)                              \
      mlx_backend_step_attention_##S(StepAttentionArgs a) {                                    \
    step_attention<T>(a);                                                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kAttendWarps * 32)                              \
      mlx_backend_step_attention_merge_##S(const float* partials, T* out, int d, int splits) { \
    const long long row_index = static_cast<long long>(blockIdx.x);                            \
    merge_partials<T>(partials + row_index * splits * (d + 2), out + row_index * d, d, splits); \
  }

#define EMBED_KERNEL(PS, P, BITS)                                                              \
  extern "C" __global__ void __launch_bounds__(kEmbedThreads) mlx_backend_step_embed_##PS##_b##BITS( \
      const uint32_t* ids, const uint32_t* w, const P* scales, const P* biases, float* out,    \
      int vocab, int hidden, int group_size) {                                                 \
    embed_row<P, BITS>(ids, w, scales, biases, out, vocab, hidden, group_size);                \
  }

// Projections read x of X with scales of P and write O: name
// mlx_backend_step_proj_<X>_<P>_<O>_b<BITS>_r<ROWS>.
#define PROJ_KERNEL(XS, X, PS, P, OS, O, BITS, ROWS, COLS)                                     \
  extern "C" __global__ void mlx_backend_step_proj_##XS##_##PS##_##OS##_b##BITS##_r##ROWS(     \
      ProjectionArgs a, bool vec) {                                                            \
    if (a.norm_w) {                                                                            \
      if (vec) {                                                                               \
        projection<X, P, O, BITS, COLS, ROWS, true, true>(a);                                  \
      } else {                                                                                 \
        projection<X, P, O, BITS, COLS, ROWS, false, true>(a);                                 \
      }                                                                                        \
    } else if (vec) {                                                                          \
      projection<X, P, O, BITS, COLS, ROWS, true, false>(a);                                   \
    } else {                                                                                   \
      projection<X, P, O, BITS, COLS, ROWS, false, false>(a);                                  \
    }                                                                                          \
  }

#define GATE_STEP_KERNEL(XS, T, PS, P, BITS, ROWS, COLS)                                       \
  extern "C" __global__ void mlx_backend_step_gate_##XS##_##PS##_b##BITS##_r##ROWS(            \
      GateArgs a, bool vec) {                                                                  \
    if (a.norm_w) {                                                                            \
      if (vec) {                                                                               \
        gate<T, P, BITS, COLS, ROWS, true, true>(a);                                           \
      } else {                                                                                 \
        gate<T, P, BITS, COLS, ROWS, false, true>(a);                                          \
      }                                                                                        \
    } else if (vec) {                                                                          \
      gate<T, P, BITS, COLS, ROWS, true, false>(a);                                            \
    } else {                                                                                   \
      gate<T, P, BITS, COLS, ROWS, false, false>(a);                                           \
    }                                                                                          \
  }

#define PROJ_KERNELS_ROWS(XS, X, PS, P, OS, O, BITS) \
  PROJ_KERNEL(XS, X, PS, P, OS, O, BITS, 1, 1)       \
  PROJ_KERNEL(XS, X, PS, P, OS, O, BITS, 2, 2)       \
  PROJ_KERNEL(XS, X, PS, P, OS, O, BITS, 4, 4)

#define GATE_STEP_KERNELS_ROWS(XS, T, PS, P, BITS) \
  GATE_STEP_KERNEL(XS, T, PS, P, BITS, 1, 1)       \
  GATE_STEP_KERNEL(XS, T, PS, P, BITS, 2, 2)       \
  GATE_STEP_KERNEL(XS, T, PS, P, BITS, 4, 2)

// Activations X with scales P: the blocks' projections (output X) and gate,
// and the head's projection (output f32).
#define STEP_WEIGHT_KERNELS_BITS(XS, X, PS, P, BITS) \
  PROJ_KERNELS_ROWS(XS, X, PS, P, XS, X, BITS)       \
  GATE_STEP_KERNELS_ROWS(XS, X, PS, P, BITS)
#define HEAD_KERNELS_BITS(XS, X, PS, P, BITS) PROJ_KERNELS_ROWS(XS, X, PS, P, f32, float, BITS)

#define STEP_WEIGHT_KERNELS(XS, X, PS, P)   \
  STEP_WEIGHT_KERNELS_BITS(XS, X, PS, P, 4) \
  STEP_WEIGHT_KERNELS_BITS(XS, X, PS, P, 8)
#define HEAD_KERNELS(XS, X, PS, P)   \
  HEAD_KERNELS_BITS(XS, X, PS, P, 4) \
  HEAD_KERNELS_BITS(XS, X, PS, P, 8)

STEP_ACTIVATION_KERNELS(f32, float)
STEP_ACTIVATION_KERNELS(f16, __half)
STEP_ACTIVATION_KERNELS(bf16, __nv_bfloat16)

// f32 activations take any scales (the projections' output stays f32);
// half activations take scales of their own dtype.
STEP_WEIGHT_KERNELS(f32, float, f32, float)
STEP_WEIGHT_KERNELS(f32, float, f16, __half)
STEP_WEIGHT_KERNELS(f32, float, bf16, __nv_bfloat16)
STEP_WEIGHT_KERNELS(f16, __half, f16, __half)
STEP_WEIGHT_KERNELS(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
HEAD_KERNELS(f16, __half, f16, __half)
HEAD_KERNELS(bf16, __nv_bfloat16, bf16, __nv_bfloat16)

EMBED_KERNEL(f32, float, 4)
EMBED_KERNEL(f32, float, 8)
EMBED_KERNEL(f16, __half, 4)
EMBED_KERNEL(f16, __half, 8)
EMBED_KERNEL(bf16, __nv_bfloat16, 4)
EMBED_KERNEL(bf16, __nv_bfloat16, 8)
