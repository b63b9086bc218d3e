#include "common/gpu_body.h"

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

#include "mlx-backend/mlx-backend/kernels/registry_bridge.rs.h"

namespace mlx_backend {

void GpuBody::run(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    std::vector<mlx::core::array>& outputs) {
  try {
    auto start = std::chrono::steady_clock::now();
    enqueue(stream, inputs, outputs);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    record_gpu_enqueue(static_cast<int32_t>(kernel_), static_cast<uint64_t>(ns.count()));
  } catch (const std::exception& e) {
    record_gpu_failure(static_cast<int32_t>(kernel_), e.what());
    throw;
  }
}

std::shared_ptr<GpuBody> no_gpu_body(const char* op) {
  throw std::logic_error(std::string(op) + ": this build has no GPU body for it");
}

} // namespace mlx_backend
