// RMSNorm's CUDA body (the contract is in mlx-backend/kernels/rms_norm/mod.rs):
// one block per row, f32 accumulation, 16-byte loads when the row allows.
// Modelled on MLX's backend/cuda/rms_norm.cu (block reduction of x², then a
// second pass that scales and writes).
#include "common/cuda_common.cuh"

using namespace mlx_backend_cuda;

namespace {

// Σ x² over one row, in f32.
template <typename T, int N>
__device__ float row_sum_squares(const T* x, int hidden) {
  float ss = 0.0f;
  const auto* xv = reinterpret_cast<const Vec<T, N>*>(x);
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    Vec<T, N> a = xv[i];
#pragma unroll
    for (int j = 0; j < N; j++) {
      float v = to_f32(a.v[j]);
      ss += v * v;
    }
  }
  return ss;
}

template <typename T, int N>
__device__ void scale_row(const T* x, const T* w, T* out, float scale, int hidden) {
  const auto* xv = reinterpret_cast<const Vec<T, N>*>(x);
  const auto* wv = reinterpret_cast<const Vec<T, N>*>(w);
  auto* ov = reinterpret_cast<Vec<T, N>*>(out);
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    Vec<T, N> a = xv[i];
    Vec<T, N> b = wv[i];
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; j++) {
      o.v[j] = from_f32<T>(to_f32(a.v[j]) * scale * to_f32(b.v[j]));
    }
    ov[i] = o;
  }
}

// N is the vector width when hidden is a multiple of it, else 1.
template <typename T, int N>
__device__ void rms_norm_rows(
    const T* x,
    const T* w,
    T* out,
    float eps,
    int rows,
    int hidden) {
  __shared__ float scratch[32];
  int row = blockIdx.x;
  if (row >= rows) {
    return;
  }
  const T* xr = x + static_cast<size_t>(row) * hidden;
  float ss = block_sum(row_sum_squares<T, N>(xr, hidden), scratch);
  float scale = rsqrtf(ss / static_cast<float>(hidden) + eps);
  scale_row<T, N>(xr, w, out + static_cast<size_t>(row) * hidden, scale, hidden);
}

// sum = x + residual (rounded to T, as the unfused add), then its norm.
template <typename T, int N>
__device__ void rms_norm_residual_rows(
    const T* x,
    const T* r,
    const T* w,
    T* normed,
    T* sum,
    float eps,
    int rows,
    int hidden) {
  __shared__ float scratch[32];
  int row = blockIdx.x;
  if (row >= rows) {
    return;
  }
  size_t base = static_cast<size_t>(row) * hidden;
  const auto* xv = reinterpret_cast<const Vec<T, N>*>(x + base);
  const auto* rv = reinterpret_cast<const Vec<T, N>*>(r + base);
  auto* sv = reinterpret_cast<Vec<T, N>*>(sum + base);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    Vec<T, N> a = xv[i];
    Vec<T, N> b = rv[i];
    Vec<T, N> s;
#pragma unroll
    for (int j = 0; j < N; j++) {
      s.v[j] = from_f32<T>(to_f32(a.v[j]) + to_f32(b.v[j]));
      float v = to_f32(s.v[j]);
      ss += v * v;
    }
    sv[i] = s;
  }
  ss = block_sum(ss, scratch);
  float scale = rsqrtf(ss / static_cast<float>(hidden) + eps);
  // Each thread re-reads only the sums it wrote itself: no barrier needed.
  scale_row<T, N>(sum + base, w, normed + base, scale, hidden);
}

} // namespace

#define RMS_NORM_KERNELS(SUFFIX, T)                                                          \
  extern "C" __global__ void mlx_backend_rms_norm_##SUFFIX(                                  \
      const T* x, const T* w, T* out, float eps, int rows, int hidden, bool vec) {           \
    if (vec) {                                                                               \
      rms_norm_rows<T, vec_width<T>()>(x, w, out, eps, rows, hidden);                        \
    } else {                                                                                 \
      rms_norm_rows<T, 1>(x, w, out, eps, rows, hidden);                                     \
    }                                                                                        \
  }                                                                                          \
  extern "C" __global__ void mlx_backend_rms_norm_residual_##SUFFIX(                         \
      const T* x, const T* r, const T* w, T* normed, T* sum, float eps, int rows, int hidden, \
      bool vec) {                                                                            \
    if (vec) {                                                                               \
      rms_norm_residual_rows<T, vec_width<T>()>(x, r, w, normed, sum, eps, rows, hidden);    \
    } else {                                                                                 \
      rms_norm_residual_rows<T, 1>(x, r, w, normed, sum, eps, rows, hidden);                 \
    }                                                                                        \
  }

RMS_NORM_KERNELS(f32, float)
RMS_NORM_KERNELS(f16, __half)
RMS_NORM_KERNELS(bf16, __nv_bfloat16)
