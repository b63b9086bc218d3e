// A Primitive's GPU body: what its eval_gpu runs. The backend's file in the
// kernel's folder (`<op>/cuda.cpp`, `<op>/metal.cpp`) builds one when the op
// is built on a GPU stream, so the Primitive keeps its fallback-derived
// vjp, jvp and vmap on every device.
#pragma once

#include <memory>
#include <vector>

#include "mlx/mlx.h"

namespace mlx_backend {

// Kernel numbers as Kernel::ALL orders them on the Rust side (registry.rs).
enum class KernelId : int {
  RmsNorm = 0,
  MoeCombine = 1,
  GateQmvSiluMul = 2,
  QuantizedMatmul = 3,
  Attention = 4,
  DecoderLayer = 5,
};

class GpuBody {
 public:
  explicit GpuBody(KernelId kernel) : kernel_(kernel) {}
  virtual ~GpuBody() = default;

  // Enqueues the body on `stream`; a failure is reported to the registry
  // (later builds fall back) and rethrown as MLX's evaluation error.
  void run(
      const mlx::core::Stream& stream,
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs);

 protected:
  // The backend's launch: allocate the outputs and enqueue the kernels.
  virtual void enqueue(
      const mlx::core::Stream& stream,
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) = 0;

 private:
  KernelId kernel_;
};

// Throws: this build has no GPU body for `op` (the Rust side never asks for
// one where the registry's table has none).
std::shared_ptr<GpuBody> no_gpu_body(const char* op);

} // namespace mlx_backend

// The op's GPU body in this build's GPU backend: the `cuda` expression in
// CUDA builds, `metal` on Apple silicon with Metal bodies, else none.
#if defined(MLX_BACKEND_CUDA)
#define MLX_BACKEND_GPU_BODY(op, cuda, metal) (cuda)
#elif defined(MLX_BACKEND_METAL)
#define MLX_BACKEND_GPU_BODY(op, cuda, metal) (metal)
#else
#define MLX_BACKEND_GPU_BODY(op, cuda, metal) (::mlx_backend::no_gpu_body(op))
#endif
