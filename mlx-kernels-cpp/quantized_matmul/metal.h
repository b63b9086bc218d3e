// The Metal bodies of the quantized projections for decode-size batches
// (kernels in quantized_matmul/qmv.metal and gate_qmv_silu_mul/gate_qmv.metal,
// on the shared common/metal_qmv.h).
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

// The most rows of x the Metal bodies take (kQmvMaxRows in
// common/metal_qmv.h); more rows build MLX's own quantized matmul (the
// ops' eligibility checks this).
constexpr int kMetalQmvMaxRows = 4;

// out = x·wᵀ; inputs x, w, scales, biases.
std::shared_ptr<GpuBody> quantized_matmul_metal(int group_size, int bits);

// out = silu(x·gateᵀ)·(x·upᵀ); inputs x, gate w/scales/biases, up w/scales/biases.
std::shared_ptr<GpuBody> gate_qmv_silu_mul_metal(int group_size, int bits);

// The expert-indexed form: inputs x, uint32 indices [..., top_k], stacked
// gate and up w/scales/biases [E, N, ...]; out [..., top_k, N].
std::shared_ptr<GpuBody> gather_gate_qmv_silu_mul_metal(int group_size, int bits);

} // namespace mlx_backend
