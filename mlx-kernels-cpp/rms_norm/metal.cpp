#include "rms_norm/metal.h"

#include "common/fallback_primitive.h"
#include "common/metal_launch.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

class RmsNormMetal : public GpuBody {
 public:
  RmsNormMetal(float eps, bool residual)
      : GpuBody(KernelId::RmsNorm), eps_(eps), residual_(residual) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    int hidden = x.shape(-1);
    int rows = hidden > 0 ? static_cast<int>(x.size() / hidden) : 0;
    for (auto& out : outputs) {
      allocate(out);
    }
    if (rows == 0) {
      return;
    }
    std::string name = std::string(residual_ ? "mlx_backend_rms_norm_residual_" : "mlx_backend_rms_norm_") +
        metal_dtype_suffix(x.dtype());
    MTL::ComputePipelineState* kernel = metal_kernel(s, name);
    auto& enc = mx::metal::get_command_encoder(s);
    enc.set_compute_pipeline_state(kernel);
    int idx = 0;
    for (const auto& a : inputs) {
      enc.set_input_array(a, idx++);
    }
    for (auto& a : outputs) {
      enc.set_output_array(a, idx++);
    }
    float eps = eps_;
    enc.set_bytes(eps, idx++);
    enc.set_bytes(hidden, idx++);
    // One threadgroup per row, a thread per element up to the pipeline's limit.
    size_t threads = metal_group_size(kernel, static_cast<size_t>(hidden));
    enc.dispatch_threadgroups(MTL::Size(rows, 1, 1), MTL::Size(threads, 1, 1));
  }

 private:
  float eps_;
  bool residual_;
};

} // namespace

std::shared_ptr<GpuBody> rms_norm_metal(float eps) {
  return std::make_shared<RmsNormMetal>(eps, false);
}

std::shared_ptr<GpuBody> rms_norm_residual_metal(float eps) {
  return std::make_shared<RmsNormMetal>(eps, true);
}

} // namespace mlx_backend
