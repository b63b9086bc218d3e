// RMSNorm's Metal body (kernels in rms_norm/rms_norm.metal).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

std::shared_ptr<GpuBody> rms_norm_metal(float eps);
std::shared_ptr<GpuBody> rms_norm_residual_metal(float eps);

} // namespace mlx_backend
