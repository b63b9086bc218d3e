#include "quantized_matmul/cuda.h"

#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "mlx_backend_fatbins.h"
#include "quantized_matmul/qmm_tiles.h"
#include "quantized_matmul/qmv_shape.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kWarpsPerBlock = 4; // kQmvWarpsPerBlock in common/qmv.cuh

class QmvCuda : public GpuBody {
 public:
  QmvCuda(KernelId id, QmvForm form, int group_size, int bits)
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
    int rows = static_cast<int>(x.size() / k_len);
    int n_len = outputs[0].shape(-1);
    if (rows > kCudaQmvMaxRows) {
      if (form_ != QmvForm::Plain) {
        throw std::logic_error("gate qmv CUDA body: more rows than it takes (the op checks this)");
      }
      enqueue_qmm(s, inputs, outputs, rows, k_len, n_len);
      return;
    }
    allocate(outputs[0]);
    bool vec = aligned16(inputs) && aligned16(outputs);
    const char* prefix = form_ == QmvForm::Plain ? "mlx_backend_qmv_"
        : gather                                 ? "mlx_backend_gather_gate_qmv_"
                                                 : "mlx_backend_gate_qmv_";
    QmvShape shape = gather ? QmvShape{1, 1} : qmv_shape(rows, form_ == QmvForm::Gate);
    std::string name = std::string(prefix) + dtype_suffix(x.dtype()) + "_" +
        dtype_suffix(scales.dtype()) + "_b" + std::to_string(bits_);
    if (!gather) {
      name += "_r" + std::to_string(shape.rows);
    }
    CUfunction f = cuda_function(
        s, form_ == QmvForm::Plain ? fatbin::quantized_matmul() : fatbin::gate_qmv_silu_mul(),
        name);
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
    // The expert-indexed form: one grid row per (row, k) pair.
    int pairs = gather ? static_cast<int>(inputs[1].size()) : 1;
    int top_k = gather && inputs[1].ndim() > 0 ? inputs[1].shape(-1) : 1;
    int experts = gather ? inputs[2].shape(0) : 0;
    if (gather) {
      if (pairs > 65535) {
        throw std::logic_error("gather qmv CUDA body: more (row, expert) pairs than a grid takes");
      }
      args.push_back(&top_k);
      args.push_back(&experts);
    } else {
      args.push_back(&rows);
    }
    args.push_back(&k_len);
    args.push_back(&n_len);
    args.push_back(&group_size);
    args.push_back(&vec);
    if (rows > 0 && n_len > 0 && pairs > 0) {
      int per_block = kWarpsPerBlock * shape.cols;
      dim3 grid((n_len + per_block - 1) / per_block, pairs);
      cuda_enqueue(s, f, grid, dim3(32 * kWarpsPerBlock), inputs, outputs, args);
    }
  }

 private:
  // More than kCudaQmvMaxRows rows of a plain projection: the tiled kernels
  // of common/qmm.cuh, the tile from qmm_tiles.h (f32 x: exact f32 FMAs;
  // f16/bf16: tensor cores).
  void enqueue_qmm(
      const mx::Stream& s,
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs,
      int rows,
      int k_len,
      int n_len) {
    const auto& x = inputs[0];
    const bool f32 = x.dtype() == mx::float32;
    const qmm::Tile& tile = f32 ? qmm::kF32Tiles[qmm::pick_tile(qmm::kF32Tiles, rows, n_len)]
                                : qmm::kHalfTiles[qmm::pick_tile(qmm::kHalfTiles, rows, n_len)];
    const long col_blocks = (static_cast<long>(n_len) + tile.bn - 1) / tile.bn;
    if (col_blocks > 65535) {
      throw std::logic_error("qmm CUDA body: more output columns than a grid takes");
    }
    allocate(outputs[0]);
    if (n_len == 0) {
      return;
    }
    std::string name = std::string("mlx_backend_qmm_") + dtype_suffix(x.dtype()) + "_" +
        dtype_suffix(inputs[2].dtype()) + "_b" + std::to_string(bits_) + "_" + tile.name;
    CUfunction f = cuda_function(s, fatbin::quantized_matmul(), name);
    std::vector<const void*> in;
    for (const auto& a : inputs) {
      in.push_back(device_ptr(a));
    }
    void* out = device_ptr_mut(outputs[0]);
    int group_size = group_size_;
    bool vec = aligned16(inputs) && aligned16(outputs);
    std::vector<void*> args{&in[0], &in[1], &in[2], &in[3], &out, &rows, &k_len, &n_len,
                            &group_size, &vec};
    dim3 grid((rows + tile.bm - 1) / tile.bm, static_cast<unsigned>(col_blocks));
    cuda_enqueue(s, f, grid, dim3(tile.threads), inputs, outputs, args);
  }

  QmvForm form_;
  int group_size_;
  int bits_;
};

} // namespace

std::shared_ptr<GpuBody> quantized_matmul_cuda(int group_size, int bits) {
  return std::make_shared<QmvCuda>(KernelId::QuantizedMatmul, QmvForm::Plain, group_size, bits);
}

std::shared_ptr<GpuBody> gate_qmv_silu_mul_cuda(int group_size, int bits) {
  return std::make_shared<QmvCuda>(KernelId::GateQmvSiluMul, QmvForm::Gate, group_size, bits);
}

std::shared_ptr<GpuBody> gather_gate_qmv_silu_mul_cuda(int group_size, int bits) {
  return std::make_shared<QmvCuda>(
      KernelId::GateQmvSiluMul, QmvForm::GatherGate, group_size, bits);
}

} // namespace mlx_backend
