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
};

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
    d.module_load_data =
        reinterpret_cast<decltype(d.module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    d.module_get_function =
        reinterpret_cast<decltype(d.module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    d.get_error_string =
        reinterpret_cast<decltype(d.get_error_string)>(dlsym(lib, "cuGetErrorString"));
    if (!d.module_load_data || !d.module_get_function || !d.get_error_string) {
      throw std::runtime_error("libcuda.so.1 lacks cuModuleLoadData/cuModuleGetFunction");
    }
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
