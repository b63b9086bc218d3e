#include "moe_combine/moe_combine.h"

#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/moe_combine/bridge.rs.h"
#if defined(MLX_BACKEND_CUDA)
#include "moe_combine/cuda.h"
#elif defined(MLX_BACKEND_METAL)
#include "moe_combine/metal.h"
#endif

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

std::string shape_str(const mx::Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + ")";
}

mx::Shape combined_shape(const array& y) {
  auto shape = y.shape();
  shape.erase(shape.end() - 2);
  return shape;
}

void check_contract(const array& y, const array& scores) {
  if (y.ndim() < 3) {
    throw std::invalid_argument(
        "moe_combine: y must have rank >= 3 ([..., top_k, hidden]), got shape " +
        shape_str(y.shape()));
  }
  auto expected = y.shape();
  expected.pop_back();
  if (scores.shape() != expected) {
    throw std::invalid_argument(
        "moe_combine: scores must have shape y.shape[:-1] = " + shape_str(expected) + ", got " +
        shape_str(scores.shape()));
  }
  if (!is_float(y.dtype()) || !is_float(scores.dtype())) {
    throw std::invalid_argument("moe_combine: y and scores must be float16, bfloat16 or float32");
  }
}

} // namespace

void MoeCombinePrimitive::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  DenseInput y(inputs[0], "moe_combine y");
  DenseInput scores(inputs[1], "moe_combine scores");
  auto& out = outputs[0];
  allocate(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(inputs[0]);
  enc.set_input_array(inputs[1]);
  enc.set_output_array(out);
  size_t hidden = inputs[0].shape(-1);
  size_t top_k = inputs[0].shape(-2);
  size_t rows = top_k * hidden == 0 ? 0 : inputs[0].size() / (top_k * hidden);
  enc.dispatch([y, scores, out, rows, top_k, hidden]() mutable {
    y.fill();
    scores.fill();
    if (!moe_combine_cpu(
            static_cast<int32_t>(y.get().dtype().val()),
            static_cast<int32_t>(scores.get().dtype().val()), bytes_of(y.get()),
            bytes_of(scores.get()), bytes_of_mut(out), rows, top_k, hidden)) {
      poison(out);
    }
  });
}

std::vector<mx::Shape> MoeCombinePrimitive::output_shapes(const std::vector<array>& inputs) {
  return {combined_shape(inputs[0])};
}

array moe_combine_op(const array& y, const array& scores, bool fused, mx::Stream s) {
  check_contract(y, scores);
  Fallback fallback = [s](std::vector<array> in) {
    auto out_dtype = in[0].dtype();
    auto y32 = mx::astype(in[0], mx::float32, s);
    auto s32 = mx::expand_dims(mx::astype(in[1], mx::float32, s), -1, s);
    auto sum = mx::sum(mx::multiply(y32, s32, s), -2, false, s);
    return std::vector<array>{mx::astype(sum, out_dtype, s)};
  };
  if (!fused) {
    return fallback({y, scores})[0];
  }
  auto primitive = std::make_shared<MoeCombinePrimitive>(s, std::move(fallback));
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY("moe_combine", moe_combine_cuda(), moe_combine_metal()));
    return array(
        combined_shape(y), y.dtype(), primitive, {dense_input(y, s), dense_input(scores, s)});
  }
  // Views are made dense inside eval_cpu (DenseInput): one graph node.
  return array(combined_shape(y), y.dtype(), primitive, {y, scores});
}

ArrayPtr kernel_moe_combine(const array& y, const array& scores, bool fused, StreamSpec s) {
  return wrap(moe_combine_op(y, scores, fused, to_stream(s)));
}

} // namespace mlx_backend
