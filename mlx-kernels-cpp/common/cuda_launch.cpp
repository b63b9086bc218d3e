#include "common/cuda_launch.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

// The driver entry points, taken from the libcuda that libmlx already
// loaded (so this library needs no link-time libcuda).
struct Driver {
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*graph_create)(CUgraph*, unsigned int) = nullptr;
  CUresult (*graph_destroy)(CUgraph) = nullptr;
  CUresult (*graph_add_kernel_node)(
      CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*graph_exec_destroy)(CUgraphExec) = nullptr;
  CUresult (*graph_launch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
};

template <typename F>
void bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) {
    throw std::runtime_error(std::string("libcuda.so.1 lacks ") + name);
  }
}

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
      lib = dlopen("libcuda.so.1", RTLD_NOW);
    }
    if (!lib) {
      throw std::runtime_error(std::string("cannot open libcuda.so.1: ") + dlerror());
    }
    bind(lib, d.module_load_data, "cuModuleLoadData");
    bind(lib, d.module_get_function, "cuModuleGetFunction");
    bind(lib, d.get_error_string, "cuGetErrorString");
    bind(lib, d.graph_create, "cuGraphCreate");
    bind(lib, d.graph_destroy, "cuGraphDestroy");
    // The versions cuda.h maps these names to.
    bind(lib, d.graph_add_kernel_node, "cuGraphAddKernelNode_v2");
    bind(lib, d.graph_instantiate, "cuGraphInstantiateWithFlags");
    bind(lib, d.graph_exec_destroy, "cuGraphExecDestroy");
    bind(lib, d.graph_launch, "cuGraphLaunch");
    bind(lib, d.memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
    bind(lib, d.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
    return d;
  }();
  return d;
}

void check(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    driver().get_error_string(r, &msg);
    throw std::runtime_error(what + ": " + (msg ? msg : "unknown CUDA error"));
  }
}

} // namespace

CUfunction cuda_function(const mx::Stream& s, std::string_view fatbin, const std::string& name) {
  // Modules per (device, fatbin); functions per (device, fatbin, name).
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, CUmodule> modules;
  static std::map<std::tuple<int, const void*, std::string>, CUfunction> functions;
  auto& encoder = mx::cu::get_command_encoder(s);
  int device = encoder.device().cuda_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto fkey = std::make_tuple(device, static_cast<const void*>(fatbin.data()), name);
  if (auto it = functions.find(fkey); it != functions.end()) {
    return it->second;
  }
  auto mkey = std::make_pair(device, static_cast<const void*>(fatbin.data()));
  auto it = modules.find(mkey);
  if (it == modules.end()) {
    encoder.device().make_current();
    CUmodule module = nullptr;
    check(driver().module_load_data(&module, fatbin.data()), "loading the CUDA module of " + name);
    it = modules.emplace(mkey, module).first;
  }
  CUfunction f = nullptr;
  check(driver().module_get_function(&f, it->second, name.c_str()), "finding CUDA kernel " + name);
  functions.emplace(fkey, f);
  return f;
}

void cuda_enqueue(
    const mx::Stream& s,
    CUfunction f,
    dim3 grid,
    dim3 block,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs,
    std::vector<void*> args,
    unsigned shared_bytes) {
  auto& encoder = mx::cu::get_command_encoder(s);
  for (const auto& in : inputs) {
    encoder.set_input_array(in);
  }
  for (auto& out : outputs) {
    encoder.set_output_array(out);
  }
  encoder.add_kernel_node_raw(f, grid, block, dim3(), shared_bytes, args.data());
}

KernelChain::KernelChain(const mx::Stream& s) {
  mx::cu::get_command_encoder(s).device().make_current();
  check(driver().graph_create(&graph_, 0), "creating a CUDA graph");
}

KernelChain::~KernelChain() {
  // A launched graph still running is freed when it completes.
  if (exec_) {
    driver().graph_exec_destroy(exec_);
  }
  if (graph_) {
    driver().graph_destroy(graph_);
  }
}

void KernelChain::add(CUfunction f, dim3 grid, dim3 block, std::vector<void*> args, unsigned shared_bytes) {
  if (exec_) {
    throw std::logic_error("KernelChain: kernel added after instantiate");
  }
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = f;
  p.gridDimX = grid.x;
  p.gridDimY = grid.y;
  p.gridDimZ = grid.z;
  p.blockDimX = block.x;
  p.blockDimY = block.y;
  p.blockDimZ = block.z;
  p.sharedMemBytes = shared_bytes;
  p.kernelParams = args.data();
  CUgraphNode node = nullptr;
  check(
      driver().graph_add_kernel_node(&node, graph_, last_ ? &last_ : nullptr, last_ ? 1 : 0, &p),
      "adding a kernel to a CUDA graph");
  last_ = node;
  count_++;
}

void KernelChain::instantiate() {
  check(driver().graph_instantiate(&exec_, graph_, 0), "instantiating a CUDA graph");
}

void KernelChain::launch(CUstream stream) const {
  check(driver().graph_launch(exec_, stream), "launching a CUDA graph");
}

CUstream flushed_stream(const mx::Stream& s) {
  auto& encoder = mx::cu::get_command_encoder(s);
  encoder.commit();
  encoder.device().make_current();
  return static_cast<CUstream>(static_cast<cudaStream_t>(encoder.stream()));
}

void copy_host_to_device(void* dst, const void* src, size_t bytes, CUstream stream) {
  check(
      driver().memcpy_htod_async(reinterpret_cast<CUdeviceptr>(dst), src, bytes, stream),
      "copying to the GPU");
}

void copy_device_to_device(void* dst, const void* src, size_t bytes, CUstream stream) {
  check(
      driver().memcpy_dtod_async(
          reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes, stream),
      "copying on the GPU");
}

void keep_until_done(const mx::Stream& s, const mx::array& a) {
  mx::cu::get_command_encoder(s).add_temporary(a);
}

const void* device_ptr(const mx::array& a) {
  return mx::gpu_ptr<void>(a);
}

void* device_ptr_mut(mx::array& a) {
  return mx::gpu_ptr<void>(a);
}

bool aligned16(const std::vector<mx::array>& arrays) {
  for (const auto& a : arrays) {
    if (reinterpret_cast<std::uintptr_t>(mx::gpu_ptr<void>(a)) % 16 != 0) {
      return false;
    }
  }
  return true;
}

const char* dtype_suffix(mx::Dtype t) {
  if (t == mx::float32) {
    return "f32";
  }
  if (t == mx::float16) {
    return "f16";
  }
  if (t == mx::bfloat16) {
    return "bf16";
  }
  throw std::invalid_argument("CUDA kernels take float32, float16 or bfloat16");
}

} // namespace mlx_backend
