// quantized_matmul's CUDA body for decode-size batches (the contract is in
// mlx-backend/kernels/quantized_matmul/mod.rs): out[r, n] = Σ_k x[r, k]·w[n, k]
// for up to kQmvMaxRows rows, f32 accumulation, one rounding to the output
// dtype (x's, which the eligibility makes the promoted type).
#include "common/qmv.cuh"

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
