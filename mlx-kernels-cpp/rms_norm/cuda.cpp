#include "rms_norm/cuda.h"

#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

// One block per row; enough threads for one 16-byte load each, in whole
// warps, at most 1024.
dim3 block_for(int hidden, int vec) {
  int per_thread = vec > 1 ? vec : 1;
  int threads = (hidden / per_thread + 31) / 32 * 32;
  return dim3(std::min(std::max(threads, 32), 1024));
}

class RmsNormCuda : public GpuBody {
 public:
  RmsNormCuda(float eps, bool residual)
      : GpuBody(KernelId::RmsNorm), eps_(eps), residual_(residual) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    int hidden = x.shape(-1);
    int rows = static_cast<int>(x.size() / hidden);
    int width = 16 / static_cast<int>(x.itemsize());
    for (auto& out : outputs) {
      allocate(out);
    }
    bool vec = hidden % width == 0 && aligned16(inputs) && aligned16(outputs);
    std::string name = std::string(residual_ ? "mlx_backend_rms_norm_residual_" : "mlx_backend_rms_norm_") +
        dtype_suffix(x.dtype());
    CUfunction f = cuda_function(s, fatbin::rms_norm(), name);
    std::vector<const void*> in;
    for (const auto& a : inputs) {
      in.push_back(device_ptr(a));
    }
    std::vector<void*> out;
    for (auto& a : outputs) {
      out.push_back(device_ptr_mut(a));
    }
    float eps = eps_;
    std::vector<void*> args;
    for (auto& p : in) {
      args.push_back(&p);
    }
    for (auto& p : out) {
      args.push_back(&p);
    }
    args.push_back(&eps);
    args.push_back(&rows);
    args.push_back(&hidden);
    args.push_back(&vec);
    if (rows > 0) {
      cuda_enqueue(s, f, dim3(rows), block_for(hidden, vec ? width : 1), inputs, outputs, args);
    }
  }

 private:
  float eps_;
  bool residual_;
};

} // namespace

std::shared_ptr<GpuBody> rms_norm_cuda(float eps) {
  return std::make_shared<RmsNormCuda>(eps, false);
}

std::shared_ptr<GpuBody> rms_norm_residual_cuda(float eps) {
  return std::make_shared<RmsNormCuda>(eps, true);
}

} // namespace mlx_backend
