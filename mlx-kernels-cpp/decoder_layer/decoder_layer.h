// decoder_layer: one pre-norm decoder block (attention + SwiGLU MLP on
// quantized weights) for single-token decode rows, each row with its own
// KV cache written in place at its own offset. The Primitive (CPU kernel in
// Rust) and the op function that builds either it or the same block from
// MLX's own ops.
#pragma once

#include "bridge.h"
#include "common/fallback_primitive.h"

namespace mlx_backend {

struct DecoderLayerSpec;

// The block's parameters as the Primitive keeps them (a C++ copy of the
// bridge's DecoderLayerSpec plus the per-projection quantization and the
// per-row cache offsets).
struct LayerConfig {
  int batch;
  int hidden;
  int intermediate;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  float eps;
  float attn_scale;
  int rope_dims;
  bool rope_traditional;
  float rope_base;
  float rope_scale;
  float rope_mscale;
  bool has_freqs;
  bool has_qkv_bias;
  bool has_qk_norm;
  int activations;
  // (bits, group_size) of q, k, v, o, gate, up, down.
  std::vector<int> quant;
  std::vector<int> offsets;

  bool operator==(const LayerConfig&) const = default;
  // Inputs before the caches: x, 2 norms, 7 × [w, scales, biases], optional.
  size_t param_inputs() const;
};

// Inputs: [x, params..., keys_0, values_0, keys_1, values_1, ...];
// outputs: [out, keys_0', values_0', ...] (each cache updated at its offset;
// a donatable cache buffer is reused, otherwise copied first).
class DecoderLayerPrimitive : public FallbackPrimitive {
 public:
  DecoderLayerPrimitive(mlx::core::Stream s, Fallback f, LayerConfig config)
      : FallbackPrimitive(s, std::move(f)), config_(std::move(config)) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "DecoderLayerKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  LayerConfig config_;
};

std::vector<array> decoder_layer_op(
    const array& x,
    const std::vector<array>& params,
    const std::vector<array>& caches,
    LayerConfig config,
    bool fused,
    mlx::core::Stream s);

// Bridge shim: returns [out, keys_0', values_0', ...].
std::unique_ptr<ArrayList> kernel_decoder_layer(
    const array& x,
    const ArrayList& params,
    const ArrayList& caches,
    const DecoderLayerSpec& spec,
    rust::Slice<const int32_t> quant,
    rust::Slice<const int32_t> offsets,
    bool fused,
    StreamSpec s);

} // namespace mlx_backend
