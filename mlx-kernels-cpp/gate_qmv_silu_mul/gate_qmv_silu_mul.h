// gate-QMV-SiLU-mul: silu(x·Wgᵀ) * (x·Wuᵀ) on MLX affine-quantized weights,
// dense and expert-indexed (SwitchGLU). The Primitive (CPU kernel in Rust)
// and the op functions that build either it or MLX's fallback graph.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

// Inputs: dense [x, gw, gs, gb, uw, us, ub]; expert-indexed
// [x, indices, gw, gs, gb, uw, us, ub] with weights stacked [E, N, ...].
// `activations` is the Rust ActivationPrecision code (0 exact, 1 int8); only
// the CPU kernel reads it (the fallback graph is MLX's own).
class GateQmvSiluMulPrimitive : public FallbackPrimitive {
 public:
  GateQmvSiluMulPrimitive(
      mlx::core::Stream s,
      Fallback f,
      int group_size,
      int bits,
      int activations,
      bool indexed)
      : FallbackPrimitive(s, std::move(f)),
        group_size_(group_size),
        bits_(bits),
        activations_(activations),
        indexed_(indexed) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return indexed_ ? "GatherGateQmvSiluMulKernel" : "GateQmvSiluMulKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  int activations_;
  bool indexed_;
};

array gate_qmv_silu_mul_op(
    const array& x,
    const std::vector<array>& gate,
    const std::vector<array>& up,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mlx::core::Stream s);

array gather_gate_qmv_silu_mul_op(
    const array& x,
    const array& indices,
    const std::vector<array>& gate,
    const std::vector<array>& up,
    int group_size,
    int bits,
    int activations,
    bool fused,
    mlx::core::Stream s);

// Bridge shims; gate and up are [weight, scales, biases].
ArrayPtr kernel_gate_qmv_silu_mul(
    const array& x,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s);
ArrayPtr kernel_gather_gate_qmv_silu_mul(
    const array& x,
    const array& indices,
    const ArrayList& gate,
    const ArrayList& up,
    int32_t group_size,
    int32_t bits,
    int32_t activations,
    bool fused,
    StreamSpec s);

} // namespace mlx_backend
