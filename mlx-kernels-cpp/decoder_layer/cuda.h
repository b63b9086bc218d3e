// decoder_layer's CUDA body (host side in decoder_layer/cuda.cpp, kernels in
// decoder_layer/cuda.cu).
#pragma once

#include <memory>
#include <vector>

#include "common/gpu_body.h"

namespace mlx_backend {

struct PreparedLayer;
struct PreparedEmbedding;
struct PreparedHead;

// The decode step of blocks `layers` over `batch` rows (offsets per block
// and row, block-major), as DecoderStackPrimitive's GPU body.
std::shared_ptr<GpuBody> decoder_stack_cuda(
    std::vector<std::shared_ptr<const PreparedLayer>> layers,
    std::shared_ptr<const PreparedEmbedding> embedding,
    std::shared_ptr<const PreparedHead> head,
    int batch,
    std::vector<int> offsets,
    bool in_place);

} // namespace mlx_backend
