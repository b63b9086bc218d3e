#include "attention/attention.h"

#include <array>
#include <optional>

#include "attention/cuda.h"
#include "attention/metal.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/attention/bridge.rs.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

void check_contract(const array& q, const array& k, const array& v) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    throw std::invalid_argument("attention: q, k and v must be 4-D [B, H, L, D]");
  }
  if (k.shape() != v.shape()) {
    throw std::invalid_argument("attention: k and v must have one shape");
  }
  if (q.shape(0) != k.shape(0) || q.shape(3) != k.shape(3)) {
    throw std::invalid_argument("attention: q and k must agree on batch and head_dim");
  }
  if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0) {
    throw std::invalid_argument(
        "attention: query heads must be a multiple of key/value heads");
  }
  if (!is_float(q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    throw std::invalid_argument("attention: q, k and v must share one float dtype");
  }
}

// Whether the kernel can read `a` through its strides: rows (the last
// axis) dense and no negative stride. The KV cache's slices and the heads'
// transpose qualify, so they are read in place.
bool rows_dense(const array& a) {
  for (auto st : a.strides()) {
    if (st < 0) {
      return false;
    }
  }
  return a.shape(3) <= 1 || a.strides(3) == 1;
}

// An input as the kernel reads it: in place when rows_dense, else a dense copy.
class StridedInput {
 public:
  StridedInput(const array& a, const char* what) : src_(a) {
    if (!rows_dense(a)) {
      dense_.emplace(a, what);
    }
  }
  void fill() {
    if (dense_) {
      dense_->fill();
    }
  }
  const array& get() const {
    return dense_ ? dense_->get() : src_;
  }
  // The elements the view spans from its first one, as bytes.
  rust::Slice<const uint8_t> bytes() const {
    const auto& a = get();
    size_t span = 0;
    if (a.size() > 0) {
      span = 1;
      for (size_t i = 0; i < a.ndim(); ++i) {
        span += static_cast<size_t>(a.shape(i) - 1) * static_cast<size_t>(a.strides(i));
      }
    }
    return rust::Slice<const uint8_t>(a.data<uint8_t>(), span * a.itemsize());
  }
  // Element strides of batch, head and row.
  std::array<size_t, 3> strides() const {
    const auto& a = get();
    return {
        static_cast<size_t>(a.strides(0)), static_cast<size_t>(a.strides(1)),
        static_cast<size_t>(a.strides(2))};
  }

 private:
  array src_;
  std::optional<DenseInput> dense_;
};

} // namespace

void AttentionPrimitive::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  StridedInput q(inputs[0], "attention q");
  StridedInput k(inputs[1], "attention k");
  StridedInput v(inputs[2], "attention v");
  auto& out = outputs[0];
  allocate(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
  }
  enc.set_output_array(out);
  size_t b = inputs[0].shape(0), hq = inputs[0].shape(1), l = inputs[0].shape(2),
         d = inputs[0].shape(3);
  size_t hkv = inputs[1].shape(1), s = inputs[1].shape(2);
  float scale = scale_;
  bool causal = causal_;
  enc.dispatch([q, k, v, out, b, hq, hkv, l, s, d, scale, causal]() mutable {
    q.fill();
    k.fill();
    v.fill();
    auto qs = q.strides(), ks = k.strides(), vs = v.strides();
    if (!attention_cpu(
            static_cast<int32_t>(q.get().dtype().val()), q.bytes(),
            rust::Slice<const size_t>(qs.data(), 3), k.bytes(),
            rust::Slice<const size_t>(ks.data(), 3), v.bytes(),
            rust::Slice<const size_t>(vs.data(), 3), bytes_of_mut(out), b, hq, hkv, l, s, d,
            scale, causal)) {
      poison(out);
    }
  });
}

bool AttentionPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const AttentionPrimitive*>(&other);
  return o && o->scale_ == scale_ && o->causal_ == causal_;
}

std::vector<mx::Shape> AttentionPrimitive::output_shapes(const std::vector<array>& inputs) {
  return {inputs[0].shape()};
}

array attention_op(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    bool causal,
    bool fused,
    mx::Stream s) {
  check_contract(q, k, v);
  Fallback fallback = [scale, causal, s](std::vector<array> in) {
    return std::vector<array>{mx::fast::scaled_dot_product_attention(
        in[0], in[1], in[2], scale, causal ? "causal" : "", std::nullopt, std::nullopt, false,
        s)};
  };
  if (!fused) {
    return fallback({q, k, v})[0];
  }
  // Views with dense rows (cache slices, transposes) are read in place;
  // others are made dense inside eval_cpu / eval_gpu: one graph node either way.
  auto primitive = std::make_shared<AttentionPrimitive>(s, std::move(fallback), scale, causal);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY("attention", attention_cuda(scale, causal),
        attention_metal(scale, causal)));
  }
  return array(q.shape(), q.dtype(), primitive, {q, k, v});
}

ArrayPtr kernel_attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    bool causal,
    bool fused,
    StreamSpec s) {
  return wrap(attention_op(q, k, v, scale, causal, fused, to_stream(s)));
}

} // namespace mlx_backend
