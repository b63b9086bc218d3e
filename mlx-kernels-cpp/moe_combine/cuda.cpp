#include "moe_combine/cuda.h"

#include <algorithm>

#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

class MoeCombineCuda : public GpuBody {
 public:
  MoeCombineCuda() : GpuBody(KernelId::MoeCombine) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const auto& y = inputs[0];
    const auto& scores = inputs[1];
    int hidden = y.shape(-1);
    int top_k = y.shape(-2);
    int rows = static_cast<int>(y.size() / (static_cast<size_t>(hidden) * top_k));
    int width = 16 / static_cast<int>(y.itemsize());
    auto& out = outputs[0];
    allocate(out);
    bool vec = hidden % width == 0 && aligned16(inputs) && aligned16(outputs);
    std::string name = std::string("mlx_backend_moe_combine_") + dtype_suffix(y.dtype()) + "_" +
        dtype_suffix(scores.dtype());
    CUfunction f = cuda_function(s, fatbin::moe_combine(), name);
    const void* yp = device_ptr(y);
    const void* sp = device_ptr(scores);
    void* op = device_ptr_mut(out);
    int threads = (hidden / (vec ? width : 1) + 31) / 32 * 32;
    dim3 block(std::min(std::max(threads, 32), 1024));
    if (rows > 0) {
      cuda_enqueue(
          s, f, dim3(rows), block, inputs, outputs, {&yp, &sp, &op, &rows, &top_k, &hidden, &vec});
    }
  }
};

} // namespace

std::shared_ptr<GpuBody> moe_combine_cuda() {
  return std::make_shared<MoeCombineCuda>();
}

} // namespace mlx_backend
