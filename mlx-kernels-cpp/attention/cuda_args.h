// The attention kernels' arguments: one struct that the host fills
// (attention/cuda.cpp) and the kernels take by value (attention/cuda.cu).
#pragma once

namespace mlx_backend {

// Batch, head, row and element strides, in elements.
struct AttentionStrides {
  long long batch, head, row, elem;
};

struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  // The first pass's partial states when splits > 1, else null.
  float* partials;
  AttentionStrides qs, ks, vs;
  int hq, hkv, l_len, s_len, d;
  float scale;
  bool causal;
  // Blocks per row along the keys.
  int splits;
};

} // namespace mlx_backend
