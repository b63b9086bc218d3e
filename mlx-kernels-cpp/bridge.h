// The C++ side of the one cxx bridge (mlx-backend/ffi.rs): thin shims over
// mlx::core that take Rust slices and return owned arrays. Sections mirror
// the bridge: devices and streams, memory, arrays and host I/O, evaluation,
// ops, fast ops, random, files.
//
// Every function that can throw is declared `Result` on the Rust side; cxx
// turns the C++ exception into an Err carrying MLX's own message.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"
#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace mlx_backend {

using mlx::core::array;
using ArrayPtr = std::unique_ptr<array>;

// Shared structs, defined by cxx in the generated header.
struct DeviceSpec;
struct StreamSpec;

// An ordered list of arrays: the bridge's currency for n-ary ops and outputs.
class ArrayList {
 public:
  std::vector<array> items;
};

// A loaded .safetensors file: tensors by name plus string metadata.
class SafetensorsFile {
 public:
  std::vector<std::string> names;
  std::unordered_map<std::string, array> tensors;
  std::vector<std::string> metadata_keys;
  std::unordered_map<std::string, std::string> metadata;
};

// A loaded GGUF file: tensors by name plus typed metadata.
// A distributed group (mlx::core::distributed::Group, a shared handle to
// the backend's communicator): copies share the communicator.
class DistGroup {
 public:
  explicit DistGroup(mlx::core::distributed::Group g) : group(std::move(g)) {}
  mlx::core::distributed::Group group;
};

class GgufFile {
 public:
  std::vector<std::string> names;
  std::unordered_map<std::string, array> tensors;
  std::vector<std::string> metadata_keys;
  std::unordered_map<std::string, mlx::core::GGUFMetaData> metadata;
};

mlx::core::Stream to_stream(const StreamSpec& s);
mlx::core::Dtype to_dtype(int32_t code);
ArrayPtr wrap(array a);

// ---- devices and streams
DeviceSpec default_device();
void set_default_device(DeviceSpec device);
bool device_is_available(DeviceSpec device);
int32_t device_count(int32_t device_type);
StreamSpec default_stream(DeviceSpec device);
StreamSpec new_stream(DeviceSpec device);
void set_default_stream(StreamSpec stream);
void synchronize(StreamSpec stream);

// ---- memory
size_t active_memory();
size_t peak_memory();
void reset_peak_memory();
size_t cache_memory();
size_t set_memory_limit(size_t limit);
size_t memory_limit();
size_t set_cache_limit(size_t limit);
void clear_cache();

// ---- arrays and host I/O
ArrayPtr from_bytes(
    rust::Slice<const uint8_t> data,
    rust::Slice<const int32_t> shape,
    int32_t dtype);
ArrayPtr full(
    rust::Slice<const int32_t> shape,
    double value,
    int32_t dtype,
    StreamSpec s);
ArrayPtr arange(double start, double stop, double step, int32_t dtype, StreamSpec s);
ArrayPtr array_clone(const array& a);
rust::Vec<int32_t> array_shape(const array& a);
int32_t array_dtype(const array& a);
size_t array_size(const array& a);
size_t array_nbytes(const array& a);
bool array_is_pending(const array& a);
size_t array_host_data(const array& a);
void copy_to_host(const array& a, rust::Slice<uint8_t> out);

std::unique_ptr<ArrayList> new_array_list();
void array_list_push(ArrayList& list, const array& a);
size_t array_list_len(const ArrayList& list);
ArrayPtr array_list_get(const ArrayList& list, size_t index);

// ---- evaluation
void eval(const array& a);
void eval_list(const ArrayList& list);
void async_eval_list(const ArrayList& list);

// ---- ops
ArrayPtr unary(int32_t op, const array& a, StreamSpec s);
ArrayPtr binary(int32_t op, const array& a, const array& b, StreamSpec s);
ArrayPtr reduce(
    int32_t op,
    const array& a,
    rust::Slice<const int32_t> axes,
    bool keepdims,
    StreamSpec s);
ArrayPtr arg_reduce(int32_t op, const array& a, int32_t axis, bool keepdims, StreamSpec s);
ArrayPtr reshape(const array& a, rust::Slice<const int32_t> shape, StreamSpec s);
ArrayPtr transpose(const array& a, rust::Slice<const int32_t> axes, StreamSpec s);
ArrayPtr squeeze(const array& a, rust::Slice<const int32_t> axes, StreamSpec s);
ArrayPtr expand_dims(const array& a, rust::Slice<const int32_t> axes, StreamSpec s);
ArrayPtr broadcast_to(const array& a, rust::Slice<const int32_t> shape, StreamSpec s);
ArrayPtr flatten(const array& a, int32_t start_axis, int32_t end_axis, StreamSpec s);
ArrayPtr slice(
    const array& a,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides,
    StreamSpec s);
ArrayPtr slice_update(
    const array& src,
    const array& update,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides,
    StreamSpec s);
ArrayPtr slice_dynamic(
    const array& a,
    const array& start,
    rust::Slice<const int32_t> axes,
    rust::Slice<const int32_t> size,
    StreamSpec s);
ArrayPtr slice_update_dynamic(
    const array& src,
    const array& update,
    const array& start,
    rust::Slice<const int32_t> axes,
    StreamSpec s);
ArrayPtr concatenate(const ArrayList& arrays, int32_t axis, StreamSpec s);
ArrayPtr stack(const ArrayList& arrays, int32_t axis, StreamSpec s);
std::unique_ptr<ArrayList> split_sections(
    const array& a,
    rust::Slice<const int32_t> indices,
    int32_t axis,
    StreamSpec s);
ArrayPtr take(const array& a, const array& indices, int32_t axis, StreamSpec s);
ArrayPtr take_along_axis(const array& a, const array& indices, int32_t axis, StreamSpec s);
ArrayPtr put_along_axis(
    const array& a,
    const array& indices,
    const array& values,
    int32_t axis,
    StreamSpec s);
ArrayPtr where_(const array& cond, const array& x, const array& y, StreamSpec s);
ArrayPtr astype(const array& a, int32_t dtype, StreamSpec s);
ArrayPtr contiguous(const array& a, StreamSpec s);
ArrayPtr clip(const array& a, double lo, double hi, StreamSpec s);
ArrayPtr argpartition(const array& a, int32_t kth, int32_t axis, StreamSpec s);
ArrayPtr topk(const array& a, int32_t k, int32_t axis, StreamSpec s);
ArrayPtr sort(const array& a, int32_t axis, bool indices, StreamSpec s);
ArrayPtr cumsum(const array& a, int32_t axis, bool reverse, bool inclusive, StreamSpec s);
ArrayPtr softmax(const array& a, rust::Slice<const int32_t> axes, bool precise, StreamSpec s);
ArrayPtr matmul(const array& a, const array& b, StreamSpec s);
ArrayPtr addmm(const array& c, const array& a, const array& b, StreamSpec s);
std::unique_ptr<ArrayList> quantize(const array& w, int32_t group_size, int32_t bits, StreamSpec s);
ArrayPtr dequantize(
    const array& w,
    const array& scales,
    const array* biases,
    int32_t group_size,
    int32_t bits,
    StreamSpec s);
ArrayPtr quantized_matmul(
    const array& x,
    const array& w,
    const array& scales,
    const array* biases,
    bool transpose,
    int32_t group_size,
    int32_t bits,
    StreamSpec s);
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
    StreamSpec s);
ArrayPtr gather_mm(
    const array& a,
    const array& b,
    const array* lhs_indices,
    const array* rhs_indices,
    bool sorted_indices,
    StreamSpec s);

// ---- fast ops
ArrayPtr fast_rms_norm(const array& x, const array* weight, float eps, StreamSpec s);
ArrayPtr fast_layer_norm(
    const array& x,
    const array* weight,
    const array* bias,
    float eps,
    StreamSpec s);
ArrayPtr fast_rope(
    const array& x,
    int32_t dims,
    bool traditional,
    float base,
    float scale,
    int32_t offset,
    const array* freqs,
    StreamSpec s);
ArrayPtr fast_rope_dynamic(
    const array& x,
    int32_t dims,
    bool traditional,
    float base,
    float scale,
    const array& offset,
    const array* freqs,
    StreamSpec s);
ArrayPtr fast_sdpa(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    rust::Str mask_mode,
    const array* mask,
    StreamSpec s);

// ---- random
ArrayPtr random_key(uint64_t seed);
void random_seed(uint64_t seed);
ArrayPtr random_split(const array& key, int32_t num, StreamSpec s);
ArrayPtr random_uniform(
    const array& low,
    const array& high,
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    const array* key,
    StreamSpec s);
ArrayPtr random_normal(
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    float loc,
    float scale,
    const array* key,
    StreamSpec s);
ArrayPtr random_categorical(const array& logits, int32_t axis, const array* key, StreamSpec s);
ArrayPtr random_gumbel(rust::Slice<const int32_t> shape, int32_t dtype, const array* key, StreamSpec s);

// ---- files
std::unique_ptr<SafetensorsFile> load_safetensors(rust::Str path);
rust::Vec<rust::String> safetensors_names(const SafetensorsFile& f);
ArrayPtr safetensors_get(const SafetensorsFile& f, rust::Str name);
rust::Vec<rust::String> safetensors_metadata_keys(const SafetensorsFile& f);
rust::String safetensors_metadata_get(const SafetensorsFile& f, rust::Str key);
void save_safetensors(
    rust::Str path,
    const rust::Vec<rust::String>& names,
    const ArrayList& arrays,
    const rust::Vec<rust::String>& metadata_keys,
    const rust::Vec<rust::String>& metadata_values);

std::unique_ptr<GgufFile> load_gguf(rust::Str path);
rust::Vec<rust::String> gguf_names(const GgufFile& f);
ArrayPtr gguf_get(const GgufFile& f, rust::Str name);
rust::Vec<rust::String> gguf_metadata_keys(const GgufFile& f);
// 0: absent/empty, 1: array, 2: string, 3: list of strings.
int32_t gguf_metadata_kind(const GgufFile& f, rust::Str key);
ArrayPtr gguf_metadata_array(const GgufFile& f, rust::Str key);
rust::String gguf_metadata_string(const GgufFile& f, rust::Str key);
rust::Vec<rust::String> gguf_metadata_strings(const GgufFile& f, rust::Str key);


// ---- distributed
bool distributed_is_available(rust::Str backend);
std::unique_ptr<DistGroup> distributed_init(bool strict, rust::Str backend);
int32_t dist_group_rank(const DistGroup& g);
int32_t dist_group_size(const DistGroup& g);
std::unique_ptr<DistGroup> dist_group_clone(const DistGroup& g);
ArrayPtr dist_all_sum(const array& x, const DistGroup& g, StreamSpec s);
ArrayPtr dist_all_gather(const array& x, const DistGroup& g, StreamSpec s);
ArrayPtr dist_send(const array& x, int32_t dst, const DistGroup& g, StreamSpec s);
ArrayPtr dist_recv(
    rust::Slice<const int32_t> shape,
    int32_t dtype,
    int32_t src,
    const DistGroup& g,
    StreamSpec s);

} // namespace mlx_backend

// ---- custom primitives (one folder per kernel)
#include "attention/attention.h"
#include "common/grad_check.h"
#include "decoder_layer/decoder_layer.h"
#include "gate_qmv_silu_mul/gate_qmv_silu_mul.h"
#include "moe_combine/moe_combine.h"
#include "quantized_matmul/quantized_matmul.h"
#include "rms_norm/rms_norm.h"
