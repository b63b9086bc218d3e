#include "gate_qmv_silu_mul/gate_qmv_silu_mul.h"

#include "mlx-backend/mlx-backend/ffi.rs.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("gate_qmv_silu_mul: " + msg);
}

std::string shape_str(const mx::Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + ")";
}

// Checks one [weight, scales, biases] triple against x's K; `lead` is the
// expected leading shape of the weight ([N] dense, [E, N] indexed, N taken
// from the weight itself when 0).
int check_matrix(
    const char* what,
    const std::vector<array>& q,
    int k,
    int group_size,
    int bits,
    mx::Shape lead) {
  if (q.size() != 3) {
    fail(std::string(what) + " must be [weight, scales, biases]");
  }
  const auto& w = q[0];
  if (w.dtype() != mx::uint32) {
    fail(std::string(what) + " weight must be uint32 (packed), got another dtype");
  }
  if (w.ndim() != lead.size() + 1) {
    fail(std::string(what) + " weight must have rank " + std::to_string(lead.size() + 1) +
         ", got shape " + shape_str(w.shape()));
  }
  for (size_t i = 0; i < lead.size(); ++i) {
    if (lead[i] != 0 && w.shape(i) != lead[i]) {
      fail(std::string(what) + " weight shape " + shape_str(w.shape()) +
           " does not match the other projection");
    }
  }
  if (static_cast<int64_t>(w.shape(-1)) * 32 != static_cast<int64_t>(k) * bits) {
    fail(std::string(what) + " weight has " + std::to_string(w.shape(-1)) +
         " packed words per row; K = " + std::to_string(k) + " at " + std::to_string(bits) +
         " bits needs " + std::to_string(k * bits / 32));
  }
  auto gshape = w.shape();
  gshape.back() = k / group_size;
  for (int i = 1; i < 3; ++i) {
    if (q[i].shape() != gshape) {
      fail(std::string(what) + (i == 1 ? " scales" : " biases") + " must have shape " +
           shape_str(gshape) + ", got " + shape_str(q[i].shape()));
    }
    if (!is_float(q[i].dtype())) {
      fail(std::string(what) + " scales and biases must be float");
    }
  }
  return w.shape(-2);
}

int check_common(const array& x, int group_size, int bits) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
    fail("bits must be one of 2, 3, 4, 5, 6, 8 (MLX affine), got " + std::to_string(bits));
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    fail("group size must be 32, 64 or 128, got " + std::to_string(group_size));
  }
  if (x.ndim() < 1 || !is_float(x.dtype())) {
    fail("x must be a float array of rank >= 1");
  }
  int k = x.shape(-1);
  if (k % group_size != 0) {
    fail("K = " + std::to_string(k) + " is not a multiple of the group size " +
         std::to_string(group_size));
  }
  return k;
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
  for (const auto& in : inputs) {
    require_row_contiguous(in, "gate_qmv_silu_mul input");
  }
  auto& out = outputs[0];
  allocate(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
  }
  enc.set_output_array(out);
  const auto& x = inputs[0];
  size_t k = x.shape(-1);
  size_t base = indexed_ ? 2 : 1;
  size_t n = inputs[base].shape(-2);
  uint32_t bits = bits_;
  size_t group = group_size_;
  if (!indexed_) {
    size_t m = x.size() / k;
    enc.dispatch([inputs, out, m, n, k, bits, group]() mutable {
      auto words = [&](size_t i) {
        return rust::Slice<const uint32_t>(inputs[i].data<uint32_t>(), inputs[i].size());
      };
      if (!gate_qmv_silu_mul_cpu(
              static_cast<int32_t>(inputs[0].dtype().val()), bytes_of(inputs[0]), words(1),
              bytes_of(inputs[2]), bytes_of(inputs[3]), words(4), bytes_of(inputs[5]),
              bytes_of(inputs[6]), bits, group, bytes_of_mut(out), m, n, k)) {
        poison(out);
      }
    });
    return;
  }
  size_t top_k = inputs[1].shape(-1);
  size_t experts = inputs[2].shape(0);
  enc.dispatch([inputs, out, n, k, top_k, experts, bits, group]() mutable {
    auto words = [&](size_t i) {
      return rust::Slice<const uint32_t>(inputs[i].data<uint32_t>(), inputs[i].size());
    };
    // Output row i reads x row i / top_k with expert indices[i].
    std::vector<uint32_t> x_row_for(inputs[1].size());
    for (size_t i = 0; i < x_row_for.size(); ++i) {
      x_row_for[i] = static_cast<uint32_t>(i / top_k);
    }
    if (!gather_gate_qmv_silu_mul_cpu(
            static_cast<int32_t>(inputs[0].dtype().val()), bytes_of(inputs[0]),
            rust::Slice<const uint32_t>(x_row_for.data(), x_row_for.size()), words(1), words(2),
            bytes_of(inputs[3]), bytes_of(inputs[4]), words(5), bytes_of(inputs[6]),
            bytes_of(inputs[7]), bits, group, experts, bytes_of_mut(out), n, k)) {
      poison(out);
    }
  });
}

bool GateQmvSiluMulPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const GateQmvSiluMulPrimitive*>(&other);
  return o && o->group_size_ == group_size_ && o->bits_ == bits_ && o->indexed_ == indexed_;
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
    bool fused,
    mx::Stream s) {
  int k = check_common(x, group_size, bits);
  int n = check_matrix("gate", gate, k, group_size, bits, {0});
  check_matrix("up", up, k, group_size, bits, {n});
  Fallback fallback = [group_size, bits, s](std::vector<array> in) {
    auto g = mx::quantized_matmul(in[0], in[1], in[2], in[3], true, group_size, bits, "affine", s);
    auto u = mx::quantized_matmul(in[0], in[4], in[5], in[6], true, group_size, bits, "affine", s);
    return std::vector<array>{swiglu(g, u, s)};
  };
  auto inputs = concat(concat({x}, gate), up);
  if (!fused) {
    return fallback(inputs)[0];
  }
  for (auto& in : inputs) {
    in = mx::contiguous(in, false, s);
  }
  auto shape = x.shape();
  shape.back() = n;
  return array(
      shape,
      x.dtype(),
      std::make_shared<GateQmvSiluMulPrimitive>(s, fallback, group_size, bits, false),
      inputs);
}

array gather_gate_qmv_silu_mul_op(
    const array& x,
    const array& indices,
    const std::vector<array>& gate,
    const std::vector<array>& up,
    int group_size,
    int bits,
    bool fused,
    mx::Stream s) {
  int k = check_common(x, group_size, bits);
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
  int n = check_matrix("gate", gate, k, group_size, bits, {0, 0});
  check_matrix("up", up, k, group_size, bits, {gate[0].shape(0), n});
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
    in = mx::contiguous(in, false, s);
  }
  auto shape = indices.shape();
  shape.push_back(n);
  return array(
      shape,
      x.dtype(),
      std::make_shared<GateQmvSiluMulPrimitive>(s, fallback, group_size, bits, true),
      inputs);
}

ArrayPtr kernel_gate_qmv_silu_mul(
    const array& x,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    bool fused,
    StreamSpec s) {
  return wrap(gate_qmv_silu_mul_op(x, gate.items, up.items, group_size, bits, fused, to_stream(s)));
}

ArrayPtr kernel_gather_gate_qmv_silu_mul(
    const array& x,
    const array& indices,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    bool fused,
    StreamSpec s) {
  return wrap(gather_gate_qmv_silu_mul_op(
      x, indices, gate.items, up.items, group_size, bits, fused, to_stream(s)));
}

} // namespace mlx_backend
