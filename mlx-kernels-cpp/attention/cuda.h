// attention's CUDA body (kernels in attention/cuda.cu).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

// The largest head_dim the CUDA body takes (kAttendMaxPerLane · 32 in
// common/attend.cuh).
constexpr int kCudaAttentionMaxHeadDim = 256;

std::shared_ptr<GpuBody> attention_cuda(float scale, bool causal);

// Blocks per query row along the keys for `rows` query rows over `s_len`
// keys (1 when the rows alone fill the GPU).
int cuda_attention_key_splits(int rows, int s_len);

} // namespace mlx_backend
