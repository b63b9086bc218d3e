#include "attention/metal.h"

#include <stdexcept>

#include "attention/metal_args.h"
#include "common/fallback_primitive.h"
#include "common/metal_launch.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

using mlx_backend_attention::kMetalAttentionMaxPerLane;
using mlx_backend_attention::kMetalAttentionMaxRows;
using mlx_backend_attention::kMetalAttentionSimdgroups;
using mlx_backend_attention::MetalAttentionArgs;

void strides_into(const mx::array& a, int64_t (&out)[4]) {
  for (int i = 0; i < 4; i++) {
    out[i] = a.strides(i);
  }
}

class AttentionMetal : public GpuBody {
 public:
  AttentionMetal(float scale, bool causal)
      : GpuBody(KernelId::Attention), scale_(scale), causal_(causal) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    // Every view (slices, transposes, broadcasts) is read in place.
    const auto& q = inputs[0];
    const auto& k = inputs[1];
    int b = q.shape(0), hq = q.shape(1), l_len = q.shape(2), d = q.shape(3);
    int hkv = k.shape(1), s_len = k.shape(2);
    if (d > 32 * kMetalAttentionMaxPerLane || l_len > kMetalAttentionMaxRows) {
      throw std::logic_error("attention Metal body: head_dim or query rows above its limits (the op checks this)");
    }
    if (causal_ && s_len < l_len) {
      throw std::logic_error("attention Metal body: causal with fewer keys than queries (the op checks this)");
    }
    auto& out = outputs[0];
    allocate(out);
    if (out.size() == 0) {
      return;
    }
    MetalAttentionArgs args{};
    strides_into(inputs[0], args.qs);
    strides_into(inputs[1], args.ks);
    strides_into(inputs[2], args.vs);
    args.hq = hq;
    args.hkv = hkv;
    args.l_len = l_len;
    args.s_len = s_len;
    args.d = d;
    args.scale = scale_;
    args.causal = causal_ ? 1 : 0;
    // The fewest elements per lane that cover head_dim.
    std::string name = std::string("mlx_backend_attention_") + metal_dtype_suffix(q.dtype()) +
        (d <= 128 ? "_p4" : "_p8");
    MTL::ComputePipelineState* kernel = metal_kernel(s, name);
    const size_t threads = 32 * kMetalAttentionSimdgroups;
    if (kernel->maxTotalThreadsPerThreadgroup() < threads) {
      throw std::runtime_error("attention Metal body: " + name + " takes fewer threads per threadgroup than it needs");
    }
    auto& enc = mx::metal::get_command_encoder(s);
    enc.set_compute_pipeline_state(kernel);
    enc.set_input_array(inputs[0], 0);
    enc.set_input_array(inputs[1], 1);
    enc.set_input_array(inputs[2], 2);
    enc.set_output_array(out, 3);
    enc.set_bytes(args, 4);
    enc.dispatch_threadgroups(MTL::Size(l_len, hq, b), MTL::Size(threads, 1, 1));
  }

 private:
  float scale_;
  bool causal_;
};

} // namespace

std::shared_ptr<GpuBody> attention_metal(float scale, bool causal) {
  return std::make_shared<AttentionMetal>(scale, causal);
}

} // namespace mlx_backend
