// attention's CUDA body (kernels in attention/cuda.cu).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

// The largest head_dim the CUDA body takes (kMaxPerLane · 32 in cuda.cu).
constexpr int kCudaAttentionMaxHeadDim = 256;

std::shared_ptr<GpuBody> attention_cuda(float scale, bool causal);

} // namespace mlx_backend
