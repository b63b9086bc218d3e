#include "common/fallback_primitive.h"

namespace mx = mlx::core;

namespace mlx_backend {

std::vector<mx::array> FallbackPrimitive::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  auto [_, all] = mx::vjp(fallback_, primals, cotangents);
  std::vector<mx::array> out;
  for (int a : argnums) {
    out.push_back(all[a]);
  }
  return out;
}

std::vector<mx::array> FallbackPrimitive::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  // The fallback wants a tangent per primal: zeros where none was asked for.
  std::vector<mx::array> all;
  for (size_t i = 0, j = 0; i < primals.size(); ++i) {
    if (j < argnums.size() && static_cast<size_t>(argnums[j]) == i) {
      all.push_back(tangents[j++]);
    } else {
      all.push_back(mx::zeros_like(primals[i]));
    }
  }
  auto [_, jvps] = mx::jvp(fallback_, primals, all);
  return jvps;
}

std::pair<std::vector<mx::array>, std::vector<int>> FallbackPrimitive::vmap(
    const std::vector<mx::array>& inputs,
    const std::vector<int>& axes) {
  auto outputs = mx::vmap(fallback_, axes)(inputs);
  std::vector<int> out_axes(outputs.size(), 0);
  return {outputs, out_axes};
}

void allocate(mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
}

rust::Slice<const uint8_t> bytes_of(const mx::array& a) {
  return rust::Slice<const uint8_t>(a.data<uint8_t>(), a.nbytes());
}

rust::Slice<uint8_t> bytes_of_mut(mx::array& a) {
  return rust::Slice<uint8_t>(a.data<uint8_t>(), a.nbytes());
}

void poison(mx::array& out) {
  switch (out.dtype().val()) {
    case mx::Dtype::Val::float32: {
      auto p = out.data<float>();
      std::fill(p, p + out.size(), std::numeric_limits<float>::quiet_NaN());
      break;
    }
    case mx::Dtype::Val::float16: {
      auto p = out.data<mx::float16_t>();
      std::fill(p, p + out.size(), mx::float16_t(std::numeric_limits<float>::quiet_NaN()));
      break;
    }
    case mx::Dtype::Val::bfloat16: {
      auto p = out.data<mx::bfloat16_t>();
      std::fill(p, p + out.size(), mx::bfloat16_t(std::numeric_limits<float>::quiet_NaN()));
      break;
    }
    default:
      std::memset(out.data<uint8_t>(), 0xff, out.nbytes());
  }
}

void require_row_contiguous(const mx::array& a, const char* what) {
  if (!a.flags().row_contiguous) {
    throw std::logic_error(std::string(what) + " reached a kernel without being made contiguous");
  }
}

bool is_float(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

} // namespace mlx_backend
