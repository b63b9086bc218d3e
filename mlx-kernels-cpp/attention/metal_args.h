// The Metal decode attention kernel's arguments: one struct filled by the
// host (attention/metal.cpp) and read as `constant` by the shader
// (attention/attention.metal), the fields of AttentionArgs
// (attention/cuda_args.h) less the pointers, which are buffers. Both sides
// include this file, so it spells its 64-bit integers for each.
#pragma once

#ifdef __METAL_VERSION__
#define MLX_BACKEND_I64 long
// Metal keeps program-scope constants in the constant address space.
#define MLX_BACKEND_CONSTANT constant
#else
#include <cstdint>
#define MLX_BACKEND_I64 int64_t
#define MLX_BACKEND_CONSTANT
#endif

namespace mlx_backend_attention {

// Up to this many query rows per head (kAttentionDecodeMaxRows in
// attention/cuda_args.h); more rows build MLX's own fused attention.
MLX_BACKEND_CONSTANT constexpr int kMetalAttentionMaxRows = 4;
// Simdgroups per threadgroup, and the largest head_dim (32 lanes times
// kMetalAttentionMaxPerLane elements), as common/attend.cuh.
MLX_BACKEND_CONSTANT constexpr int kMetalAttentionSimdgroups = 4;
MLX_BACKEND_CONSTANT constexpr int kMetalAttentionMaxPerLane = 8;

struct MetalAttentionArgs {
  // Batch, head, row and element strides of q, k and v, in elements.
  MLX_BACKEND_I64 qs[4];
  MLX_BACKEND_I64 ks[4];
  MLX_BACKEND_I64 vs[4];
  int hq, hkv, l_len, s_len, d;
  float scale;
  int causal;
};

} // namespace mlx_backend_attention
