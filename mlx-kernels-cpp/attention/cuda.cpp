#include "attention/cuda.h"

#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kWarps = 4; // kWarps in attention/cuda.cu

// Batch, head, row and element strides in elements, as the kernel takes them.
struct Strides {
  long long batch, head, row, elem;
};

Strides strides_of(const mx::array& a) {
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
    std::string name = std::string("mlx_backend_attention_") + dtype_suffix(q.dtype());
    CUfunction f = cuda_function(s, fatbin::attention(), name);
    const void* qp = device_ptr(in[0]);
    const void* kp = device_ptr(in[1]);
    const void* vp = device_ptr(in[2]);
    void* op = device_ptr_mut(out);
    Strides qs = strides_of(in[0]), ks = strides_of(in[1]), vs = strides_of(in[2]);
    float scale = scale_;
    bool causal = causal_;
    if (out.size() > 0) {
      cuda_enqueue(
          s, f, dim3(l_len, hq, b), dim3(32 * kWarps), in, outputs,
          {&qp, &kp, &vp, &op, &qs, &ks, &vs, &hq, &hkv, &l_len, &s_len, &d, &scale, &causal});
    }
  }

 private:
  float scale_;
  bool causal_;
};

} // namespace

std::shared_ptr<GpuBody> attention_cuda(float scale, bool causal) {
  return std::make_shared<AttentionCuda>(scale, causal);
}

} // namespace mlx_backend
