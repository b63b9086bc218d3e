// Quantized matrix-vector products for decode-size batches on MLX's affine
// format (the layout in MLX's backend/cuda/quantized/qmv.cu): each uint32 of
// `w [N, K·bits/32]` packs 32/bits values, lowest bits first; value k of row
// n is scales[n, k/gs]·q + biases[n, k/gs]. One warp computes one output
// column for every row of x; a lane reads 16 bytes of the weight row at a
// time, so a row streams as whole 512-byte warp reads.
#pragma once

#include "common/cuda_common.cuh"

namespace mlx_backend_cuda {

// The most rows of x one launch takes (more go to MLX's qmm).
constexpr int kQmvMaxRows = 8;
constexpr int kQmvWarpsPerBlock = 4;

// One quantized matrix: packed words, scales and biases.
template <typename P>
struct QuantMatrix {
  const uint32_t* w;
  const P* scales;
  const P* biases;
};

// acc[r] += Σ_k x[r, k] · w[n, k] over this lane's share of row n.
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

template <typename T, typename P, int BITS, int MATS, bool ALIGNED>
__device__ __forceinline__ void qmv_lane(
    const T* x,
    const QuantMatrix<P> (&mats)[MATS],
    int n,
    int rows,
    int k_len,
    int group_size,
    float (&acc)[MATS][kQmvMaxRows]) {
  constexpr int kPerWord = 32 / BITS;
  constexpr int kPerChunk = 4 * kPerWord; // values in 16 bytes
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int lane = threadIdx.x % 32;
  const int words_per_row = k_len / kPerWord;
  const int groups_per_row = k_len / group_size;
  const int chunks = k_len / kPerChunk;
  for (int c = lane; c < chunks; c += 32) {
    const int k0 = c * kPerChunk;
    const int g = k0 / group_size;
    uint4 packed[MATS];
    float scale[MATS], bias[MATS];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
      const uint32_t* wp = mats[m].w + static_cast<size_t>(n) * words_per_row + 4 * c;
      if constexpr (ALIGNED) {
        packed[m] = *reinterpret_cast<const uint4*>(wp);
      } else {
        packed[m] = make_uint4(wp[0], wp[1], wp[2], wp[3]);
      }
      scale[m] = to_f32(mats[m].scales[static_cast<size_t>(n) * groups_per_row + g]);
      bias[m] = to_f32(mats[m].biases[static_cast<size_t>(n) * groups_per_row + g]);
    }
    // The chunk's weights as floats, once for every row of x.
    float q[MATS][kPerChunk];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
      const uint32_t words[4] = {packed[m].x, packed[m].y, packed[m].z, packed[m].w};
#pragma unroll
      for (int i = 0; i < kPerChunk; i++) {
        q[m][i] = static_cast<float>((words[i / kPerWord] >> (BITS * (i % kPerWord))) & kMask);
      }
    }
    constexpr int kVec = vec_width<T>();
#pragma unroll
    for (int r = 0; r < kQmvMaxRows; r++) {
      if (r >= rows) {
        break;
      }
      const T* xr = x + static_cast<size_t>(r) * k_len + k0;
      float xsum = 0.0f;
      float dot[MATS];
#pragma unroll
      for (int m = 0; m < MATS; m++) {
        dot[m] = 0.0f;
      }
#pragma unroll
      for (int v = 0; v < kPerChunk / kVec; v++) {
        Vec<T, kVec> xv = load_vec<T, kVec, ALIGNED>(xr + v * kVec);
#pragma unroll
        for (int j = 0; j < kVec; j++) {
          const float xf = to_f32(xv.v[j]);
          xsum += xf;
#pragma unroll
          for (int m = 0; m < MATS; m++) {
            dot[m] += xf * q[m][v * kVec + j];
          }
        }
      }
#pragma unroll
      for (int m = 0; m < MATS; m++) {
        acc[m][r] += scale[m] * dot[m] + bias[m] * xsum;
      }
    }
  }
}

} // namespace mlx_backend_cuda
