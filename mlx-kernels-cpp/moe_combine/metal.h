// MoE combine's Metal body (kernels in moe_combine/moe_combine.metal).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

std::shared_ptr<GpuBody> moe_combine_metal();

} // namespace mlx_backend
