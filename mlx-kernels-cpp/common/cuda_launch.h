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

// A chain of kernels built once as a CUDA graph of this crate's own and
// launched whole on a stream, each kernel after the one before: for work
// repeated with the same shapes and buffers (a decode step), where adding
// every kernel to MLX's graph again costs more host time than the kernels
// take on the GPU. Arguments are copied when a kernel is added.
class KernelChain {
 public:
  explicit KernelChain(const mlx::core::Stream& s);
  ~KernelChain();
  KernelChain(const KernelChain&) = delete;
  KernelChain& operator=(const KernelChain&) = delete;

  void add(CUfunction f, dim3 grid, dim3 block, std::vector<void*> args, unsigned shared_bytes = 0);
  // Makes the chain launchable; no kernel can be added after.
  void instantiate();
  // Enqueues the chain on `stream`.
  void launch(CUstream stream) const;
  int kernels() const {
    return count_;
  }

 private:
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  CUgraphNode last_ = nullptr;
  int count_ = 0;
};

// The stream's CUDA stream, after MLX's pending kernels for it have been
// handed to it (so work enqueued on it directly runs after them, and MLX's
// later kernels after that work).
CUstream flushed_stream(const mlx::core::Stream& s);

// Asynchronous copies on `stream`; the host source may be reused on return.
void copy_host_to_device(void* dst, const void* src, size_t bytes, CUstream stream);
void copy_device_to_device(void* dst, const void* src, size_t bytes, CUstream stream);

// "f32", "f16" or "bf16": the suffix of a kernel's name for a float dtype.
const char* dtype_suffix(mlx::core::Dtype t);

} // namespace mlx_backend
