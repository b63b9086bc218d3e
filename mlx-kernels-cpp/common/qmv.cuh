// Quantized matrix-vector products for decode-size batches on MLX's affine
// format (the layout in MLX's backend/cuda/quantized/qmv.cu): each uint32 of
// `w [N, K·bits/32]` packs 32/bits values, lowest bits first; value k of row
// n is scales[n, k/gs]·q + biases[n, k/gs]. A warp computes COLS adjacent
// output columns for up to ROWS rows of x; a lane reads 16 bytes of each
// weight row at a time, so rows stream as whole 512-byte warp reads. Each
// weight is dequantized once (scale·q + bias) and used for every row, and
// each element of x is converted once and used for every column: with
// several rows the work per weight byte, not the bytes, bounds the kernel,
// so the row count picks the columns per warp. Each (ROWS, COLS) shape is a
// kernel of its own, so that the one-row kernel keeps the occupancy its
// few registers allow: 1 row, 1 column per warp (the matrix spread over the
// most warps: a decode row is bandwidth-bound); 2 rows, 2 columns; 3–4
// rows, 4 columns (2 for the gate/up pair, whose accumulators are twice as
// many). The host picks the kernel by its `_r1`, `_r2`, `_r4` suffix
// (quantized_matmul/cuda.cpp).
#pragma once

#include "common/cuda_common.cuh"

namespace mlx_backend_cuda {

// The most rows of x one launch takes: from 5 rows on, MLX's own
// quantized matmul switches to a faster path than these kernels (measured
// in docs/performance.md), so more rows go to it.
constexpr int kQmvMaxRows = 4;
constexpr int kQmvWarpsPerBlock = 4;
// Columns per warp at most: plain projections, and the gate/up pair (two
// matrices' accumulators).
constexpr int kQmvPlainMaxCols = 4;
constexpr int kQmvGateMaxCols = 2;

// One quantized matrix: packed words, scales and biases.
template <typename P>
struct QuantMatrix {
  const uint32_t* w;
  const P* scales;
  const P* biases;
};

template <typename T, int N, bool ALIGNED>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  if constexpr (ALIGNED) {
    return *reinterpret_cast<const Vec<T, N>*>(p);
  } else {
    Vec<T, N> v;
#pragma unroll
    for (int j = 0; j < N; j++) {
      v.v[j] = p[j];
    }
    return v;
  }
}

// acc[m][c][r] += Σ_k x[r, k] · mats[m].w[n0 + c, k] over this lane's share
// of the columns n0 .. n0 + COLS - 1 (those below n_len), for the first
// `rows` (≤ ROWS) rows of x. With NORM, x is first RMS-normed as
// norm_row (decoder_layer/cuda.cu) would write it: x[r, k]·row_scale[r]·
// norm_w[k], rounded to T (see rms_row_scales).
template <typename T, typename P, int BITS, int MATS, int COLS, int ROWS, bool ALIGNED, bool NORM = false>
__device__ __forceinline__ void qmv_lane(
    const T* x,
    const QuantMatrix<P> (&mats)[MATS],
    int n0,
    int n_len,
    int rows,
    int k_len,
    int group_size,
    float (&acc)[MATS][COLS][ROWS],
    const float* norm_w = nullptr,
    const float* row_scale = nullptr) {
  constexpr int kPerWord = 32 / BITS;
  constexpr int kPerChunk = 4 * kPerWord; // values in 16 bytes
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  constexpr int kVec = vec_width<T>();
  static_assert(kPerChunk % kVec == 0, "a chunk holds whole x vectors");
  const int lane = threadIdx.x % 32;
  const int words_per_row = k_len / kPerWord;
  const int groups_per_row = k_len / group_size;
  const int chunks = k_len / kPerChunk;
  for (int c = lane; c < chunks; c += 32) {
    const int k0 = c * kPerChunk;
    const int g = k0 / group_size;
    uint32_t words[MATS][COLS][4];
    float scale[MATS][COLS], bias[MATS][COLS];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
#pragma unroll
      for (int col = 0; col < COLS; col++) {
        // Columns past the end read column n0 (valid) and are never stored.
        const int n = n0 + col < n_len ? n0 + col : n0;
        const uint32_t* wp = mats[m].w + static_cast<size_t>(n) * words_per_row + 4 * c;
        uint4 p;
        if constexpr (ALIGNED) {
          p = *reinterpret_cast<const uint4*>(wp);
        } else {
          p = make_uint4(wp[0], wp[1], wp[2], wp[3]);
        }
        words[m][col][0] = p.x;
        words[m][col][1] = p.y;
        words[m][col][2] = p.z;
        words[m][col][3] = p.w;
        scale[m][col] = to_f32(mats[m].scales[static_cast<size_t>(n) * groups_per_row + g]);
        bias[m][col] = to_f32(mats[m].biases[static_cast<size_t>(n) * groups_per_row + g]);
      }
    }
#pragma unroll
    for (int v = 0; v < kPerChunk / kVec; v++) {
      // This x vector's weights, dequantized once for every row.
      float w[MATS][COLS][kVec];
#pragma unroll
      for (int m = 0; m < MATS; m++) {
#pragma unroll
        for (int col = 0; col < COLS; col++) {
#pragma unroll
          for (int j = 0; j < kVec; j++) {
            const int i = v * kVec + j;
            const float q = static_cast<float>(
                (words[m][col][i / kPerWord] >> (BITS * (i % kPerWord))) & kMask);
            w[m][col][j] = scale[m][col] * q + bias[m][col];
          }
        }
      }
      float nw[kVec];
      if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < kVec; j++) {
          nw[j] = norm_w[k0 + v * kVec + j];
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; r++) {
        if (r < rows) {
          const Vec<T, kVec> xv =
              load_vec<T, kVec, ALIGNED>(x + static_cast<size_t>(r) * k_len + k0 + v * kVec);
#pragma unroll
          for (int j = 0; j < kVec; j++) {
            float xf = to_f32(xv.v[j]);
            if constexpr (NORM) {
              xf = round_to<T>(xf * row_scale[r] * nw[j]);
            }
#pragma unroll
            for (int m = 0; m < MATS; m++) {
#pragma unroll
              for (int col = 0; col < COLS; col++) {
                acc[m][col][r] += xf * w[m][col][j];
              }
            }
          }
        }
      }
    }
  }
}

// scale[r] = 1/sqrt(mean(x[r, :]²) + eps) for the first `rows` rows of x,
// every lane of the warp getting each; rows past `rows` get 0.
template <typename T, int ROWS>
__device__ __forceinline__ void rms_row_scales(
    const T* x,
    int rows,
    int k_len,
    float eps,
    float (&scale)[ROWS]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    float ss = 0.0f;
    if (r < rows) {
      for (int k = lane; k < k_len; k += 32) {
        const float v = to_f32(x[static_cast<size_t>(r) * k_len + k]);
        ss += v * v;
      }
    }
    ss = warp_sum(ss);
    scale[r] = r < rows ? rsqrtf(ss / static_cast<float>(k_len) + eps) : 0.0f;
  }
}

// silu(g)·u from the gate and up projections' f32 sums, rounded where the
// unfused graph rounds: each projection, the sigmoid, silu and the product
// to T.
template <typename T>
__device__ __forceinline__ T swiglu(float g_sum, float u_sum) {
  const float g = round_to<T>(g_sum);
  const float u = round_to<T>(u_sum);
  const float sig = round_to<T>(1.0f / (1.0f + expf(-g)));
  const float silu = round_to<T>(g * sig);
  return from_f32<T>(silu * u);
}

} // namespace mlx_backend_cuda
