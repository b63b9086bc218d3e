// MLX's affine quantized matmul as every op of this crate calls it.
#pragma once

#include <optional>

#include "bridge.h"

namespace mlx_backend {

// mx::quantized_matmul(x, w, scales, biases, transpose, group_size, bits,
// "affine", s), except where MLX 0.32.4's CUDA backend returns wrong
// values: transposed w with rows of x that are one quantization group each
// (K <= group_size), the shapes for which it picks its SM90 tiled kernel
// (qmm_sm90; measured in docs/gpu.md). There the product is MLX's
// dequantize (to the result type) and matmul: on these shapes (one group
// of at most 128 values per row) the dense weight is small. f32 x then
// goes through MLX's f32 matmul, which uses TF32 unless MLX_ENABLE_TF32=0.
array affine_quantized_matmul(
    const array& x,
    const array& w,
    const array& scales,
    const std::optional<array>& biases,
    bool transpose,
    int group_size,
    int bits,
    mlx::core::Stream s);

} // namespace mlx_backend
