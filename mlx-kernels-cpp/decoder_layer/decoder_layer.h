// decoder_layer: pre-norm decoder blocks (attention + SwiGLU MLP on
// quantized weights) for single-token decode rows, each row with its own
// KV cache written in place at its own offset. A stack of one or more
// blocks is one node: the Primitive (CPU kernel in Rust) and the op
// function that builds either it or the same blocks from MLX's own ops.
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
  // Per row, the cached length (set per call; empty in a PreparedLayer).
  std::vector<int> offsets;

  bool operator==(const LayerConfig&) const = default;
  // Inputs before the caches: x, 2 norms, 7 × [w, scales, biases], optional.
  size_t param_inputs() const;
};

// One block's parameters, checked, evaluated and made dense once; the
// optional token embedding table in front of the blocks (both defined in
// decoder_layer.cpp).
struct PreparedLayer;
struct PreparedEmbedding;
struct PreparedHead;

// Decoder blocks prepared for decode steps. The stack Primitive holds the
// blocks' parameters as constants of the node, so that a step's graph has
// only x and the caches as inputs: as graph inputs, a block's 24+
// parameter arrays were walked by every evaluation and re-checked by every
// eval_cpu (about a third of a small model's decode step on CPU).
class DecoderStack {
 public:
  std::vector<std::shared_ptr<const PreparedLayer>> layers;
  // When set, a node that starts at block 0 may take token ids and look
  // their rows up itself (one node instead of MLX's take and dequantize).
  std::shared_ptr<const PreparedEmbedding> embedding;
  // When set, the node that ends at the last block applies the final norm
  // and the quantized head, and outputs f32 logits instead of x.
  std::shared_ptr<const PreparedHead> head;
};

// Inputs: [x, keys_(0,0), values_(0,0), keys_(0,1), ...] (the caches of
// block l and row b at 1 + 2 (l B + b)), or token ids [B, 1] instead of x
// when `embedding` is set; outputs: [out, caches...] in the same order (each cache updated at its offset; a donatable cache buffer
// is reused, otherwise copied first). Runs every block of the stack in
// turn, block l's output feeding block l + 1.
class DecoderStackPrimitive : public FallbackPrimitive {
 public:
  DecoderStackPrimitive(
      mlx::core::Stream s,
      Fallback f,
      std::vector<std::shared_ptr<const PreparedLayer>> layers,
      std::shared_ptr<const PreparedEmbedding> embedding,
      std::shared_ptr<const PreparedHead> head,
      int batch,
      std::vector<int> offsets,
      bool in_place)
      : FallbackPrimitive(s, std::move(f)),
        layers_(std::move(layers)),
        embedding_(std::move(embedding)),
        head_(std::move(head)),
        batch_(batch),
        offsets_(std::move(offsets)),
        in_place_(in_place) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  // Checks the caches to be written in place, then runs the GPU body.
  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "DecoderStackKernel";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  std::vector<std::shared_ptr<const PreparedLayer>> layers_;
  // Throws when the node writes its caches in place and one of them is no
  // longer writable (checked at eval time, before either body runs).
  void require_caches_writable(const std::vector<array>& inputs) const;
  // Set when the first input is token ids.
  std::shared_ptr<const PreparedEmbedding> embedding_;
  // Set when the first output is logits.
  std::shared_ptr<const PreparedHead> head_;
  int batch_;
  // Per block and row (block-major): the cached length.
  std::vector<int> offsets_;
  // The caches are written in their own buffers (see
  // caches_writable_in_place) and the node's only output is `out`.
  bool in_place_;
};

// Bridge shims.
std::unique_ptr<DecoderStack> new_decoder_stack();
// Checks, evaluates and appends one block's parameters (in the order of
// `kernels::decoder_layer`).
void decoder_stack_push(
    DecoderStack& stack,
    const ArrayList& params,
    const DecoderLayerSpec& spec,
    rust::Slice<const int32_t> quant);
// Checks, evaluates and sets the quantized token embedding table ([w,
// scales, biases] of [vocab, hidden]).
void decoder_stack_set_embedding(
    DecoderStack& stack,
    const ArrayList& table,
    int32_t bits,
    int32_t group_size);
// Checks, evaluates and sets the final RMSNorm and the quantized head
// ([norm, w, scales, biases], w [vocab, hidden]).
void decoder_stack_set_head(
    DecoderStack& stack,
    const ArrayList& params,
    float eps,
    int32_t bits,
    int32_t group_size,
    int32_t activations);
// Blocks first..first + count of `stack` as one node; `input` is x, or
// token ids when `tokens` (first must be 0 and the stack hold a table).
// When the stack has a head and the node ends at its last block, the
// first output is f32 logits [B, 1, vocab]. Returns [out,
// caches...] as DecoderStackPrimitive's outputs; `offsets` per block and
// row (block-major).
size_t cache_buffer_in_place(const array& cache);
std::unique_ptr<ArrayList> kernel_decoder_stack(
    const array& input,
    bool tokens,
    const DecoderStack& stack,
    size_t first,
    size_t count,
    const ArrayList& caches,
    rust::Slice<const int32_t> offsets,
    bool fused,
    bool in_place,
    StreamSpec s);

} // namespace mlx_backend
