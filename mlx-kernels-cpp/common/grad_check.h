// Test support: the vjp of a custom op (fused Primitive or its fallback
// graph), so tests can show the two agree.
#pragma once

#include "bridge.h"

namespace mlx_backend {

// kernel: 0 rms_norm [x, w], 1 rms_norm_residual [x, residual, w],
// 2 moe_combine [y, scores]. Returns the vjp with respect to every primal.
std::unique_ptr<ArrayList> kernel_vjp(
    int32_t kernel,
    bool fused,
    const ArrayList& primals,
    const ArrayList& cotangents,
    float eps,
    StreamSpec s);

} // namespace mlx_backend
