// The parameters a DecoderStack holds, as its bodies read them: the CPU
// body (Rust, through the address tables) and the CUDA body (decoder_layer/
// cuda.cpp, through the arrays).
#pragma once

#include <optional>

#include "decoder_layer/decoder_layer.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"

namespace mlx_backend {

// A block's vector parameters widened to f32 (exact) and evaluated, and its
// RoPE inverse frequencies: what the CUDA body's kernels read.
struct StepVectors {
  array input_norm;
  array post_norm;
  // q, k, v biases when the block has them.
  std::optional<array> qkv_bias[3];
  // q and k norms when the block has them.
  std::optional<array> qk_norm[2];
  // 1 / frequency of each rotated pair.
  array inv_freqs;
};

// One block of a DecoderStack.
struct PreparedLayer {
  // batch and offsets unset: they come with each call.
  LayerConfig config;
  // input norm, post norm, 7 × [w, scales, biases], optional ones: each
  // evaluated and row-contiguous.
  std::vector<array> params;
  // (address, bytes) of each parameter, for the kernel.
  std::vector<size_t> table;
  // The kernel's view of `config` (batch set per call).
  DecoderLayerSpec spec;
  StepVectors vectors;
};

// The token embedding table of a DecoderStack.
struct PreparedEmbedding {
  // w, scales, biases: evaluated and row-contiguous.
  std::vector<array> params;
  std::vector<size_t> table;
  int bits;
  int group_size;
  int vocab;
  int hidden;
};

// The final norm and head of a DecoderStack.
struct PreparedHead {
  // norm weight, w, scales, biases: evaluated and row-contiguous.
  std::vector<array> params;
  std::vector<size_t> table;
  float eps;
  int bits;
  int group_size;
  int activations;
  int vocab;
  // The norm weight widened to f32.
  array norm_f32;
};

// The arrays whose buffers a stack node writes its caches into: the
// inputs' own when `in_place` (the Primitive checked them writable), else
// the outputs,
// each sharing its input's buffer when nothing else holds it, or a fresh
// buffer to be filled from `copies` (source, destination) before the
// kernels run.
std::vector<array> caches_to_write(
    const std::vector<array>& inputs,
    std::vector<array>& outputs,
    bool in_place,
    std::vector<std::pair<array, array>>& copies);

} // namespace mlx_backend
