// gate_qmv_silu_mul's CUDA body, dense form, decode-size batches (the
// contract is in mlx-backend/kernels/gate_qmv_silu_mul/mod.rs): both
// projections in one pass over x, then silu(g)·u with the unfused graph's
// roundings (each projection, the sigmoid, silu and the product round to
// the output dtype).
#include "common/qmv.cuh"

using namespace mlx_backend_cuda;

namespace {

template <typename T, typename P, int BITS, bool ALIGNED>
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
  const int n = blockIdx.x * kQmvWarpsPerBlock + threadIdx.x / 32;
  if (n >= n_len) {
    return;
  }
  const QuantMatrix<P> mats[2] = {{gw, gs, gb}, {uw, us, ub}};
  float acc[2][kQmvMaxRows] = {};
  qmv_lane<T, P, BITS, 2, ALIGNED>(x, mats, n, rows, k_len, group_size, acc);
#pragma unroll
  for (int r = 0; r < kQmvMaxRows; r++) {
    if (r >= rows) {
      break;
    }
    float g = round_to<T>(warp_sum(acc[0][r]));
    float u = round_to<T>(warp_sum(acc[1][r]));
    if (threadIdx.x % 32 == 0) {
      float sig = round_to<T>(1.0f / (1.0f + expf(-g)));
      float silu = round_to<T>(g * sig);
      out[static_cast<size_t>(r) * n_len + n] = from_f32<T>(silu * u);
    }
  }
}

} // namespace

#define GATE_KERNEL(XS, T, PS, P, BITS)                                                        \
  extern "C" __global__ void mlx_backend_gate_qmv_##XS##_##PS##_b##BITS(                       \
      const T* x, const uint32_t* gw, const P* gs, const P* gb, const uint32_t* uw,            \
      const P* us, const P* ub, T* out, int rows, int k_len, int n_len, int group_size,         \
      bool vec) {                                                                              \
    if (vec) {                                                                                 \
      gate_qmv<T, P, BITS, true>(x, gw, gs, gb, uw, us, ub, out, rows, k_len, n_len, group_size); \
    } else {                                                                                   \
      gate_qmv<T, P, BITS, false>(x, gw, gs, gb, uw, us, ub, out, rows, k_len, n_len,         \
                                  group_size);                                                 \
    }                                                                                          \
  }

#define GATE_KERNELS(XS, T, PS, P) \
  GATE_KERNEL(XS, T, PS, P, 4)     \
  GATE_KERNEL(XS, T, PS, P, 8)

GATE_KERNELS(f32, float, f32, float)
GATE_KERNELS(f16, __half, f16, __half)
GATE_KERNELS(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
GATE_KERNELS(f32, float, f16, __half)
GATE_KERNELS(f32, float, bf16, __nv_bfloat16)
