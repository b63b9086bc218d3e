#include "gate_qmv_silu_mul/gate_qmv_silu_mul.h"

#include "common/affine_qmm.h"
#include "common/quant_check.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/gate_qmv_silu_mul/bridge.rs.h"
#if defined(MLX_BACKEND_CUDA)
#include "quantized_matmul/cuda.h"
#elif defined(MLX_BACKEND_METAL)
#include "quantized_matmul/metal.h"
#endif

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr const char* kOp = "gate_qmv_silu_mul";

[[noreturn]] void fail(const std::string& msg) {
  quant_fail(kOp, msg);
}

array swiglu(const array& g, const array& u, mx::Stream s) {
  // As mlx.nn.silu: g * sigmoid(g), then the product; each op rounds.
  return mx::multiply(mx::multiply(g, mx::sigmoid(g, s), s), u, s);
}

std::vector<array> concat(std::vector<array> a, const std::vector<array>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

} // namespace

void GateQmvSiluMulPrimitive::eval_cpu(
    const std::vector<array>& inputs,
    std::vector<array>& outputs) {
  auto& out = outputs[0];
  auto& enc = begin_dense_eval(stream(), inputs, out, "gate_qmv_silu_mul input");
  const auto& x = inputs[0];
  size_t k = x.shape(-1);
  size_t base = indexed_ ? 2 : 1;
  size_t n = inputs[base].shape(-2);
  uint32_t bits = bits_;
  size_t group = group_size_;
  int32_t activations = activations_;
  if (!indexed_) {
    size_t m = x.size() / k;
    enc.dispatch([inputs, out, m, n, k, bits, group, activations]() mutable {
      auto words = [&](size_t i) {
        return rust::Slice<const uint32_t>(inputs[i].data<uint32_t>(), inputs[i].size());
      };
      if (!gate_qmv_silu_mul_cpu(
              static_cast<int32_t>(inputs[0].dtype().val()),
              static_cast<int32_t>(inputs[2].dtype().val()), bytes_of(inputs[0]), words(1),
              bytes_of(inputs[2]), bytes_of(inputs[3]), words(4), bytes_of(inputs[5]),
              bytes_of(inputs[6]), bits, group, bytes_of_mut(out), m, n, k, activations)) {
        poison(out);
      }
    });
    return;
  }
  size_t top_k = inputs[1].shape(-1);
  size_t experts = inputs[2].shape(0);
  enc.dispatch([inputs, out, n, k, top_k, experts, bits, group, activations]() mutable {
    auto words = [&](size_t i) {
      return rust::Slice<const uint32_t>(inputs[i].data<uint32_t>(), inputs[i].size());
    };
    // Output row i reads x row i / top_k with expert indices[i].
    std::vector<uint32_t> x_row_for(inputs[1].size());
    for (size_t i = 0; i < x_row_for.size(); ++i) {
      x_row_for[i] = static_cast<uint32_t>(i / top_k);
    }
    if (!gather_gate_qmv_silu_mul_cpu(
            static_cast<int32_t>(inputs[0].dtype().val()),
            static_cast<int32_t>(inputs[3].dtype().val()), bytes_of(inputs[0]),
            rust::Slice<const uint32_t>(x_row_for.data(), x_row_for.size()), words(1), words(2),
            bytes_of(inputs[3]), bytes_of(inputs[4]), words(5), bytes_of(inputs[6]),
            bytes_of(inputs[7]), bits, group, experts, bytes_of_mut(out), n, k, activations)) {
      poison(out);
    }
  });
}

bool GateQmvSiluMulPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const GateQmvSiluMulPrimitive*>(&other);
  return o && o->group_size_ == group_size_ && o->bits_ == bits_ &&
      o->activations_ == activations_ && o->indexed_ == indexed_;
}

std::vector<mx::Shape> GateQmvSiluMulPrimitive::output_shapes(const std::vector<array>& inputs) {
  auto shape = indexed_ ? inputs[1].shape() : inputs[0].shape();
  int n = inputs[indexed_ ? 2 : 1].shape(-2);
  if (indexed_) {
    shape.push_back(n);
  } else {
    shape.back() = n;
  }
  return {shape};
}

array gate_qmv_silu_mul_op(
    const array& x,
    const std::vector<array>& gate,
    const std::vector<array>& up,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mx::Stream s) {
  int k = check_quant_x(kOp, x, group_size, bits);
  int n = check_quant_matrix(kOp, "gate", gate, k, group_size, bits, {0});
  check_quant_matrix(kOp, "up", up, k, group_size, bits, {n});
  Fallback fallback = [group_size, bits, s](std::vector<array> in) {
    auto g = affine_quantized_matmul(in[0], in[1], in[2], in[3], true, group_size, bits, s);
    auto u = affine_quantized_matmul(in[0], in[4], in[5], in[6], true, group_size, bits, s);
    return std::vector<array>{swiglu(g, u, s)};
  };
  auto inputs = concat(concat({x}, gate), up);
  if (!fused) {
    return fallback(inputs)[0];
  }
  for (auto& in : inputs) {
    in = dense_input(in, s);
  }
  auto shape = x.shape();
  shape.back() = n;
  auto primitive =
      std::make_shared<GateQmvSiluMulPrimitive>(s, fallback, group_size, bits, activations, false);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY(
        "gate_qmv_silu_mul", gate_qmv_silu_mul_cuda(group_size, bits),
        gate_qmv_silu_mul_metal(group_size, bits)));
  }
  return array(shape, x.dtype(), primitive, inputs);
}

array gather_gate_qmv_silu_mul_op(
    const array& x,
    const array& indices,
    const std::vector<array>& gate,
    const std::vector<array>& up,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mx::Stream s) {
  int k = check_quant_x(kOp, x, group_size, bits);
  if (!mx::issubdtype(indices.dtype(), mx::integer)) {
    fail("indices must be an integer array");
  }
  auto lead = x.shape();
  lead.pop_back();
  auto idx_lead = indices.shape();
  if (indices.ndim() < 1 || (idx_lead.pop_back(), idx_lead != lead)) {
    fail("indices must have shape x.shape[:-1] + [top_k] = " + shape_str(lead) +
         " + [top_k], got " + shape_str(indices.shape()));
  }
  if (gate.size() == 3 && gate[0].ndim() != 3) {
    fail("expert weights must be stacked [E, N, K * bits / 32], got shape " +
         shape_str(gate[0].shape()));
  }
  int n = check_quant_matrix(kOp, "gate", gate, k, group_size, bits, {0, 0});
  check_quant_matrix(kOp, "up", up, k, group_size, bits, {gate[0].shape(0), n});
  auto idx = mx::astype(indices, mx::uint32, s);
  Fallback fallback = [group_size, bits, s](std::vector<array> in) {
    // mlx-lm's SwitchGLU: x [..., 1, 1, K] against experts chosen per row.
    auto xe = mx::expand_dims(in[0], {-2, -3}, s);
    auto proj = [&](size_t w) {
      auto y = mx::gather_qmm(
          xe, in[w], in[w + 1], in[w + 2], std::nullopt, in[1], true, group_size, bits, "affine",
          std::nullopt, false, s);
      return mx::squeeze(y, -2, s);
    };
    return std::vector<array>{swiglu(proj(2), proj(5), s)};
  };
  auto inputs = concat(concat({x, idx}, gate), up);
  if (!fused) {
    return fallback(inputs)[0];
  }
  for (auto& in : inputs) {
    in = dense_input(in, s);
  }
  auto shape = indices.shape();
  shape.push_back(n);
  auto primitive =
      std::make_shared<GateQmvSiluMulPrimitive>(s, fallback, group_size, bits, activations, true);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY(
        "gather_gate_qmv_silu_mul", gather_gate_qmv_silu_mul_cuda(group_size, bits),
        gather_gate_qmv_silu_mul_metal(group_size, bits)));
  }
  return array(shape, x.dtype(), primitive, inputs);
}

ArrayPtr kernel_gate_qmv_silu_mul(
    const array& x,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s) {
  return wrap(gate_qmv_silu_mul_op(
      x, gate.items, up.items, group_size, bits, activations, fused, to_stream(s)));
}

ArrayPtr kernel_gather_gate_qmv_silu_mul(
    const array& x,
    const array& indices,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s) {
  return wrap(gather_gate_qmv_silu_mul_op(
      x, indices, gate.items, up.items, group_size, bits, activations, fused, to_stream(s)));
}

} // namespace mlx_backend
