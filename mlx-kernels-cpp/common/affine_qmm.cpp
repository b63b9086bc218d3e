#include "common/affine_qmm.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

bool mlx_cuda_qmm_is_wrong(const array& x, int group_size, const mx::Stream& s) {
#if defined(MLX_BACKEND_CUDA)
  return s.device == mx::Device::gpu && x.ndim() > 0 && x.shape(-1) <= group_size;
#else
  (void)x;
  (void)group_size;
  (void)s;
  return false;
#endif
}

} // namespace

array affine_quantized_matmul(
    const array& x,
    const array& w,
    const array& scales,
    const std::optional<array>& biases,
    bool transpose,
    int group_size,
    int bits,
    mx::Stream s) {
  if (!biases || !transpose || !mlx_cuda_qmm_is_wrong(x, group_size, s)) {
    return mx::quantized_matmul(x, w, scales, biases, transpose, group_size, bits, "affine", s);
  }
  auto dtype = mx::promote_types(x.dtype(), scales.dtype());
  auto dense =
      mx::dequantize(w, scales, biases, group_size, bits, "affine", std::nullopt, dtype, s);
  return mx::matmul(x, mx::swapaxes(dense, -1, -2, s), s);
}

} // namespace mlx_backend
