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

DenseInput::DenseInput(const mx::array& a, const char* what)
    : src_(a), dense_(a), copy_(!a.flags().row_contiguous) {
  if (!copy_) {
    return;
  }
  dense_ = mx::array(a.shape(), a.dtype(), nullptr, {});
  auto data = mx::allocator::malloc(dense_.nbytes());
  if (dense_.nbytes() > 0 && data.buffer().ptr() == nullptr) {
    throw std::runtime_error(
        std::string(what) + ": could not allocate " + std::to_string(dense_.nbytes()) +
        " bytes for a dense copy of a view");
  }
  dense_.set_data(std::move(data));
}

void DenseInput::fill() {
  if (!copy_ || src_.size() == 0) {
    return;
  }
  const auto es = static_cast<int64_t>(src_.itemsize());
  const uint8_t* in = src_.data<uint8_t>();
  uint8_t* out = dense_.data<uint8_t>();
  const int nd = static_cast<int>(src_.ndim());
  if (nd == 0) {
    std::memcpy(out, in, es);
    return;
  }
  const auto& shape = src_.shape();
  const auto& strides = src_.strides();
  const int64_t inner = shape[nd - 1];
  const int64_t inner_stride = strides[nd - 1];
  const int64_t rows = static_cast<int64_t>(src_.size()) / inner;
  std::vector<int64_t> idx(nd, 0);
  int64_t offset = 0; // element offset of the current row's first element
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inner; ++i) {
      std::memcpy(out + (r * inner + i) * es, in + (offset + i * inner_stride) * es, es);
    }
    for (int d = nd - 2; d >= 0; --d) {
      offset += strides[d];
      if (++idx[d] < shape[d]) {
        break;
      }
      offset -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

void require_row_contiguous(const mx::array& a, const char* what) {
  if (!a.flags().row_contiguous) {
    throw std::logic_error(std::string(what) + " reached a kernel without being made contiguous");
  }
}

mx::cpu::CommandEncoder& begin_dense_eval(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    const char* what) {
  for (const auto& in : inputs) {
    require_row_contiguous(in, what);
  }
  allocate(out);
  auto& enc = mx::cpu::get_command_encoder(stream);
  for (const auto& in : inputs) {
    enc.set_input_array(in);
  }
  enc.set_output_array(out);
  return enc;
}

mx::array dense_input(const mx::array& a, mx::Stream s) {
  if (a.status() != mx::array::Status::unscheduled && a.flags().row_contiguous) {
    return a;
  }
  return mx::contiguous(a, false, s);
}

bool is_float(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

} // namespace mlx_backend
