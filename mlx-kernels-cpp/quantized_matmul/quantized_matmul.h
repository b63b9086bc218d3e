// quantized_matmul: y = x·Wᵀ on an MLX affine-quantized W [N, K]. The
// Primitive (CPU kernel in Rust) and the op function that builds either it
// or MLX's quantized_matmul.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

// Inputs: [x, w, scales, biases]; x [..., K] → [..., N]. `activations` is
// the Rust ActivationPrecision code (0 exact, 1 int8); only the CPU kernel
// reads it (the fallback graph is MLX's own).
class QuantizedMatmulPrimitive : public FallbackPrimitive {
 public:
  QuantizedMatmulPrimitive(mlx::core::Stream s, Fallback f, int group_size, int bits, int activations)
      : FallbackPrimitive(s, std::move(f)),
        group_size_(group_size),
        bits_(bits),
        activations_(activations) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "QuantizedMatmulKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  int activations_;
};

array quantized_matmul_op(
    const array& x,
    const std::vector<array>& w,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mlx::core::Stream s);

// Bridge shim; w is [weight, scales, biases].
ArrayPtr kernel_quantized_matmul(
    const array& x,
    const ArrayList& w,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s);

} // namespace mlx_backend
