// The decode step's kernel arguments: structs that the host fills
// (decoder_layer/cuda.cpp) and the kernels take by value
// (decoder_layer/cuda.cu). The step's kernels form a CUDA graph built once
// per shape and replayed every step, so what changes from step to step
// (each row's cache and length) is read from a table in device memory that
// the host rewrites before each replay.
#pragma once

#include <cstdint>

namespace mlx_backend {

// Quantized projections concatenated along the output columns (q, k and
// v as one launch; one matrix otherwise): out[r, :] = x[r, :]·[W0; W1; W2]ᵀ,
// each column rounded to the output dtype, then + bias (rounded), then
// residual + (rounded), as the unfused graph rounds.
struct ProjectionArgs {
  // [rows, k_len]
  const void* x;
  // Of the output dtype, rows out_stride apart, or null.
  const void* residual;
  // The launch's first output column; rows out_stride apart.
  void* out;
  const uint32_t* w[3];
  const void* scales[3];
  const void* biases[3];
  // f32 [n[m]] or null.
  const float* bias[3];
  int n[3];
  int group_size[3];
  int mats;
  // Columns of this launch's matrices together.
  int n_cols;
  int out_stride;
  int rows, k_len;
  // f32 [k_len]: x is RMS-normed with these weights first (the block's
  // norms folded into the projection that reads them), or null.
  const float* norm_w;
  float norm_eps;
};

// silu(x·Gᵀ)·(x·Uᵀ) with the unfused graph's roundings.
struct GateArgs {
  const void* x;
  void* out;
  const uint32_t* w[2];
  const void* scales[2];
  const void* biases[2];
  int rows, k_len, n_len, group_size;
  // As ProjectionArgs::norm_w: the post-attention norm, folded in.
  const float* norm_w;
  float norm_eps;
};

// One block's view of the step table: for each row, its keys and values
// ([1, n_kv_heads, capacity, head_dim], row-contiguous), its cached length
// before this step and its capacity.
struct RowCaches {
  void* const* k;
  void* const* v;
  const int* offset;
  const int* capacity;
};

// q and k: optional per-head RMSNorm, then RoPE at each row's offset; k
// and v appended to the row's cache at its offset, q written out.
struct RopeAppendArgs {
  // [rows, (nq + 2 nkv) · d]: q, k, v of each row.
  const void* qkv;
  // [rows, nq, d]
  void* q_out;
  // f32 [d] or null.
  const float* q_norm;
  const float* k_norm;
  // f32 [dims / 2]: 1 / frequency of each rotated pair.
  const float* inv_freqs;
  RowCaches caches;
  int nq, nkv, d, dims;
  bool traditional;
  float position_scale, mscale, eps;
};

// Each row's query heads over keys 0..=offset of its cache.
struct StepAttentionArgs {
  // [rows, nq, d]
  const void* q;
  // [rows, nq · d]
  void* out;
  // The first pass's partial states when splits > 1, else null.
  float* partials;
  RowCaches caches;
  int nq, nkv, d, splits;
  float scale;
};

// A 4-D view copied into a dense buffer of the same shape.
struct CopyArgs {
  const void* src;
  void* dst;
  long long shape[4];
  long long strides[4];
  long long n;
};

} // namespace mlx_backend
