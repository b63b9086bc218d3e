// RMSNorm's CUDA body (kernels in rms_norm/cuda.cu).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

std::shared_ptr<GpuBody> rms_norm_cuda(float eps);
std::shared_ptr<GpuBody> rms_norm_residual_cuda(float eps);

} // namespace mlx_backend
