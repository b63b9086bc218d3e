// The CUDA bodies of the quantized projections (kernels in
// quantized_matmul/cuda.cu and gate_qmv_silu_mul/cuda.cu, on the shared
// common/qmv.cuh): decode-size batches of rows.
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

// The most rows of x the CUDA bodies take (kQmvMaxRows in common/qmv.cuh);
// more rows build MLX's quantized_matmul, faster there.
constexpr int kCudaQmvMaxRows = 4;

// out = x·wᵀ; inputs x, w, scales, biases.
std::shared_ptr<GpuBody> quantized_matmul_cuda(int group_size, int bits);

// out = silu(x·gateᵀ)·(x·upᵀ); inputs x, gate w/scales/biases, up w/scales/biases.
std::shared_ptr<GpuBody> gate_qmv_silu_mul_cuda(int group_size, int bits);

// The expert-indexed form: inputs x, uint32 indices [..., top_k], stacked
// gate and up w/scales/biases [E, N, ...]; out [..., top_k, N].
std::shared_ptr<GpuBody> gather_gate_qmv_silu_mul_cuda(int group_size, int bits);

} // namespace mlx_backend
