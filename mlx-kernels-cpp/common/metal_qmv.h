// Quantized matrix-vector products for decode-size batches on MLX's affine
// format, for the Metal bodies of quantized_matmul and gate_qmv_silu_mul
// (the CUDA twin is common/qmv.cuh). Each uint32 of `w [N, K·bits/32]`
// packs 32/bits values, lowest bits first; value k of row n is
// scales[n, k/gs]·q + biases[n, k/gs] (the unpacking of MLX's
// backend/metal/kernels/quantized.h, qmv_impl / qdot). A simdgroup computes
// COLS adjacent output columns for up to ROWS rows of x: its lanes take
// interleaved words of each weight row (one coalesced 128-byte read per
// step), dequantize each weight once and use it for every row, and the
// lanes' partial sums meet in one simd_sum per (row, column), as
// quantized.h's qmv kernels reduce. As on CUDA, each weight is dequantized
// to f32 before the product (not MLX's scale·Σxq + bias·Σx regrouping), so
// the body rounds as the CPU body and the unfused graph's reference do.
#pragma once

#include "common/metal_common.h"

namespace mlx_backend_metal {

// The most rows of x one launch takes (kQmvMaxRows in common/qmv.cuh).
constant constexpr int kQmvMaxRows = 4;
// Simdgroups per threadgroup (kQmvWarpsPerBlock in common/qmv.cuh); the
// host launches 32 · kQmvSimdgroups threads.
constant constexpr int kQmvSimdgroups = 4;

// One quantized matrix: packed words, scales and biases.
template <typename P>
struct QuantMatrix {
  const device uint32_t* w;
  const device P* scales;
  const device P* biases;
};

template <typename P, int MATS>
struct QuantMatrices {
  QuantMatrix<P> m[MATS];
};

// acc.v[m][c][r]: the lane's share of Σ_k x[r, k]·mats.m[m].w[n0 + c, k].
template <int MATS, int COLS, int ROWS>
struct QmvAcc {
  float v[MATS][COLS][ROWS];
};

// Adds this lane's share of the products for columns n0 .. n0 + COLS - 1
// (those below n_len) and the first `rows` (≤ ROWS) rows of x.
template <typename T, typename P, int BITS, int MATS, int COLS, int ROWS>
inline void qmv_lane(
    const device T* x,
    thread const QuantMatrices<P, MATS>& mats,
    int n0,
    int n_len,
    int rows,
    int k_len,
    int group_size,
    uint lane,
    thread QmvAcc<MATS, COLS, ROWS>& acc) {
  constexpr int kPerWord = 32 / BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int words_per_row = k_len / kPerWord;
  const int groups_per_row = k_len / group_size;
  for (int word = lane; word < words_per_row; word += kSimd) {
    const int k0 = word * kPerWord;
    // A word never straddles groups: group_size is a multiple of 32.
    const int g = k0 / group_size;
    uint32_t words[MATS][COLS];
    float scale[MATS][COLS], bias[MATS][COLS];
    for (int m = 0; m < MATS; m++) {
      for (int col = 0; col < COLS; col++) {
        // Columns past the end read column n0 (valid) and are never stored.
        const int n = n0 + col < n_len ? n0 + col : n0;
        words[m][col] = mats.m[m].w[static_cast<size_t>(n) * words_per_row + word];
        scale[m][col] = to_f32(mats.m[m].scales[static_cast<size_t>(n) * groups_per_row + g]);
        bias[m][col] = to_f32(mats.m[m].biases[static_cast<size_t>(n) * groups_per_row + g]);
      }
    }
    for (int j = 0; j < kPerWord; j++) {
      float w[MATS][COLS];
      for (int m = 0; m < MATS; m++) {
        for (int col = 0; col < COLS; col++) {
          const float q = static_cast<float>((words[m][col] >> (BITS * j)) & kMask);
          w[m][col] = scale[m][col] * q + bias[m][col];
        }
      }
      for (int r = 0; r < ROWS; r++) {
        if (r < rows) {
          const float xf = to_f32(x[static_cast<size_t>(r) * k_len + k0 + j]);
          for (int m = 0; m < MATS; m++) {
            for (int col = 0; col < COLS; col++) {
              acc.v[m][col][r] += xf * w[m][col];
            }
          }
        }
      }
    }
  }
}

// silu(g)·u from the gate and up projections' f32 sums, rounded where the
// unfused graph rounds: each projection, the sigmoid, silu and the product
// to T (swiglu in common/qmv.cuh).
template <typename T>
inline T swiglu(float g_sum, float u_sum) {
  const float g = round_to<T>(g_sum);
  const float u = round_to<T>(u_sum);
  const float sig = round_to<T>(1.0f / (1.0f + metal::precise::exp(-g)));
  const float silu = round_to<T>(g * sig);
  return from_f32<T>(silu * u);
}

} // namespace mlx_backend_metal
