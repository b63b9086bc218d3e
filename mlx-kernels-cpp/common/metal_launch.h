// Launching this crate's Metal kernels from a Primitive's eval_gpu (macOS
// builds with feature `metal`). build.rs compiles every `<op>/*.metal` into
// one mlx_backend.metallib (build/metal.rs); it is loaded once per device
// through MLX's `metal::Device::get_library` and each kernel is encoded on
// the stream's command encoder, as MLX's extension example `axpby`
// (examples/extensions/axpby/axpby.cpp) and MLX's own kernels do.
#pragma once

#include <string>

#include "mlx/backend/metal/device.h"
#include "mlx/mlx.h"

namespace mlx_backend {

// The pipeline of kernel `name` in mlx_backend.metallib on the stream's
// device. Throws when the library or the kernel cannot be loaded (a GpuBody
// failure: the registry remembers it and later builds fall back).
MTL::ComputePipelineState* metal_kernel(const mlx::core::Stream& s, const std::string& name);

// "f32", "f16" or "bf16": the suffix of a kernel's name for a float dtype.
const char* metal_dtype_suffix(mlx::core::Dtype t);

// Threads per threadgroup for a kernel whose threadgroup takes `wanted`
// threads: rounded up to whole simdgroups (32), at least one, at most what
// the pipeline allows (maxTotalThreadsPerThreadgroup), as MLX's
// backend/metal/normalization.cpp sizes its groups.
size_t metal_group_size(MTL::ComputePipelineState* kernel, size_t wanted);

// Where mlx_backend.metallib is read from: $MLX_BACKEND_METALLIB, else
// beside the running executable (or one folder up: tests run from
// target/<profile>/deps), else the path build.rs compiled it to.
std::string metallib_path();

} // namespace mlx_backend
