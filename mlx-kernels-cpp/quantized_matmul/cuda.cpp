#include "quantized_matmul/cuda.h"

#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kWarpsPerBlock = 4; // kQmvWarpsPerBlock in common/qmv.cuh

// One quantized projection (gate = false) or the gate/up pair.
class QmvCuda : public GpuBody {
 public:
  QmvCuda(KernelId id, bool gate, int group_size, int bits)
      : GpuBody(id), gate_(gate), group_size_(group_size), bits_(bits) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& scales = inputs[2];
    int k_len = x.shape(-1);
    int rows = static_cast<int>(x.size() / k_len);
    int n_len = outputs[0].shape(-1);
    if (rows > kCudaQmvMaxRows) {
      throw std::logic_error("qmv CUDA body: more rows than it takes (the op checks this)");
    }
    allocate(outputs[0]);
    bool vec = aligned16(inputs) && aligned16(outputs);
    std::string name = std::string(gate_ ? "mlx_backend_gate_qmv_" : "mlx_backend_qmv_") +
        dtype_suffix(x.dtype()) + "_" + dtype_suffix(scales.dtype()) + "_b" + std::to_string(bits_);
    CUfunction f = cuda_function(
        s, gate_ ? fatbin::gate_qmv_silu_mul() : fatbin::quantized_matmul(), name);
    std::vector<const void*> in;
    for (const auto& a : inputs) {
      in.push_back(device_ptr(a));
    }
    void* out = device_ptr_mut(outputs[0]);
    int group_size = group_size_;
    std::vector<void*> args;
    for (auto& p : in) {
      args.push_back(&p);
    }
    args.push_back(&out);
    args.push_back(&rows);
    args.push_back(&k_len);
    args.push_back(&n_len);
    args.push_back(&group_size);
    args.push_back(&vec);
    if (rows > 0 && n_len > 0) {
      dim3 grid((n_len + kWarpsPerBlock - 1) / kWarpsPerBlock);
      cuda_enqueue(s, f, grid, dim3(32 * kWarpsPerBlock), inputs, outputs, args);
    }
  }

 private:
  bool gate_;
  int group_size_;
  int bits_;
};

} // namespace

std::shared_ptr<GpuBody> quantized_matmul_cuda(int group_size, int bits) {
  return std::make_shared<QmvCuda>(KernelId::QuantizedMatmul, false, group_size, bits);
}

std::shared_ptr<GpuBody> gate_qmv_silu_mul_cuda(int group_size, int bits) {
  return std::make_shared<QmvCuda>(KernelId::GateQmvSiluMul, true, group_size, bits);
}

} // namespace mlx_backend
