#include "attention/cuda.h"

#include <algorithm>

#include "attention/cuda_args.h"
#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kWarps = 4; // kAttendWarps in common/attend.cuh

AttentionStrides strides_of(const mx::array& a) {
  return {a.strides(0), a.strides(1), a.strides(2), a.strides(3)};
}

class AttentionCuda : public GpuBody {
 public:
  AttentionCuda(float scale, bool causal)
      : GpuBody(KernelId::Attention), scale_(scale), causal_(causal) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    // Every view (slices, transposes, broadcasts) is read in place.
    const auto& in = inputs;
    const auto& q = in[0];
    const auto& k = in[1];
    int b = q.shape(0), hq = q.shape(1), l_len = q.shape(2), d = q.shape(3);
    int hkv = k.shape(1), s_len = k.shape(2);
    if (d > kCudaAttentionMaxHeadDim) {
      throw std::logic_error("attention CUDA body: head_dim above its limit (the op checks this)");
    }
    auto& out = outputs[0];
    allocate(out);
    if (out.size() == 0) {
      return;
    }
    const char* dt = dtype_suffix(q.dtype());
    CUfunction attend = cuda_function(s, fatbin::attention(), std::string("mlx_backend_attention_") + dt);
    int splits = cuda_attention_key_splits(b * hq * l_len, s_len);
    AttentionArgs args{
        device_ptr(in[0]), device_ptr(in[1]), device_ptr(in[2]), device_ptr_mut(out), nullptr,
        strides_of(in[0]), strides_of(in[1]), strides_of(in[2]), hq, hkv, l_len, s_len, d,
        scale_, causal_, splits};
    if (splits == 1) {
      cuda_enqueue(s, attend, dim3(l_len, hq, b), dim3(32 * kWarps), in, outputs, {&args});
      return;
    }
    // Two passes: each (row, split) block writes its partial state, then
    // one block per row merges them.
    std::vector<mx::array> parts{mx::array(
        {b * hq * l_len * splits * (d + 2)}, mx::float32, nullptr, {})};
    allocate(parts[0]);
    keep_until_done(s, parts[0]);
    args.partials = static_cast<float*>(device_ptr_mut(parts[0]));
    cuda_enqueue(s, attend, dim3(l_len * splits, hq, b), dim3(32 * kWarps), in, parts, {&args});
    const void* pc = device_ptr(parts[0]);
    CUfunction merge =
        cuda_function(s, fatbin::attention(), std::string("mlx_backend_attention_merge_") + dt);
    cuda_enqueue(
        s, merge, dim3(l_len, hq, b), dim3(32 * kWarps), parts, outputs,
        {&pc, &args.out, &hq, &l_len, &d, &splits});
  }

 private:
  float scale_;
  bool causal_;
};

} // namespace

// Blocks per row along the keys: enough for about two blocks per SM of an
// H100/H200-sized GPU (132 SMs) when the rows alone are too few (decode),
// each block keeping at least 256 keys (64 per warp); 1 for prefill.
int cuda_attention_key_splits(int rows, int s_len) {
  constexpr int kTargetBlocks = 264;
  constexpr int kMinKeys = 256;
  constexpr int kMaxSplits = 64;
  if (rows >= kTargetBlocks) {
    return 1;
  }
  int by_keys = (s_len + kMinKeys - 1) / kMinKeys;
  int by_rows = (kTargetBlocks + rows - 1) / rows;
  return std::max(1, std::min({by_keys, by_rows, kMaxSplits}));
}

std::shared_ptr<GpuBody> attention_cuda(float scale, bool causal) {
  return std::make_shared<AttentionCuda>(scale, causal);
}

} // namespace mlx_backend
