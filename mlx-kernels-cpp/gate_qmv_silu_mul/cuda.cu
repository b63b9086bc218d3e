// gate_qmv_silu_mul's CUDA bodies for decode-size batches (the contract is
// in mlx-backend/kernels/gate_qmv_silu_mul/mod.rs): both projections in one
// pass over x, then silu(g)·u with the unfused graph's roundings (each
// projection, the sigmoid, silu and the product round to the output dtype).
// The dense form computes every row of x per weight column; the
// expert-indexed form (mlx-lm's SwitchGLU) one (row, expert) pair per grid
// row, reading that expert's slice of the stacked weights.
#include "common/qmv.cuh"

using namespace mlx_backend_cuda;

namespace {

template <typename T>
__device__ __forceinline__ void store_swiglu(float g_acc, float u_acc, T* out, bool store) {
  const float g = warp_sum(g_acc);
  const float u = warp_sum(u_acc);
  if (store && threadIdx.x % 32 == 0) {
    *out = swiglu<T>(g, u);
  }
}

template <typename T, typename P, int BITS, int COLS, int ROWS, bool ALIGNED>
__device__ void gate_qmv(
    const T* x,
    const uint32_t* gw,
    const P* gs,
    const P* gb,
    const uint32_t* uw,
    const P* us,
    const P* ub,
    T* out,
    int rows,
    int k_len,
    int n_len,
    int group_size) {
  const int n0 = (blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32) * COLS;
  if (n0 >= n_len) {
    return;
  }
  const QuantMatrix<P> mats[2] = {{gw, gs, gb}, {uw, us, ub}};
  float acc[2][COLS][ROWS] = {};
  qmv_lane<T, P, BITS, 2, COLS, ROWS, ALIGNED>(x, mats, n0, n_len, rows, k_len, group_size, acc);
#pragma unroll
  for (int col = 0; col < COLS; col++) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      // Every lane takes part in the reductions; lane 0 of a real
      // (row, column) stores.
      store_swiglu(
          acc[0][col][r], acc[1][col][r], out + static_cast<size_t>(r) * n_len + n0 + col,
          r < rows && n0 + col < n_len);
    }
  }
}

// Grid row p computes out[p, :] = swiglu of x row p / top_k against expert
// indices[p]; an index past the stack poisons its row with NaN (the CPU
// body's error leaves NaN too).
template <typename T, typename P, int BITS, bool ALIGNED>
__device__ void gather_gate_qmv(
    const T* x,
    const uint32_t* indices,
    const uint32_t* gw,
    const P* gs,
    const P* gb,
    const uint32_t* uw,
    const P* us,
    const P* ub,
    T* out,
    int top_k,
    int experts,
    int k_len,
    int n_len,
    int group_size) {
  const int n = blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32;
  const int pair = blockIdx.y;
  if (n >= n_len) {
    return;
  }
  T* o = out + static_cast<size_t>(pair) * n_len + n;
  const uint32_t e = indices[pair];
  if (e >= static_cast<uint32_t>(experts)) {
    if (threadIdx.x % 32 == 0) {
      *o = from_f32<T>(__int_as_float(0x7fc00000));
    }
    return;
  }
  const size_t words = static_cast<size_t>(n_len) * (k_len * BITS / 32) * e;
  const size_t groups = static_cast<size_t>(n_len) * (k_len / group_size) * e;
  const QuantMatrix<P> mats[2] = {
      {gw + words, gs + groups, gb + groups}, {uw + words, us + groups, ub + groups}};
  float acc[2][1][1] = {};
  const T* xr = x + static_cast<size_t>(pair / top_k) * k_len;
  qmv_lane<T, P, BITS, 2, 1, 1, ALIGNED>(xr, mats, n, n_len, 1, k_len, group_size, acc);
  store_swiglu(acc[0][0][0], acc[1][0][0], o, true);
}

} // namespace

#define GATHER_GATE_KERNEL(XS, T, PS, P, BITS)                                                 \
  extern "C" __global__ void mlx_backend_gather_gate_qmv_##XS##_##PS##_b##BITS(                \
      const T* x, const uint32_t* indices, const uint32_t* gw, const P* gs, const P* gb,       \
      const uint32_t* uw, const P* us, const P* ub, T* out, int top_k, int experts, int k_len, \
      int n_len, int group_size, bool vec) {                                                   \
    if (vec) {                                                                                 \
      gather_gate_qmv<T, P, BITS, true>(                                                       \
          x, indices, gw, gs, gb, uw, us, ub, out, top_k, experts, k_len, n_len, group_size);  \
    } else {                                                                                   \
      gather_gate_qmv<T, P, BITS, false>(                                                      \
          x, indices, gw, gs, gb, uw, us, ub, out, top_k, experts, k_len, n_len, group_size);  \
    }                                                                                          \
  }

#define GATE_KERNEL(XS, T, PS, P, BITS, ROWS, COLS)                                            \
  extern "C" __global__ void mlx_backend_gate_qmv_##XS##_##PS##_b##BITS##_r##ROWS(             \
      const T* x, const uint32_t* gw, const P* gs, const P* gb, const uint32_t* uw,            \
      const P* us, const P* ub, T* out, int rows, int k_len, int n_len, int group_size,         \
      bool vec) {                                                                              \
    if (vec) {                                                                                 \
      gate_qmv<T, P, BITS, COLS, ROWS, true>(x, gw, gs, gb, uw, us, ub, out, rows, k_len,      \
                                             n_len, group_size);                               \
    } else {                                                                                   \
      gate_qmv<T, P, BITS, COLS, ROWS, false>(x, gw, gs, gb, uw, us, ub, out, rows, k_len,     \
                                              n_len, group_size);                              \
    }                                                                                          \
  }

#define GATE_KERNELS_BITS(XS, T, PS, P, BITS) \
  GATE_KERNEL(XS, T, PS, P, BITS, 1, 1)       \
  GATE_KERNEL(XS, T, PS, P, BITS, 2, 2)       \
  GATE_KERNEL(XS, T, PS, P, BITS, 4, 2)       \
  GATHER_GATE_KERNEL(XS, T, PS, P, BITS)

#define GATE_KERNELS(XS, T, PS, P)   \
  GATE_KERNELS_BITS(XS, T, PS, P, 4) \
  GATE_KERNELS_BITS(XS, T, PS, P, 8)

GATE_KERNELS(f32, float, f32, float)
GATE_KERNELS(f16, __half, f16, __half)
GATE_KERNELS(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
GATE_KERNELS(f32, float, f16, __half)
GATE_KERNELS(f32, float, bf16, __nv_bfloat16)
