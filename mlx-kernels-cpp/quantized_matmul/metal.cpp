#include "quantized_matmul/metal.h"

#include <stdexcept>

#include "common/fallback_primitive.h"
#include "common/metal_launch.h"
#include "quantized_matmul/qmv_shape.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kSimdgroups = 4; // kQmvSimdgroups in common/metal_qmv.h

class QmvMetal : public GpuBody {
 public:
  QmvMetal(KernelId id, QmvForm form, int group_size, int bits)
      : GpuBody(id), form_(form), group_size_(group_size), bits_(bits) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs) override {
    const bool gather = form_ == QmvForm::GatherGate;
    const auto& x = inputs[0];
    const auto& scales = inputs[gather ? 3 : 2];
    int k_len = x.shape(-1);
    int rows = k_len > 0 ? static_cast<int>(x.size() / k_len) : 0;
    int n_len = outputs[0].shape(-1);
    if (!gather && rows > kMetalQmvMaxRows) {
      throw std::logic_error("qmv Metal body: more rows than it takes (the op checks this)");
    }
    allocate(outputs[0]);
    int pairs = gather ? static_cast<int>(inputs[1].size()) : 1;
    if (rows == 0 || n_len == 0 || pairs == 0) {
      return;
    }
    const char* prefix = form_ == QmvForm::Plain ? "mlx_backend_qmv_"
        : gather                                 ? "mlx_backend_gather_gate_qmv_"
                                                 : "mlx_backend_gate_qmv_";
    QmvShape shape = gather ? QmvShape{1, 1} : qmv_shape(rows, form_ == QmvForm::Gate);
    std::string name = std::string(prefix) + metal_dtype_suffix(x.dtype()) + "_" +
        metal_dtype_suffix(scales.dtype()) + "_b" + std::to_string(bits_);
    if (!gather) {
      name += "_r" + std::to_string(shape.rows);
    }
    MTL::ComputePipelineState* kernel = metal_kernel(s, name);
    // The kernels index simdgroups up to kSimdgroups - 1 per threadgroup.
    if (kernel->maxTotalThreadsPerThreadgroup() < static_cast<NS::UInteger>(32 * kSimdgroups)) {
      throw std::runtime_error("qmv Metal body: " + name + " takes fewer threads per threadgroup than it needs");
    }
    auto& enc = mx::metal::get_command_encoder(s);
    enc.set_compute_pipeline_state(kernel);
    int idx = 0;
    for (const auto& a : inputs) {
      enc.set_input_array(a, idx++);
    }
    enc.set_output_array(outputs[0], idx++);
    int group_size = group_size_;
    if (gather) {
      int top_k = inputs[1].ndim() > 0 ? inputs[1].shape(-1) : 1;
      int experts = inputs[2].shape(0);
      enc.set_bytes(top_k, idx++);
      enc.set_bytes(experts, idx++);
    } else {
      enc.set_bytes(rows, idx++);
    }
    enc.set_bytes(k_len, idx++);
    enc.set_bytes(n_len, idx++);
    enc.set_bytes(group_size, idx++);
    int per_group = kSimdgroups * shape.cols;
    MTL::Size grid((n_len + per_group - 1) / per_group, pairs, 1);
    enc.dispatch_threadgroups(grid, MTL::Size(32 * kSimdgroups, 1, 1));
  }

 private:
  QmvForm form_;
  int group_size_;
  int bits_;
};

} // namespace

std::shared_ptr<GpuBody> quantized_matmul_metal(int group_size, int bits) {
  return std::make_shared<QmvMetal>(KernelId::QuantizedMatmul, QmvForm::Plain, group_size, bits);
}

std::shared_ptr<GpuBody> gate_qmv_silu_mul_metal(int group_size, int bits) {
  return std::make_shared<QmvMetal>(KernelId::GateQmvSiluMul, QmvForm::Gate, group_size, bits);
}

std::shared_ptr<GpuBody> gather_gate_qmv_silu_mul_metal(int group_size, int bits) {
  return std::make_shared<QmvMetal>(KernelId::GateQmvSiluMul, QmvForm::GatherGate, group_size, bits);
}

} // namespace mlx_backend
