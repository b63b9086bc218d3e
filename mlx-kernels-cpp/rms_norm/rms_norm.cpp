#include "rms_norm/rms_norm.h"

#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/rms_norm/bridge.rs.h"
#if defined(MLX_BACKEND_CUDA)
#include "rms_norm/cuda.h"
#elif defined(MLX_BACKEND_METAL)
#include "rms_norm/metal.h"
#endif

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

void check_contract(const array& x, const array& w, const char* op) {
  if (x.ndim() < 1) {
    throw std::invalid_argument(std::string(op) + ": x must have rank >= 1, got a scalar");
  }
  if (!is_float(x.dtype()) || !is_float(w.dtype())) {
    throw std::invalid_argument(std::string(op) + ": x and weight must be float16, bfloat16 or float32");
  }
  if (w.ndim() != 1 || w.shape(0) != x.shape(-1)) {
    throw std::invalid_argument(
        std::string(op) + ": weight must have shape [" + std::to_string(x.shape(-1)) +
        "] (the last axis of x), got " + std::to_string(w.ndim()) + "-d of length " +
        std::to_string(w.ndim() ? w.shape(-1) : 1));
  }
}

size_t rows_of(const array& x) {
  return x.size() / static_cast<size_t>(x.shape(-1));
}

} // namespace

void RmsNormPrimitive::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  DenseInput x(inputs[0], "rms_norm x");
  DenseInput w(inputs[1], "rms_norm weight");
  auto& out = outputs[0];
  allocate(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(inputs[0]);
  enc.set_input_array(inputs[1]);
  enc.set_output_array(out);
  size_t hidden = inputs[0].shape(-1);
  size_t rows = rows_of(inputs[0]);
  enc.dispatch([x, w, out, rows, hidden, eps = eps_]() mutable {
    x.fill();
    w.fill();
    if (!rms_norm_cpu(
            static_cast<int32_t>(out.dtype().val()), bytes_of(x.get()), bytes_of(w.get()),
            bytes_of_mut(out), rows, hidden, eps)) {
      poison(out);
    }
  });
}

bool RmsNormPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const RmsNormPrimitive*>(&other);
  return o && o->eps_ == eps_;
}

std::vector<mx::Shape> RmsNormPrimitive::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape()};
}

void RmsNormResidualPrimitive::eval_cpu(
    const std::vector<array>& inputs,
    std::vector<array>& outputs) {
  DenseInput x(inputs[0], "rms_norm_residual x");
  DenseInput r(inputs[1], "rms_norm_residual residual");
  DenseInput w(inputs[2], "rms_norm_residual weight");
  auto& normed = outputs[0];
  auto& sum = outputs[1];
  allocate(normed);
  allocate(sum);
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(inputs[0]);
  enc.set_input_array(inputs[1]);
  enc.set_input_array(inputs[2]);
  enc.set_output_array(normed);
  enc.set_output_array(sum);
  size_t hidden = inputs[0].shape(-1);
  size_t rows = rows_of(inputs[0]);
  enc.dispatch([x, r, w, normed, sum, rows, hidden, eps = eps_]() mutable {
    x.fill();
    r.fill();
    w.fill();
    if (!rms_norm_residual_cpu(
            static_cast<int32_t>(normed.dtype().val()), bytes_of(x.get()), bytes_of(r.get()),
            bytes_of(w.get()), bytes_of_mut(normed), bytes_of_mut(sum), rows, hidden, eps)) {
      poison(normed);
      poison(sum);
    }
  });
}

bool RmsNormResidualPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const RmsNormResidualPrimitive*>(&other);
  return o && o->eps_ == eps_;
}

std::vector<mx::Shape> RmsNormResidualPrimitive::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape(), inputs[0].shape()};
}

array rms_norm_op(const array& x, const array& w, float eps, bool fused, mx::Stream s) {
  check_contract(x, w, "rms_norm");
  Fallback fallback = [eps, s](std::vector<array> in) {
    return std::vector<array>{mx::fast::rms_norm(in[0], in[1], eps, s)};
  };
  if (!fused) {
    return fallback({x, w})[0];
  }
  auto primitive = std::make_shared<RmsNormPrimitive>(s, std::move(fallback), eps);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY("rms_norm", rms_norm_cuda(eps), rms_norm_metal(eps)));
    return array(x.shape(), x.dtype(), primitive, {dense_input(x, s), dense_input(w, s)});
  }
  // Views are made dense inside eval_cpu (DenseInput), so the graph holds
  // one node, not one per input plus the kernel.
  return array(x.shape(), x.dtype(), primitive, {x, w});
}

std::vector<array> rms_norm_residual_op(
    const array& x,
    const array& residual,
    const array& w,
    float eps,
    bool fused,
    mx::Stream s) {
  check_contract(x, w, "rms_norm_residual");
  if (residual.shape() != x.shape()) {
    throw std::invalid_argument("rms_norm_residual: residual must have the shape of x");
  }
  Fallback fallback = [eps, s](std::vector<array> in) {
    auto sum = mx::add(in[0], in[1], s);
    return std::vector<array>{mx::fast::rms_norm(sum, in[2], eps, s), sum};
  };
  if (!fused) {
    return fallback({x, residual, w});
  }
  auto primitive = std::make_shared<RmsNormResidualPrimitive>(s, std::move(fallback), eps);
  std::vector<array> inputs{x, residual, w};
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(
        MLX_BACKEND_GPU_BODY(
            "rms_norm_residual", rms_norm_residual_cuda(eps), rms_norm_residual_metal(eps)));
    for (auto& in : inputs) {
      in = dense_input(in, s);
    }
  }
  return array::make_arrays({x.shape(), x.shape()}, {x.dtype(), x.dtype()}, primitive, inputs);
}

ArrayPtr kernel_rms_norm(const array& x, const array& w, float eps, bool fused, StreamSpec s) {
  return wrap(rms_norm_op(x, w, eps, fused, to_stream(s)));
}

std::unique_ptr<ArrayList> kernel_rms_norm_residual(
    const array& x,
    const array& residual,
    const array& w,
    float eps,
    bool fused,
    StreamSpec s) {
  auto out = std::make_unique<ArrayList>();
  out->items = rms_norm_residual_op(x, residual, w, eps, fused, to_stream(s));
  return out;
}

} // namespace mlx_backend
