// The CUDA bodies of the quantized projections (kernels in
// quantized_matmul/cuda.cu and gate_qmv_silu_mul/cuda.cu, on the shared
// common/qmv.cuh): decode-size batches of rows; quantized_matmul also takes
// more rows, on the tiled kernels of common/qmm.cuh.
#pragma once

#include <memory>

#include "common/gpu_body.h"

namespace mlx_backend {

// The most rows of x the decode kernels take (kQmvMaxRows in
// common/qmv.cuh). quantized_matmul runs more rows on its tiled kernels;
// gate_qmv_silu_mul does not take more (the op builds MLX's graph).
constexpr int kCudaQmvMaxRows = 4;

// out = x·wᵀ; inputs x, w, scales, biases; any number of rows.
std::shared_ptr<GpuBody> quantized_matmul_cuda(int group_size, int bits);

// out = silu(x·gateᵀ)·(x·upᵀ); inputs x, gate w/scales/biases, up w/scales/biases.
std::shared_ptr<GpuBody> gate_qmv_silu_mul_cuda(int group_size, int bits);

// The expert-indexed form: inputs x, uint32 indices [..., top_k], stacked
// gate and up w/scales/biases [E, N, ...]; out [..., top_k, N].
std::shared_ptr<GpuBody> gather_gate_qmv_silu_mul_cuda(int group_size, int bits);

} // namespace mlx_backend
