#include "moe_combine/metal.h"

#include <stdexcept>

#include "common/fallback_primitive.h"
#include "common/metal_launch.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

// kMaxTopK in moe_combine.metal (the op's eligibility checks it).
constexpr int kMetalMaxTopK = 64;

class MoeCombineMetal : public GpuBody {
 public:
  MoeCombineMetal() : GpuBody(KernelId::MoeCombine) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const auto& y = inputs[0];
    const auto& scores = inputs[1];
    int hidden = y.shape(-1);
    int top_k = y.shape(-2);
    if (top_k > kMetalMaxTopK) {
      throw std::logic_error("moe_combine Metal body: more experts per token than it takes (the op checks this)");
    }
    size_t per_row = static_cast<size_t>(hidden) * top_k;
    int rows = per_row > 0 ? static_cast<int>(y.size() / per_row) : 0;
    auto& out = outputs[0];
    allocate(out);
    if (rows == 0 || hidden == 0) {
      return;
    }
    std::string name = std::string("mlx_backend_moe_combine_") + metal_dtype_suffix(y.dtype()) + "_" +
        metal_dtype_suffix(scores.dtype());
    MTL::ComputePipelineState* kernel = metal_kernel(s, name);
    auto& enc = mx::metal::get_command_encoder(s);
    enc.set_compute_pipeline_state(kernel);
    enc.set_input_array(y, 0);
    enc.set_input_array(scores, 1);
    enc.set_output_array(out, 2);
    enc.set_bytes(top_k, 3);
    enc.set_bytes(hidden, 4);
    size_t threads = metal_group_size(kernel, static_cast<size_t>(hidden));
    enc.dispatch_threadgroups(MTL::Size(rows, 1, 1), MTL::Size(threads, 1, 1));
  }
};

} // namespace

std::shared_ptr<GpuBody> moe_combine_metal() {
  return std::make_shared<MoeCombineMetal>();
}

} // namespace mlx_backend
