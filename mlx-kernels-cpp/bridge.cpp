// Shims over mlx::core for the cxx bridge; see bridge.h.
#include "bridge.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include "common/affine_qmm.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

mx::Shape to_shape(rust::Slice<const int32_t> s) {
  return mx::Shape(s.begin(), s.end());
}

std::vector<int> to_ints(rust::Slice<const int32_t> s) {
  return std::vector<int>(s.begin(), s.end());
}

std::optional<array> opt(const array* a) {
  return a ? std::optional<array>(*a) : std::nullopt;
}

mx::Device to_device(const DeviceSpec& d) {
  return mx::Device(
      d.device_type == 1 ? mx::Device::gpu : mx::Device::cpu, d.device_index);
}

DeviceSpec from_device(const mx::Device& d) {
  return DeviceSpec{d.type == mx::Device::gpu ? 1 : 0, d.index};
}

StreamSpec from_stream(const mx::Stream& s) {
  return StreamSpec{s.index, from_device(s.device)};
}

template <typename T>
array typed_from_bytes(
    rust::Slice<const uint8_t> data,
    mx::Shape shape,
    mx::Dtype dtype) {
  return array(reinterpret_cast<const T*>(data.data()), std::move(shape), dtype);
}

} // namespace

mx::Stream to_stream(const StreamSpec& s) {
  return mx::Stream(s.index, to_device(s.device));
}

mx::Dtype to_dtype(int32_t code) {
  switch (static_cast<mx::Dtype::Val>(code)) {
    case mx::Dtype::Val::bool_:
      return mx::bool_;
    case mx::Dtype::Val::uint8:
      return mx::uint8;
    case mx::Dtype::Val::uint16:
      return mx::uint16;
    case mx::Dtype::Val::uint32:
      return mx::uint32;
    case mx::Dtype::Val::uint64:
      return mx::uint64;
    case mx::Dtype::Val::int8:
      return mx::int8;
    case mx::Dtype::Val::int16:
      return mx::int16;
    case mx::Dtype::Val::int32:
      return mx::int32;
    case mx::Dtype::Val::int64:
      return mx::int64;
    case mx::Dtype::Val::float16:
      return mx::float16;
    case mx::Dtype::Val::float32:
      return mx::float32;
    case mx::Dtype::Val::float64:
      return mx::float64;
    case mx::Dtype::Val::bfloat16:
      return mx::bfloat16;
    case mx::Dtype::Val::complex64:
      return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(code));
}

ArrayPtr wrap(array a) {
  return std::make_unique<array>(std::move(a));
}

// ---- devices and streams

DeviceSpec default_device() {
  return from_device(mx::default_device());
}

void set_default_device(DeviceSpec device) {
  mx::set_default_device(to_device(device));
}

bool device_is_available(DeviceSpec device) {
  return mx::is_available(to_device(device));
}

int32_t device_count(int32_t device_type) {
  return mx::device_count(device_type == 1 ? mx::Device::gpu : mx::Device::cpu);
}

StreamSpec default_stream(DeviceSpec device) {
  return from_stream(mx::default_stream(to_device(device)));
}

StreamSpec new_stream(DeviceSpec device) {
  return from_stream(mx::new_stream(to_device(device)));
}

void set_default_stream(StreamSpec stream) {
  mx::set_default_stream(to_stream(stream));
}

void synchronize(StreamSpec stream) {
  mx::synchronize(to_stream(stream));
}

// ---- memory

size_t active_memory() {
  return mx::get_active_memory();
}
size_t peak_memory() {
  return mx::get_peak_memory();
}
void reset_peak_memory() {
  mx::reset_peak_memory();
}
size_t cache_memory() {
  return mx::get_cache_memory();
}
size_t set_memory_limit(size_t limit) {
  return mx::set_memory_limit(limit);
}
size_t memory_limit() {
  return mx::get_memory_limit();
}
size_t set_cache_limit(size_t limit) {
  return mx::set_cache_limit(limit);
}
void clear_cache() {
  mx::clear_cache();
}

// ---- arrays and host I/O

ArrayPtr from_bytes(
    rust::Slice<const uint8_t> data,
    rust::Slice<const int32_t> shape,
    int32_t dtype_code) {
  auto dtype = to_dtype(dtype_code);
  auto shp = to_shape(shape);
  size_t count = 1;
  for (auto d : shp) {
    if (d < 0) {
      throw std::invalid_argument("negative dimension in shape");
    }
    count *= static_cast<size_t>(d);
  }
  if (count * dtype.size() != data.size()) {
    throw std::invalid_argument(
        "host buffer holds " + std::to_string(data.size()) + " bytes but shape needs " +
        std::to_string(count * dtype.size()));
  }
  switch (dtype.val()) {
    case mx::Dtype::Val::bool_:
      return wrap(typed_from_bytes<bool>(data, shp, dtype));
    case mx::Dtype::Val::uint8:
      return wrap(typed_from_bytes<uint8_t>(data, shp, dtype));
    case mx::Dtype::Val::uint16:
      return wrap(typed_from_bytes<uint16_t>(data, shp, dtype));
    case mx::Dtype::Val::uint32:
      return wrap(typed_from_bytes<uint32_t>(data, shp, dtype));
    case mx::Dtype::Val::uint64:
      return wrap(typed_from_bytes<uint64_t>(data, shp, dtype));
    case mx::Dtype::Val::int8:
      return wrap(typed_from_bytes<int8_t>(data, shp, dtype));
    case mx::Dtype::Val::int16:
      return wrap(typed_from_bytes<int16_t>(data, shp, dtype));
    case mx::Dtype::Val::int32:
      return wrap(typed_from_bytes<int32_t>(data, shp, dtype));
    case mx::Dtype::Val::int64:
      return wrap(typed_from_bytes<int64_t>(data, shp, dtype));
    case mx::Dtype::Val::float16:
      return wrap(typed_from_bytes<mx::float16_t>(data, shp, dtype));
    case mx::Dtype::Val::float32:
      return wrap(typed_from_bytes<float>(data, shp, dtype));
    case mx::Dtype::Val::float64:
      return wrap(typed_from_bytes<double>(data, shp, dtype));
    case mx::Dtype::Val::bfloat16:
      return wrap(typed_from_bytes<mx::bfloat16_t>(data, shp, dtype));
    case mx::Dtype::Val::complex64:
      return wrap(typed_from_bytes<mx::complex64_t>(data, shp, dtype));
  }
  throw std::invalid_argument("unsupported dtype");
}

ArrayPtr full(rust::Slice<const int32_t> shape, double value, int32_t dtype, StreamSpec s) {
  auto dt = to_dtype(dtype);
  return wrap(mx::full(to_shape(shape), mx::array(value, dt), dt, to_stream(s)));
}

ArrayPtr arange(double start, double stop, double step, int32_t dtype, StreamSpec s) {
  return wrap(mx::arange(start, stop, step, to_dtype(dtype), to_stream(s)));
}

ArrayPtr array_clone(const array& a) {
  return std::make_unique<array>(a);
}

rust::Vec<int32_t> array_shape(const array& a) {
  rust::Vec<int32_t> out;
  out.reserve(a.ndim());
  for (auto d : a.shape()) {
    out.push_back(d);
  }
  return out;
}

int32_t array_dtype(const array& a) {
  return static_cast<int32_t>(a.dtype().val());
}

size_t array_size(const array& a) {
  return a.size();
}

size_t array_nbytes(const array& a) {
  return a.nbytes();
}

bool array_is_pending(const array& a) {
  return a.status() == array::Status::unscheduled && a.has_primitive();
}

void copy_to_host(const array& a, rust::Slice<uint8_t> out) {
  if (out.size() != a.nbytes()) {
    throw std::invalid_argument(
        "host buffer holds " + std::to_string(out.size()) + " bytes but the array has " +
        std::to_string(a.nbytes()));
  }
  // A dense row-major copy: views (transposes, slices, broadcasts) are
  // materialised by MLX, never read as if contiguous.
  auto dense = mx::contiguous(a, false, mx::default_stream(mx::Device::cpu));
  eval(dense);
  dense.wait();
  if (out.size() > 0) {
    std::memcpy(out.data(), dense.data<uint8_t>(), out.size());
  }
}

size_t array_host_data(const array& a) {
  if (a.status() == array::Status::unscheduled) {
    throw std::invalid_argument("the array has not been evaluated");
  }
  array(a).wait();
  if (!a.flags().row_contiguous || a.data_size() != a.size() || a.size() == 0) {
    return 0;
  }
  return reinterpret_cast<size_t>(a.data<uint8_t>());
}

std::unique_ptr<ArrayList> new_array_list() {
  return std::make_unique<ArrayList>();
}

void array_list_push(ArrayList& list, const array& a) {
  list.items.push_back(a);
}

size_t array_list_len(const ArrayList& list) {
  return list.items.size();
}

ArrayPtr array_list_get(const ArrayList& list, size_t index) {
  return wrap(list.items.at(index));
}

// ---- evaluation

namespace {

// MLX's CPU allocator hands back a null buffer when malloc fails, and the
// kernel then writes through it (a segfault, not an exception). So before a
// graph is evaluated, refuse any output that would need a buffer larger than
// the memory limit: such a malloc is the one that fails. Broadcasts are views
// and allocate nothing, whatever their size.
void check_allocations(const std::vector<array>& outputs) {
  const size_t limit = mx::get_memory_limit();
  // Pointers, not array copies: the outputs keep the graph alive while this
  // runs, and copying every input (a weight table per fused block) cost an
  // atomic count per edge, a tenth of a millisecond per decode step.
  auto pending = [](const array& a) {
    return a.status() == array::Status::unscheduled && a.has_primitive();
  };
  std::unordered_set<std::uintptr_t> seen;
  std::vector<const array*> todo;
  for (const auto& a : outputs) {
    if (pending(a)) {
      todo.push_back(&a);
    }
  }
  while (!todo.empty()) {
    const array& a = *todo.back();
    todo.pop_back();
    if (!seen.insert(a.id()).second) {
      continue;
    }
    std::string_view name = a.primitive().name();
    if (a.nbytes() > limit && name != "Broadcast" && name != "BroadcastAxes") {
      throw std::runtime_error(
          "[eval] " + std::string(name) + " needs " + std::to_string(a.nbytes()) +
          " bytes, more than the memory limit of " + std::to_string(limit) + " bytes");
    }
    for (const auto& in : a.inputs()) {
      if (pending(in)) {
        todo.push_back(&in);
      }
    }
  }
}

} // namespace

void eval(const array& a) {
  check_allocations({a});
  mx::eval(a);
}

void eval_list(const ArrayList& list) {
  check_allocations(list.items);
  mx::eval(list.items);
}

void async_eval_list(const ArrayList& list) {
  check_allocations(list.items);
  mx::async_eval(list.items);
}

// ---- ops

ArrayPtr unary(int32_t op, const array& a, StreamSpec spec) {
  auto s = to_stream(spec);
  switch (op) {
    case 0:
      return wrap(mx::abs(a, s));
    case 1:
      return wrap(mx::negative(a, s));
    case 2:
      return wrap(mx::exp(a, s));
    case 3:
      return wrap(mx::log(a, s));
    case 4:
      return wrap(mx::sqrt(a, s));
    case 5:
      return wrap(mx::rsqrt(a, s));
    case 6:
      return wrap(mx::sin(a, s));
    case 7:
      return wrap(mx::cos(a, s));
    case 8:
      return wrap(mx::tanh(a, s));
    case 9:
      return wrap(mx::sigmoid(a, s));
    case 10:
      return wrap(mx::square(a, s));
    case 11:
      return wrap(mx::floor(a, s));
    case 12:
      return wrap(mx::ceil(a, s));
    case 13:
      return wrap(mx::erf(a, s));
    case 14:
      return wrap(mx::logical_not(a, s));
    case 15:
      return wrap(mx::reciprocal(a, s));
    case 16:
      return wrap(mx::log1p(a, s));
    case 17:
      return wrap(mx::sign(a, s));
    case 18: // silu, as mlx.nn.silu: x * sigmoid(x)
      return wrap(mx::multiply(a, mx::sigmoid(a, s), s));
    case 19: { // gelu, as mlx.nn.gelu: x * (1 + erf(x / sqrt(2))) / 2
      auto half_x = mx::multiply(a, mx::array(0.5f, a.dtype()), s);
      auto e = mx::erf(mx::multiply(a, mx::array(float(M_SQRT1_2), a.dtype()), s), s);
      return wrap(mx::multiply(half_x, mx::add(e, mx::array(1.0f, a.dtype()), s), s));
    }
    case 20:
      return wrap(mx::stop_gradient(a, s));
    case 21:
      return wrap(mx::round(a, 0, s));
  }
  throw std::invalid_argument("unknown unary op code " + std::to_string(op));
}

ArrayPtr binary(int32_t op, const array& a, const array& b, StreamSpec spec) {
  auto s = to_stream(spec);
  switch (op) {
    case 0:
      return wrap(mx::add(a, b, s));
    case 1:
      return wrap(mx::subtract(a, b, s));
    case 2:
      return wrap(mx::multiply(a, b, s));
    case 3:
      return wrap(mx::divide(a, b, s));
    case 4:
      return wrap(mx::power(a, b, s));
    case 5:
      return wrap(mx::maximum(a, b, s));
    case 6:
      return wrap(mx::minimum(a, b, s));
    case 7:
      return wrap(mx::equal(a, b, s));
    case 8:
      return wrap(mx::not_equal(a, b, s));
    case 9:
      return wrap(mx::less(a, b, s));
    case 10:
      return wrap(mx::less_equal(a, b, s));
    case 11:
      return wrap(mx::greater(a, b, s));
    case 12:
      return wrap(mx::greater_equal(a, b, s));
    case 13:
      return wrap(mx::logical_and(a, b, s));
    case 14:
      return wrap(mx::logical_or(a, b, s));
    case 15:
      return wrap(mx::remainder(a, b, s));
    case 16:
      return wrap(mx::floor_divide(a, b, s));
  }
  throw std::invalid_argument("unknown binary op code " + std::to_string(op));
}

ArrayPtr reduce(
    int32_t op,
    const array& a,
    rust::Slice<const int32_t> axes_slice,
    bool keepdims,
    StreamSpec spec) {
  auto s = to_stream(spec);
  std::vector<int> axes = to_ints(axes_slice);
  if (axes.empty()) {
    for (int i = 0; i < static_cast<int>(a.ndim()); ++i) {
      axes.push_back(i);
    }
  }
  switch (op) {
    case 0:
      return wrap(mx::sum(a, axes, keepdims, s));
    case 1:
      return wrap(mx::mean(a, axes, keepdims, s));
    case 2:
      return wrap(mx::max(a, axes, keepdims, s));
    case 3:
      return wrap(mx::min(a, axes, keepdims, s));
    case 4:
      return wrap(mx::prod(a, axes, keepdims, s));
    case 5:
      return wrap(mx::logsumexp(a, axes, keepdims, s));
    case 6:
      return wrap(mx::all(a, axes, keepdims, s));
    case 7:
      return wrap(mx::any(a, axes, keepdims, s));
  }
  throw std::invalid_argument("unknown reduce op code " + std::to_string(op));
}

ArrayPtr arg_reduce(int32_t op, const array& a, int32_t axis, bool keepdims, StreamSpec spec) {
  auto s = to_stream(spec);
  switch (op) {
    case 0:
      return wrap(mx::argmax(a, axis, keepdims, s));
    case 1:
      return wrap(mx::argmin(a, axis, keepdims, s));
  }
  throw std::invalid_argument("unknown arg-reduce op code " + std::to_string(op));
}

ArrayPtr reshape(const array& a, rust::Slice<const int32_t> shape, StreamSpec s) {
  return wrap(mx::reshape(a, to_shape(shape), to_stream(s)));
}

ArrayPtr transpose(const array& a, rust::Slice<const int32_t> axes, StreamSpec s) {
  if (axes.empty()) {
    return wrap(mx::transpose(a, to_stream(s)));
  }
  return wrap(mx::transpose(a, to_ints(axes), to_stream(s)));
}

ArrayPtr squeeze(const array& a, rust::Slice<const int32_t> axes, StreamSpec s) {
  if (axes.empty()) {
    return wrap(mx::squeeze(a, to_stream(s)));
  }
  return wrap(mx::squeeze(a, to_ints(axes), to_stream(s)));
}

ArrayPtr expand_dims(const array& a, rust::Slice<const int32_t> axes, StreamSpec s) {
  return wrap(mx::expand_dims(a, to_ints(axes), to_stream(s)));
}

ArrayPtr broadcast_to(const array& a, rust::Slice<const int32_t> shape, StreamSpec s) {
  return wrap(mx::broadcast_to(a, to_shape(shape), to_stream(s)));
}

ArrayPtr flatten(const array& a, int32_t start_axis, int32_t end_axis, StreamSpec s) {
  return wrap(mx::flatten(a, start_axis, end_axis, to_stream(s)));
}

ArrayPtr slice(
    const array& a,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides,
    StreamSpec s) {
  return wrap(mx::slice(a, to_shape(start), to_shape(stop), to_shape(strides), to_stream(s)));
}

ArrayPtr slice_update(
    const array& src,
    const array& update,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides,
    StreamSpec s) {
  return wrap(mx::slice_update(
      src, update, to_shape(start), to_shape(stop), to_shape(strides), to_stream(s)));
}

ArrayPtr slice_dynamic(
    const array& a,
    const array& start,
    rust::Slice<const int32_t> axes,
    rust::Slice<const int32_t> size,
    StreamSpec s) {
  return wrap(mx::slice(a, start, to_ints(axes), to_shape(size), to_stream(s)));
}

ArrayPtr slice_update_dynamic(
    const array& src,
    const array& update,
    const array& start,
    rust::Slice<const int32_t> axes,
    StreamSpec s) {
  return wrap(mx::slice_update(src, update, start, to_ints(axes), to_stream(s)));
}

ArrayPtr concatenate(const ArrayList& arrays, int32_t axis, StreamSpec s) {
  return wrap(mx::concatenate(arrays.items, axis, to_stream(s)));
}

ArrayPtr stack(const ArrayList& arrays, int32_t axis, StreamSpec s) {
  return wrap(mx::stack(arrays.items, axis, to_stream(s)));
}

std::unique_ptr<ArrayList> split_sections(
    const array& a,
    rust::Slice<const int32_t> indices,
    int32_t axis,
    StreamSpec s) {
  auto out = std::make_unique<ArrayList>();
  out->items = mx::split(a, to_shape(indices), axis, to_stream(s));
  return out;
}

ArrayPtr take(const array& a, const array& indices, int32_t axis, StreamSpec s) {
  return wrap(mx::take(a, indices, axis, to_stream(s)));
}

ArrayPtr take_along_axis(const array& a, const array& indices, int32_t axis, StreamSpec s) {
  return wrap(mx::take_along_axis(a, indices, axis, to_stream(s)));
}

ArrayPtr put_along_axis(
    const array& a,
    const array& indices,
    const array& values,
    int32_t axis,
    StreamSpec s) {
  return wrap(mx::put_along_axis(a, indices, values, axis, to_stream(s)));
}

ArrayPtr where_(const array& cond, const array& x, const array& y, StreamSpec s) {
  return wrap(mx::where(cond, x, y, to_stream(s)));
}

ArrayPtr astype(const array& a, int32_t dtype, StreamSpec s) {
  return wrap(mx::astype(a, to_dtype(dtype), to_stream(s)));
}

ArrayPtr contiguous(const array& a, StreamSpec s) {
  return wrap(mx::contiguous(a, false, to_stream(s)));
}

ArrayPtr clip(const array& a, double lo, double hi, StreamSpec s) {
  return wrap(mx::clip(
      a, mx::array(lo, a.dtype()), mx::array(hi, a.dtype()), to_stream(s)));
}

ArrayPtr argpartition(const array& a, int32_t kth, int32_t axis, StreamSpec s) {
  return wrap(mx::argpartition(a, kth, axis, to_stream(s)));
}

ArrayPtr topk(const array& a, int32_t k, int32_t axis, StreamSpec s) {
  return wrap(mx::topk(a, k, axis, to_stream(s)));
}

ArrayPtr sort(const array& a, int32_t axis, bool indices, StreamSpec s) {
  if (indices) {
    return wrap(mx::argsort(a, axis, to_stream(s)));
  }
  return wrap(mx::sort(a, axis, to_stream(s)));
}

ArrayPtr cumsum(const array& a, int32_t axis, bool reverse, bool inclusive, StreamSpec s) {
  return wrap(mx::cumsum(a, axis, reverse, inclusive, to_stream(s)));
}

ArrayPtr softmax(const array& a, rust::Slice<const int32_t> axes, bool precise, StreamSpec s) {
  return wrap(mx::softmax(a, to_ints(axes), precise, to_stream(s)));
}

ArrayPtr matmul(const array& a, const array& b, StreamSpec s) {
  return wrap(mx::matmul(a, b, to_stream(s)));
}

ArrayPtr addmm(const array& c, const array& a, const array& b, StreamSpec s) {
  return wrap(mx::addmm(c, a, b, 1.0f, 1.0f, to_stream(s)));
}

namespace {

// MLX divides by both parameters before it validates them (a zero is SIGFPE).
void check_quantization(const char* op, int32_t group_size, int32_t bits) {
  if (group_size <= 0 || bits <= 0) {
    throw std::invalid_argument(
        std::string("[") + op + "] group_size and bits must be positive, got group_size " +
        std::to_string(group_size) + " and bits " + std::to_string(bits));
  }
}

} // namespace

std::unique_ptr<ArrayList>
quantize(const array& w, int32_t group_size, int32_t bits, StreamSpec s) {
  check_quantization("quantize", group_size, bits);
  auto out = std::make_unique<ArrayList>();
  out->items = mx::quantize(w, group_size, bits, "affine", std::nullopt, to_stream(s));
  return out;
}

ArrayPtr dequantize(
    const array& w,
    const array& scales,
    const array* biases,
    int32_t group_size,
    int32_t bits,
    StreamSpec s) {
  check_quantization("dequantize", group_size, bits);
  return wrap(mx::dequantize(
      w,
      scales,
      opt(biases),
      group_size,
      bits,
      "affine",
      std::nullopt,
      std::nullopt,
      to_stream(s)));
}

ArrayPtr quantized_matmul(
    const array& x,
    const array& w,
    const array& scales,
    const array* biases,
    bool transpose,
    int32_t group_size,
    int32_t bits,
    StreamSpec s) {
  check_quantization("quantized_matmul", group_size, bits);
  return wrap(affine_quantized_matmul(
      x, w, scales, opt(biases), transpose, group_size, bits, to_stream(s)));
}

ArrayPtr gather_qmm(
    const array& x,
    const array& w,
    const array& scales,
    const array* biases,
    const array* lhs_indices,
    const array* rhs_indices,
    bool transpose,
    int32_t group_size,
    int32_t bits,
    bool sorted_indices,
    StreamSpec s) {
  check_quantization("gather_qmm", group_size, bits);
  return wrap(mx::gather_qmm(
      x,
      w,
      scales,
      opt(biases),
      opt(lhs_indices),
      opt(rhs_indices),
      transpose,
      group_size,
      bits,
      "affine",
      std::nullopt,
      sorted_indices,
      to_stream(s)));
}

ArrayPtr gather_mm(
    const array& a,
    const array& b,
    const array* lhs_indices,
    const array* rhs_indices,
    bool sorted_indices,
    StreamSpec s) {
  return wrap(mx::gather_mm(
      a, b, opt(lhs_indices), opt(rhs_indices), sorted_indices, to_stream(s)));
}

// ---- fast ops

ArrayPtr fast_rms_norm(const array& x, const array* weight, float eps, StreamSpec s) {
  return wrap(mx::fast::rms_norm(x, opt(weight), eps, to_stream(s)));
}

ArrayPtr fast_layer_norm(
    const array& x,
    const array* weight,
    const array* bias,
    float eps,
    StreamSpec s) {
  return wrap(mx::fast::layer_norm(x, opt(weight), opt(bias), eps, to_stream(s)));
}

ArrayPtr fast_rope(
    const array& x,
    int32_t dims,
    bool traditional,
    float base,
    float scale,
    int32_t offset,
    const array* freqs,
    StreamSpec s) {
  // MLX takes either a base or explicit frequencies, never both.
  std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
  return wrap(mx::fast::rope(x, dims, traditional, b, scale, offset, opt(freqs), to_stream(s)));
}

ArrayPtr fast_rope_dynamic(
    const array& x,
    int32_t dims,
    bool traditional,
    float base,
    float scale,
    const array& offset,
    const array* freqs,
    StreamSpec s) {
  std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
  return wrap(mx::fast::rope(x, dims, traditional, b, scale, offset, opt(freqs), to_stream(s)));
}

ArrayPtr fast_sdpa(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    rust::Str mask_mode,
    const array* mask,
    StreamSpec s) {
  return wrap(mx::fast::scaled_dot_product_attention(
      q, k, v, scale, std::string(mask_mode), opt(mask), std::nullopt, false, to_stream(s)));
}

// ---- random

ArrayPtr random_key(uint64_t seed) {
  return wrap(mx::random::key(seed));
}

void random_seed(uint64_t seed) {
  mx::random::seed(seed);
}

ArrayPtr random_split(const array& key, int32_t num, StreamSpec s) {
  return wrap(mx::random::split(key, num, to_stream(s)));
}

ArrayPtr random_uniform(
    const array& low,
    const array& high,
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    const array* key,
    StreamSpec s) {
  return wrap(mx::random::uniform(
      low, high, to_shape(shape), to_dtype(dtype), opt(key), to_stream(s)));
}

ArrayPtr random_normal(
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    float loc,
    float scale,
    const array* key,
    StreamSpec s) {
  return wrap(mx::random::normal(
      to_shape(shape), to_dtype(dtype), loc, scale, opt(key), to_stream(s)));
}

ArrayPtr random_categorical(const array& logits, int32_t axis, const array* key, StreamSpec s) {
  return wrap(mx::random::categorical(logits, axis, opt(key), to_stream(s)));
}

ArrayPtr random_gumbel(
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    const array* key,
    StreamSpec s) {
  return wrap(mx::random::gumbel(to_shape(shape), to_dtype(dtype), opt(key), to_stream(s)));
}

// ---- files

namespace {

rust::Vec<rust::String> to_rust_strings(const std::vector<std::string>& v) {
  rust::Vec<rust::String> out;
  out.reserve(v.size());
  for (const auto& s : v) {
    out.push_back(rust::String::lossy(s));
  }
  return out;
}

template <typename Map>
const typename Map::mapped_type& lookup(const Map& map, rust::Str key, const char* what) {
  auto it = map.find(std::string(key));
  if (it == map.end()) {
    throw std::out_of_range(std::string("no ") + what + " named '" + std::string(key) + "'");
  }
  return it->second;
}

} // namespace

std::unique_ptr<SafetensorsFile> load_safetensors(rust::Str path) {
  auto [tensors, metadata] =
      mx::load_safetensors(std::string(path), mx::default_stream(mx::Device::cpu));
  auto f = std::make_unique<SafetensorsFile>();
  for (const auto& [name, _] : tensors) {
    f->names.push_back(name);
  }
  std::sort(f->names.begin(), f->names.end());
  for (const auto& [key, _] : metadata) {
    f->metadata_keys.push_back(key);
  }
  std::sort(f->metadata_keys.begin(), f->metadata_keys.end());
  f->tensors = std::move(tensors);
  f->metadata = std::move(metadata);
  return f;
}

rust::Vec<rust::String> safetensors_names(const SafetensorsFile& f) {
  return to_rust_strings(f.names);
}

ArrayPtr safetensors_get(const SafetensorsFile& f, rust::Str name) {
  return wrap(lookup(f.tensors, name, "tensor"));
}

rust::Vec<rust::String> safetensors_metadata_keys(const SafetensorsFile& f) {
  return to_rust_strings(f.metadata_keys);
}

rust::String safetensors_metadata_get(const SafetensorsFile& f, rust::Str key) {
  return rust::String::lossy(lookup(f.metadata, key, "metadata key"));
}

void save_safetensors(
    rust::Str path,
    const rust::Vec<rust::String>& names,
    const ArrayList& arrays,
    const rust::Vec<rust::String>& metadata_keys,
    const rust::Vec<rust::String>& metadata_values) {
  if (names.size() != arrays.items.size() || metadata_keys.size() != metadata_values.size()) {
    throw std::invalid_argument("save_safetensors: names and arrays differ in length");
  }
  std::unordered_map<std::string, array> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.insert_or_assign(std::string(names[i]), arrays.items[i]);
  }
  std::unordered_map<std::string, std::string> metadata;
  for (size_t i = 0; i < metadata_keys.size(); ++i) {
    metadata[std::string(metadata_keys[i])] = std::string(metadata_values[i]);
  }
  mx::save_safetensors(std::string(path), std::move(tensors), std::move(metadata));
}

std::unique_ptr<GgufFile> load_gguf(rust::Str path) {
  auto [tensors, metadata] = mx::load_gguf(std::string(path), mx::default_stream(mx::Device::cpu));
  auto f = std::make_unique<GgufFile>();
  for (const auto& [name, _] : tensors) {
    f->names.push_back(name);
  }
  std::sort(f->names.begin(), f->names.end());
  for (const auto& [key, _] : metadata) {
    f->metadata_keys.push_back(key);
  }
  std::sort(f->metadata_keys.begin(), f->metadata_keys.end());
  f->tensors = std::move(tensors);
  f->metadata = std::move(metadata);
  return f;
}

rust::Vec<rust::String> gguf_names(const GgufFile& f) {
  return to_rust_strings(f.names);
}

ArrayPtr gguf_get(const GgufFile& f, rust::Str name) {
  return wrap(lookup(f.tensors, name, "tensor"));
}

rust::Vec<rust::String> gguf_metadata_keys(const GgufFile& f) {
  return to_rust_strings(f.metadata_keys);
}

int32_t gguf_metadata_kind(const GgufFile& f, rust::Str key) {
  auto it = f.metadata.find(std::string(key));
  if (it == f.metadata.end()) {
    return 0;
  }
  return static_cast<int32_t>(it->second.index());
}

ArrayPtr gguf_metadata_array(const GgufFile& f, rust::Str key) {
  const auto& v = lookup(f.metadata, key, "metadata key");
  if (auto a = std::get_if<array>(&v)) {
    return wrap(*a);
  }
  throw std::invalid_argument("GGUF metadata '" + std::string(key) + "' is not numeric");
}

rust::String gguf_metadata_string(const GgufFile& f, rust::Str key) {
  const auto& v = lookup(f.metadata, key, "metadata key");
  if (auto s = std::get_if<std::string>(&v)) {
    return rust::String::lossy(*s);
  }
  throw std::invalid_argument("GGUF metadata '" + std::string(key) + "' is not a string");
}

rust::Vec<rust::String> gguf_metadata_strings(const GgufFile& f, rust::Str key) {
  const auto& v = lookup(f.metadata, key, "metadata key");
  if (auto s = std::get_if<std::vector<std::string>>(&v)) {
    return to_rust_strings(*s);
  }
  throw std::invalid_argument("GGUF metadata '" + std::string(key) + "' is not a list of strings");
}

// ---- distributed
//
// MLX picks the backend ("ring", "mpi", "nccl", "jaccl" or "any") and reads
// its own environment (MLX_RANK, MLX_HOSTFILE, ...). The ops are built on
// the caller's stream like every other op; the backend runs them when the
// graph is evaluated.

bool distributed_is_available(rust::Str backend) {
  return mx::distributed::is_available(std::string(backend));
}

std::unique_ptr<DistGroup> distributed_init(bool strict, rust::Str backend) {
  return std::make_unique<DistGroup>(
      mx::distributed::init(strict, std::string(backend)));
}

int32_t dist_group_rank(const DistGroup& g) {
  return g.group.rank();
}

int32_t dist_group_size(const DistGroup& g) {
  return g.group.size();
}

std::unique_ptr<DistGroup> dist_group_clone(const DistGroup& g) {
  return std::make_unique<DistGroup>(g.group);
}

ArrayPtr dist_all_sum(const array& x, const DistGroup& g, StreamSpec s) {
  return wrap(mx::distributed::all_sum(x, g.group, to_stream(s)));
}

ArrayPtr dist_all_gather(const array& x, const DistGroup& g, StreamSpec s) {
  return wrap(mx::distributed::all_gather(x, g.group, to_stream(s)));
}

ArrayPtr dist_send(const array& x, int32_t dst, const DistGroup& g, StreamSpec s) {
  return wrap(mx::distributed::send(x, dst, g.group, to_stream(s)));
}

ArrayPtr dist_recv(
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    int32_t src,
    const DistGroup& g,
    StreamSpec s) {
  return wrap(mx::distributed::recv(
      to_shape(shape), to_dtype(dtype), src, g.group, to_stream(s)));
}

} // namespace mlx_backend
