// quantized_matmul's CUDA body (the contract is in
// mlx-backend/kernels/quantized_matmul/mod.rs): out[r, n] = Σ_k x[r, k]·w[n, k],
// f32 accumulation, one rounding to the output dtype (x's, which the
// eligibility makes the promoted type). Up to kQmvMaxRows rows run the
// decode kernels of common/qmv.cuh (`mlx_backend_qmv_*`); more rows the
// tiled kernels of common/qmm.cuh (`mlx_backend_qmm_*`, one per tile of
// qmm_tiles.h).
#include "common/qmm.cuh"
#include "common/qmv.cuh"
#include "quantized_matmul/qmm_tiles.h"

using namespace mlx_backend_cuda;

namespace {

template <typename T, typename P, int BITS, int COLS, int ROWS, bool ALIGNED>
__device__ void qmv(
    const T* x,
    const uint32_t* w,
    const P* scales,
    const P* biases,
    T* out,
    int rows,
    int k_len,
    int n_len,
    int group_size) {
  const int n0 = (blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32) * COLS;
  if (n0 >= n_len) {
    return;
  }
  const QuantMatrix<P> mats[1] = {{w, scales, biases}};
  float acc[1][COLS][ROWS] = {};
  qmv_lane<T, P, BITS, 1, COLS, ROWS, ALIGNED>(x, mats, n0, n_len, rows, k_len, group_size, acc);
#pragma unroll
  for (int col = 0; col < COLS; col++) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      float v = warp_sum(acc[0][col][r]);
      if (threadIdx.x % 32 == 0 && r < rows && n0 + col < n_len) {
        out[static_cast<size_t>(r) * n_len + n0 + col] = from_f32<T>(v);
      }
    }
  }
}

} // namespace

#define QMV_KERNEL(XS, T, PS, P, BITS, ROWS, COLS)                                             \
  extern "C" __global__ void mlx_backend_qmv_##XS##_##PS##_b##BITS##_r##ROWS(                  \
      const T* x, const uint32_t* w, const P* scales, const P* biases, T* out, int rows,       \
      int k_len, int n_len, int group_size, bool vec) {                                        \
    if (vec) {                                                                                 \
      qmv<T, P, BITS, COLS, ROWS, true>(x, w, scales, biases, out, rows, k_len, n_len,         \
                                        group_size);                                           \
    } else {                                                                                   \
      qmv<T, P, BITS, COLS, ROWS, false>(x, w, scales, biases, out, rows, k_len, n_len,        \
                                         group_size);                                          \
    }                                                                                          \
  }

#define QMV_KERNELS_BITS(XS, T, PS, P, BITS) \
  QMV_KERNEL(XS, T, PS, P, BITS, 1, 1)       \
  QMV_KERNEL(XS, T, PS, P, BITS, 2, 2)       \
  QMV_KERNEL(XS, T, PS, P, BITS, 4, 4)

#define QMV_KERNELS(XS, T, PS, P)   \
  QMV_KERNELS_BITS(XS, T, PS, P, 4) \
  QMV_KERNELS_BITS(XS, T, PS, P, 8)

QMV_KERNELS(f32, float, f32, float)
QMV_KERNELS(f16, __half, f16, __half)
QMV_KERNELS(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
QMV_KERNELS(f32, float, f16, __half)
QMV_KERNELS(f32, float, bf16, __nv_bfloat16)

// The many-row kernels. The tile table (qmm_tiles.h) names the shapes the
// host launches; each instantiation below checks that it matches its entry.
namespace {

constexpr bool same_tile(const mlx_backend::qmm::Tile& t, int bm, int bn, int threads) {
  return t.bm == bm && t.bn == bn && t.threads == threads;
}

} // namespace

#define QMM_MMA_KERNEL(XS, T, BITS, IDX, BM, BN, WM, WN, TILE)                                \
  static_assert(same_tile(mlx_backend::qmm::kHalfTiles[IDX], BM, BN, 32 * WM * WN));         \
  extern "C" __global__ void __launch_bounds__(32 * WM * WN)                                  \
      mlx_backend_qmm_##XS##_##XS##_b##BITS##_##TILE(                                         \
          const T* x, const uint32_t* w, const T* scales, const T* biases, T* out, int rows, \
          int k_len, int n_len, int group_size, bool vec) {                                   \
    qmm_mma<T, BITS, BM, BN, WM, WN>(x, w, scales, biases, out, rows, k_len, n_len,           \
                                     group_size, vec);                                        \
  }

#define QMM_MMA_KERNELS_BITS(XS, T, BITS)                      \
  QMM_MMA_KERNEL(XS, T, BITS, 0, 64, 128, 2, 4, m64n128)       \
  QMM_MMA_KERNEL(XS, T, BITS, 1, 64, 64, 2, 2, m64n64)         \
  QMM_MMA_KERNEL(XS, T, BITS, 2, 32, 64, 2, 2, m32n64)

QMM_MMA_KERNELS_BITS(f16, __half, 4)
QMM_MMA_KERNELS_BITS(f16, __half, 8)
QMM_MMA_KERNELS_BITS(bf16, __nv_bfloat16, 4)
QMM_MMA_KERNELS_BITS(bf16, __nv_bfloat16, 8)

#define QMM_F32_KERNEL(PS, P, BITS, IDX, BM, BN, TILE)                                        \
  static_assert(same_tile(mlx_backend::qmm::kF32Tiles[IDX], BM, BN, (BM / 4) * (BN / 4)));   \
  extern "C" __global__ void __launch_bounds__((BM / 4) * (BN / 4))                           \
      mlx_backend_qmm_f32_##PS##_b##BITS##_##TILE(                                            \
          const float* x, const uint32_t* w, const P* scales, const P* biases, float* out,   \
          int rows, int k_len, int n_len, int group_size, bool vec) {                         \
    qmm_f32<P, BITS, BM, BN, 4, 4>(x, w, scales, biases, out, rows, k_len, n_len, group_size, \
                                   vec);                                                      \
  }

#define QMM_F32_KERNELS_BITS(PS, P, BITS)          \
  QMM_F32_KERNEL(PS, P, BITS, 0, 64, 64, m64n64)   \
  QMM_F32_KERNEL(PS, P, BITS, 1, 32, 64, m32n64)

#define QMM_F32_KERNELS(PS, P)     \
  QMM_F32_KERNELS_BITS(PS, P, 4)   \
  QMM_F32_KERNELS_BITS(PS, P, 8)

QMM_F32_KERNELS(f32, float)
QMM_F32_KERNELS(f16, __half)
QMM_F32_KERNELS(bf16, __nv_bfloat16)
