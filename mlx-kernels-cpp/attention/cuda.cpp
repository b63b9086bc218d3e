#include "attention/cuda.h"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>

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

// Lets `f` take `bytes` of dynamic shared memory: above 48 KB a kernel must
// opt in (the prefill kernels' tiles at head sizes of 128 and up). The
// entry point comes from the libcuda that libmlx loaded, as in
// common/cuda_launch.cpp.
void allow_shared_bytes(CUfunction f, unsigned bytes) {
  using SetAttribute = CUresult (*)(CUfunction, CUfunction_attribute, int);
  static std::mutex mutex;
  static std::set<std::pair<CUfunction, unsigned>> done;
  static SetAttribute set_attribute = nullptr;
  if (bytes <= 48 * 1024) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count({f, bytes})) {
    return;
  }
  if (!set_attribute) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
      lib = dlopen("libcuda.so.1", RTLD_NOW);
    }
    set_attribute = lib ? reinterpret_cast<SetAttribute>(dlsym(lib, "cuFuncSetAttribute")) : nullptr;
    if (!set_attribute) {
      throw std::runtime_error("attention CUDA body: libcuda.so.1 lacks cuFuncSetAttribute");
    }
  }
  if (set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)) !=
      CUDA_SUCCESS) {
    throw std::runtime_error("attention CUDA body: cannot allow the prefill kernel its shared memory");
  }
  done.insert({f, bytes});
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
    if (causal_ && s_len < l_len) {
      throw std::logic_error("attention CUDA body: causal with fewer keys than queries (the op checks this)");
    }
    auto& out = outputs[0];
    allocate(out);
    if (out.size() == 0) {
      return;
    }
    const char* dt = dtype_suffix(q.dtype());
    AttentionArgs args{
        device_ptr(in[0]), device_ptr(in[1]), device_ptr(in[2]), device_ptr_mut(out), nullptr,
        strides_of(in[0]), strides_of(in[1]), strides_of(in[2]), hq, hkv, l_len, s_len, d,
        scale_, causal_, 1, false};
    if (l_len > kAttentionDecodeMaxRows) {
      enqueue_prefill(s, in, outputs, args, dt);
      return;
    }
    CUfunction attend = cuda_function(s, fatbin::attention(), std::string("mlx_backend_attention_") + dt);
    int splits = cuda_attention_key_splits(b * hq * l_len, s_len);
    args.splits = splits;
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
  // One block per (query head, batch, tile of query rows); the tiles are
  // the slowest-varying index so that, causal, the heaviest start first
  // (attention/flash.cuh).
  void enqueue_prefill(
      const mx::Stream& s,
      const std::vector<mx::array>& in,
      std::vector<mx::array>& outputs,
      AttentionArgs& args,
      const char* dt) {
    const auto& q = in[0];
    const int dp = flash_padded_dim(args.d);
    const bool f32 = q.dtype() == mx::float32;
    const int rows = f32 ? kFlashF32Rows : kFlashRows;
    const unsigned smem = f32 ? flash_f32_smem_bytes(dp) : flash_tc_smem_bytes(dp, static_cast<int>(q.itemsize()));
    args.vec = true;
    for (int i = 0; i < 3; i++) {
      args.vec = args.vec &&
          flash_rows_vectorizable(
                     device_ptr(in[i]), strides_of(in[i]), args.d, static_cast<int>(q.itemsize()));
    }
    CUfunction f = cuda_function(
        s, fatbin::attention(),
        std::string("mlx_backend_attention_flash_") + dt + "_d" + std::to_string(dp));
    allow_shared_bytes(f, smem);
    const int tiles = (args.l_len + rows - 1) / rows;
    cuda_enqueue(
        s, f, dim3(args.hq, q.shape(0), tiles), dim3(kFlashThreads), in, outputs, {&args}, smem);
  }

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
