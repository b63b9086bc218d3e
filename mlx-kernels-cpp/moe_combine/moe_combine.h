// MoE combine: out[..., h] = sum_k y[..., k, h] * scores[..., k], the
// Primitive (CPU kernel in Rust) and the op function that builds either it
// or MLX's fallback graph.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

class MoeCombinePrimitive : public FallbackPrimitive {
 public:
  MoeCombinePrimitive(mlx::core::Stream s, Fallback f) : FallbackPrimitive(s, std::move(f)) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "MoeCombineKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return dynamic_cast<const MoeCombinePrimitive*>(&other) != nullptr;
  }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;
};

array moe_combine_op(const array& y, const array& scores, bool fused, mlx::core::Stream s);

// Bridge shim.
ArrayPtr kernel_moe_combine(const array& y, const array& scores, bool fused, StreamSpec s);

} // namespace mlx_backend
