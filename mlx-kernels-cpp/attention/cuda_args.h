// The attention kernels' arguments: one struct that the host fills
// (attention/cuda.cpp) and the kernels take by value (attention/cuda.cu),
// and the prefill kernels' tile geometry, which both sides need.
#pragma once

#include <cstdint>

// The helpers below are evaluated on both sides (nvcc only accepts
// constexpr host functions in device code with --expt-relaxed-constexpr).
#ifdef __CUDACC__
#define MLX_BACKEND_HOST_DEVICE __host__ __device__
#else
#define MLX_BACKEND_HOST_DEVICE
#endif

namespace mlx_backend {

// Batch, head, row and element strides, in elements.
struct AttentionStrides {
  long long batch, head, row, elem;
};

struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  // The first pass's partial states when splits > 1, else null.
  float* partials;
  AttentionStrides qs, ks, vs;
  int hq, hkv, l_len, s_len, d;
  float scale;
  bool causal;
  // Blocks per row along the keys (the row-per-block kernel).
  int splits;
  // The prefill kernels: q, k and v rows are dense 16-byte vectors
  // (flash_rows_vectorizable), copied to shared memory asynchronously.
  bool vec;
};

// The row-per-block kernel takes up to this many query rows per head (a
// decode step, a few speculative rows); more go to the prefill kernels,
// whose 64-row (32 for f32) query tiles would mostly idle on so few.
constexpr int kAttentionDecodeMaxRows = 4;

// Prefill kernels: threads per block, and query rows per block (f16/bf16:
// 16 per warp; f32: 4 per thread row group).
constexpr int kFlashThreads = 128;
constexpr int kFlashRows = 64;
constexpr int kFlashF32Rows = 32;

// The head sizes the prefill kernels are compiled for; head_dim runs as
// the smallest that covers it, zero padded.
constexpr int kFlashDims[] = {32, 64, 96, 128, 192, 256};

constexpr int flash_padded_dim(int d) {
  for (int p : kFlashDims) {
    if (d <= p) {
      return p;
    }
  }
  return 0;
}

// Keys per tile of the f16/bf16 prefill kernel: 64 while its f32
// accumulators (dp / 2 floats a thread) leave registers for a 64-key score
// tile, 32 above. The f32 kernel's tiles are 32 keys.
MLX_BACKEND_HOST_DEVICE constexpr int flash_tc_keys(int dp) {
  return dp <= 128 ? 64 : 32;
}
constexpr int kFlashF32Keys = 32;

// Dynamic shared memory of the prefill kernels for padded head size dp
// (flash_tc: q, k and v tiles of dp + 8 elements a row; flash_f32: a q
// tile and two k tiles of dp + 4 floats a row, two v tiles of dp, the
// probability tile of 36 a row).
constexpr unsigned flash_tc_smem_bytes(int dp, int elem_bytes) {
  return static_cast<unsigned>((kFlashRows + 2 * flash_tc_keys(dp)) * (dp + 8) * elem_bytes);
}
constexpr unsigned flash_f32_smem_bytes(int dp) {
  return static_cast<unsigned>(
      ((kFlashF32Rows + 2 * kFlashF32Keys) * (dp + 4) + 2 * kFlashF32Keys * dp +
       kFlashF32Rows * (kFlashF32Keys + 4)) *
      4);
}

// Whether the prefill kernels may copy the rows of one of q, k, v
// (first element `p`, strides `s`) to shared memory as 16-byte vectors:
// dense rows whose every start is 16-byte aligned.
inline bool flash_rows_vectorizable(const void* p, const AttentionStrides& s, int d, int elem_bytes) {
  const long long per = 16 / elem_bytes;
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && s.elem == 1 && d % per == 0 &&
      s.row % per == 0 && s.head % per == 0 && s.batch % per == 0;
}

} // namespace mlx_backend
