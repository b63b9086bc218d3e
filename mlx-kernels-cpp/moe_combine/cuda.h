// MoE combine's CUDA body (kernels in moe_combine/cuda.cu).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

std::shared_ptr<GpuBody> moe_combine_cuda();

} // namespace mlx_backend
