// RMSNorm and RMSNorm fused with the residual add: the Primitives (CPU
// kernel in Rust) and the op functions that build either them or MLX's
// fallback graph.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

// y = x * rsqrt(mean(x^2, -1) + eps) * w over rows of x.
class RmsNormPrimitive : public FallbackPrimitive {
 public:
  RmsNormPrimitive(mlx::core::Stream s, Fallback f, float eps)
      : FallbackPrimitive(s, std::move(f)), eps_(eps) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "RmsNormKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float eps_;
};

// (rms_norm(x + residual), x + residual) in one pass.
class RmsNormResidualPrimitive : public FallbackPrimitive {
 public:
  RmsNormResidualPrimitive(mlx::core::Stream s, Fallback f, float eps)
      : FallbackPrimitive(s, std::move(f)), eps_(eps) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "RmsNormResidualKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float eps_;
};

array rms_norm_op(const array& x, const array& w, float eps, bool fused, mlx::core::Stream s);
std::vector<array> rms_norm_residual_op(
    const array& x,
    const array& residual,
    const array& w,
    float eps,
    bool fused,
    mlx::core::Stream s);

// Bridge shims.
ArrayPtr kernel_rms_norm(const array& x, const array& w, float eps, bool fused, StreamSpec s);
std::unique_ptr<ArrayList> kernel_rms_norm_residual(
    const array& x,
    const array& residual,
    const array& w,
    float eps,
    bool fused,
    StreamSpec s);

} // namespace mlx_backend
