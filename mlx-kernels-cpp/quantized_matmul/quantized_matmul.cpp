#include "quantized_matmul/quantized_matmul.h"

#include "common/affine_qmm.h"
#include "common/quant_check.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/quantized_matmul/bridge.rs.h"
#if defined(MLX_BACKEND_CUDA)
#include "quantized_matmul/cuda.h"
#elif defined(MLX_BACKEND_METAL)
#include "quantized_matmul/metal.h"
#endif

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr const char* kOp = "quantized_matmul";

} // namespace

void QuantizedMatmulPrimitive::eval_cpu(
    const std::vector<array>& inputs,
    std::vector<array>& outputs) {
  auto& out = outputs[0];
  auto& enc = begin_dense_eval(stream(), inputs, out, "quantized_matmul input");
  size_t k = inputs[0].shape(-1);
  size_t n = inputs[1].shape(-2);
  size_t m = k == 0 ? 0 : inputs[0].size() / k;
  uint32_t bits = bits_;
  size_t group = group_size_;
  int32_t activations = activations_;
  enc.dispatch([inputs, out, m, n, k, bits, group, activations]() mutable {
    rust::Slice<const uint32_t> w(inputs[1].data<uint32_t>(), inputs[1].size());
    if (!quantized_matmul_cpu(
            static_cast<int32_t>(inputs[0].dtype().val()),
            static_cast<int32_t>(inputs[2].dtype().val()), bytes_of(inputs[0]), w,
            bytes_of(inputs[2]), bytes_of(inputs[3]), bits, group, bytes_of_mut(out), m, n, k,
            activations)) {
      poison(out);
    }
  });
}

bool QuantizedMatmulPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const QuantizedMatmulPrimitive*>(&other);
  return o && o->group_size_ == group_size_ && o->bits_ == bits_ &&
      o->activations_ == activations_;
}

std::vector<mx::Shape> QuantizedMatmulPrimitive::output_shapes(const std::vector<array>& inputs) {
  auto shape = inputs[0].shape();
  shape.back() = inputs[1].shape(-2);
  return {shape};
}

array quantized_matmul_op(
    const array& x,
    const std::vector<array>& w,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mx::Stream s) {
  int k = check_quant_x(kOp, x, group_size, bits);
  int n = check_quant_matrix(kOp, "w", w, k, group_size, bits, {0});
  Fallback fallback = [group_size, bits, s](std::vector<array> in) {
    return std::vector<array>{
        affine_quantized_matmul(in[0], in[1], in[2], in[3], true, group_size, bits, s)};
  };
  std::vector<array> inputs{x, w[0], w[1], w[2]};
  if (!fused) {
    return fallback(inputs)[0];
  }
  for (auto& in : inputs) {
    in = dense_input(in, s);
  }
  auto shape = x.shape();
  shape.back() = n;
  // As MLX: the result type promotes x with the scales (f32 x, f16 scales → f32).
  auto primitive =
      std::make_shared<QuantizedMatmulPrimitive>(s, fallback, group_size, bits, activations);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY(
        "quantized_matmul", quantized_matmul_cuda(group_size, bits),
        quantized_matmul_metal(group_size, bits)));
  }
  return array(shape, mx::promote_types(x.dtype(), w[1].dtype()), primitive, inputs);
}

ArrayPtr kernel_quantized_matmul(
    const array& x,
    const ArrayList& w,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s) {
  return wrap(
      quantized_matmul_op(x, w.items, group_size, bits, activations, fused, to_stream(s)));
}

} // namespace mlx_backend
