// attention: softmax(q·kᵀ·scale)·v, causal (lower-right aligned) or
// unmasked, with grouped-query heads. The Primitive (CPU kernel in Rust)
// and the op function that builds either it or MLX's
// fast::scaled_dot_product_attention.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

// Inputs: [q, k, v]; q [B, Hq, L, D], k/v [B, Hkv, S, D] → [B, Hq, L, D].
class AttentionPrimitive : public FallbackPrimitive {
 public:
  AttentionPrimitive(mlx::core::Stream s, Fallback f, float scale, bool causal)
      : FallbackPrimitive(s, std::move(f)), scale_(scale), causal_(causal) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "AttentionKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float scale_;
  bool causal_;
};

array attention_op(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    bool causal,
    bool fused,
    mlx::core::Stream s);

// Bridge shim.
ArrayPtr kernel_attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    bool causal,
    bool fused,
    StreamSpec s);

} // namespace mlx_backend
