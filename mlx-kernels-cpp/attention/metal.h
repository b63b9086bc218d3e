// attention's Metal body for decode rows (kernels in attention/attention.metal).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

std::shared_ptr<GpuBody> attention_metal(float scale, bool causal);

} // namespace mlx_backend
