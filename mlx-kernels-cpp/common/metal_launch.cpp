// metal-cpp's selectors and class symbols for this library's own calls
// (hidden symbols, one definition per image, as metal-cpp's README asks of
// exactly one translation unit).
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#define CA_PRIVATE_IMPLEMENTATION
#include "common/metal_launch.h"

#include <dlfcn.h>
#include <mach-o/dyld.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

std::string executable_dir() {
  uint32_t size = 0;
  _NSGetExecutablePath(nullptr, &size);
  std::vector<char> buf(size + 1, '\0');
  if (_NSGetExecutablePath(buf.data(), &size) != 0) {
    return {};
  }
  std::error_code ec;
  auto path = std::filesystem::weakly_canonical(std::filesystem::path(buf.data()), ec);
  return ec ? std::string() : path.parent_path().string();
}

} // namespace

std::string metallib_path() {
  const std::string file = std::string(MLX_BACKEND_METAL_LIBRARY) + ".metallib";
  if (const char* env = std::getenv("MLX_BACKEND_METALLIB"); env && *env) {
    return env;
  }
  std::string dir = executable_dir();
  if (!dir.empty()) {
    for (auto candidate : {std::filesystem::path(dir) / file, std::filesystem::path(dir).parent_path() / file}) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(candidate, ec)) {
        return candidate.string();
      }
    }
  }
  return MLX_BACKEND_METALLIB;
}

MTL::ComputePipelineState* metal_kernel(const mx::Stream& s, const std::string& name) {
  auto& d = mx::metal::device(s.device);
  // get_library caches by name: the file is read once per device.
  MTL::Library* lib = d.get_library(MLX_BACKEND_METAL_LIBRARY, metallib_path());
  if (!lib) {
    throw std::runtime_error("Metal body: cannot load " + metallib_path());
  }
  MTL::ComputePipelineState* kernel = d.get_kernel(name, lib);
  if (!kernel) {
    throw std::runtime_error("Metal body: no kernel " + name + " in " + metallib_path());
  }
  return kernel;
}

const char* metal_dtype_suffix(mx::Dtype t) {
  if (t == mx::float32) {
    return "f32";
  }
  if (t == mx::float16) {
    return "f16";
  }
  if (t == mx::bfloat16) {
    return "bf16";
  }
  throw std::invalid_argument("Metal kernels take float32, float16 or bfloat16");
}

size_t metal_group_size(MTL::ComputePipelineState* kernel, size_t wanted) {
  const size_t max = kernel->maxTotalThreadsPerThreadgroup();
  size_t threads = (std::max<size_t>(wanted, 1) + 31) / 32 * 32;
  return std::min(threads, max / 32 * 32);
}

} // namespace mlx_backend
