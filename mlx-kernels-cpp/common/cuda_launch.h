// Launching this crate's CUDA kernels from a Primitive's eval_gpu (CUDA
// builds only). build.rs compiles each kernel folder's `cuda.cu` with nvcc
// into a fatbin embedded in the library; the module is loaded once per
// device through the CUDA driver (the libcuda that libmlx loads) and each
// launch becomes a node of MLX's CUDA graph through MLX's command encoder,
// as MLX's own kernels are enqueued (backend/cuda/device.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <string_view>
#include <vector>

#include "mlx/mlx.h"

namespace mlx_backend {

// The kernel `name` of `fatbin`, loaded on the stream's device.
CUfunction cuda_function(const mlx::core::Stream& s, std::string_view fatbin, const std::string& name);

// Registers inputs and outputs (allocated by the caller) with the stream's
// encoder, which orders the graph's nodes by them, and enqueues `f` with `args` (pointers to each argument, in the
// kernel's parameter order).
void cuda_enqueue(
    const mlx::core::Stream& s,
    CUfunction f,
    dim3 grid,
    dim3 block,
    const std::vector<mlx::core::array>& inputs,
    std::vector<mlx::core::array>& outputs,
    std::vector<void*> args,
    unsigned shared_bytes = 0);

// Keeps `a` (an intermediate allocated inside eval_gpu) alive until the
// stream's work that uses it has run.
void keep_until_done(const mlx::core::Stream& s, const mlx::core::array& a);

// The device address of an array's first element.
const void* device_ptr(const mlx::core::array& a);
void* device_ptr_mut(mlx::core::array& a);

// Whether every array starts on a 16-byte boundary (vector loads).
bool aligned16(const std::vector<mlx::core::array>& arrays);

// "f32", "f16" or "bf16": the suffix of a kernel's name for a float dtype.
const char* dtype_suffix(mlx::core::Dtype t);

} // namespace mlx_backend
