#include "decoder_layer/decoder_layer.h"

#include "common/affine_qmm.h"
#include "common/quant_check.h"
#include "decoder_layer/cuda.h"
#include "decoder_layer/prepared.h"
#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "mlx-backend/mlx-backend/kernels/decoder_layer/bridge.rs.h"

#include <algorithm>
#include <span>

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr const char* kOp = "decoder_layer";
constexpr int kProjections = 7;
const char* const kProjectionNames[kProjections] = {"q", "k", "v", "o", "gate", "up", "down"};

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument(std::string(kOp) + ": " + msg);
}

void check_vector(const array& a, int n, const std::string& what) {
  if (a.ndim() != 1 || a.shape(0) != n) {
    fail(what + " must be [" + std::to_string(n) + "], got " + shape_str(a.shape()));
  }
}

// (in, out) features of each projection.
std::array<std::pair<int, int>, kProjections> projection_dims(const LayerConfig& c) {
  int q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  return {{
      {c.hidden, q},
      {c.hidden, kv},
      {c.hidden, kv},
      {q, c.hidden},
      {c.hidden, c.intermediate},
      {c.hidden, c.intermediate},
      {c.intermediate, c.hidden},
  }};
}

// The parameters of one block (input norm, post norm, 7 × [w, scales,
// biases], then the optional ones) against its configuration.
void check_params(const std::vector<array>& params, const LayerConfig& c) {
  if (c.hidden < 1 || c.intermediate < 1) {
    fail("hidden and intermediate sizes must be positive");
  }
  if (c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0 || c.head_dim < 1) {
    fail("query heads must be a positive multiple of kv heads");
  }
  if (c.rope_dims < 2 || c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim) {
    fail("rope dims must be even and at most head_dim");
  }
  if (static_cast<int>(c.quant.size()) != 2 * kProjections) {
    fail("quant must hold (bits, group_size) for 7 projections");
  }
  if (params.size() != c.param_inputs() - 1) {
    fail("expected " + std::to_string(c.param_inputs() - 1) + " parameter arrays, got " +
         std::to_string(params.size()));
  }
  check_vector(params[0], c.hidden, "input norm weight");
  check_vector(params[1], c.hidden, "post-attention norm weight");
  auto dims = projection_dims(c);
  size_t i = 2;
  for (int p = 0; p < kProjections; ++p, i += 3) {
    std::vector<array> q{params[i], params[i + 1], params[i + 2]};
    check_quant_matrix(
        kOp, kProjectionNames[p], q, dims[p].first, c.quant[2 * p + 1], c.quant[2 * p],
        {dims[p].second});
  }
  if (c.has_qkv_bias) {
    for (int p = 0; p < 3; ++p) {
      check_vector(params[i++], dims[p].second, std::string(kProjectionNames[p]) + " bias");
    }
  }
  if (c.has_qk_norm) {
    check_vector(params[i++], c.head_dim, "q norm weight");
    check_vector(params[i++], c.head_dim, "k norm weight");
  }
  if (c.has_freqs) {
    check_vector(params[i++], c.rope_dims / 2, "rope frequencies");
  }
}

// Block `c` for rows of `hidden` features in `dtype`, and its caches
// (`caches[2b]`, `caches[2b + 1]` for row b).
void check_call(int hidden, mx::Dtype dtype, const array* caches, const LayerConfig& c, int layer) {
  if (hidden != c.hidden) {
    fail("x has " + std::to_string(hidden) + " features, block " + std::to_string(layer) +
         " takes " + std::to_string(c.hidden));
  }
  for (int b = 0; b < c.batch; ++b) {
    const auto& k = caches[2 * b];
    const auto& v = caches[2 * b + 1];
    std::string which = "cache " + std::to_string(b) + " of block " + std::to_string(layer);
    if (k.ndim() != 4 || k.shape() != v.shape() || k.shape(0) != 1 ||
        k.shape(1) != c.n_kv_heads || k.shape(3) != c.head_dim) {
      fail(which + " must be keys and values [1, " + std::to_string(c.n_kv_heads) +
           ", capacity, " + std::to_string(c.head_dim) + "], got " + shape_str(k.shape()) +
           " and " + shape_str(v.shape()));
    }
    if (k.dtype() != dtype || v.dtype() != dtype) {
      fail("caches must have x's dtype");
    }
    if (c.offsets[b] < 0 || c.offsets[b] >= k.shape(2)) {
      fail("offset " + std::to_string(c.offsets[b]) + " of " + which +
           " leaves no room in capacity " + std::to_string(k.shape(2)));
    }
  }
}

// The block from MLX's ops: what the kernel computes, op for op as the
// model's unfused layers build it.
std::vector<array> fallback_graph(const std::vector<array>& in, const LayerConfig& c, mx::Stream s) {
  const auto& x = in[0];
  const int B = c.batch, D = c.head_dim, nq = c.n_heads, nkv = c.n_kv_heads;
  size_t i = 1;
  const auto& ln1 = in[i++];
  const auto& ln2 = in[i++];
  const size_t proj0 = i;
  i += 3 * kProjections;
  auto qmm = [&](const array& a, int p) {
    size_t w = proj0 + 3 * p;
    return affine_quantized_matmul(
        a, in[w], in[w + 1], in[w + 2], true, c.quant[2 * p + 1], c.quant[2 * p], s);
  };
  auto h = mx::fast::rms_norm(x, ln1, c.eps, s);
  auto q = qmm(h, 0), k = qmm(h, 1), v = qmm(h, 2);
  if (c.has_qkv_bias) {
    q = mx::add(q, in[i++], s);
    k = mx::add(k, in[i++], s);
    v = mx::add(v, in[i++], s);
  }
  q = mx::reshape(q, {B, 1, nq, D}, s);
  k = mx::reshape(k, {B, 1, nkv, D}, s);
  v = mx::reshape(v, {B, 1, nkv, D}, s);
  if (c.has_qk_norm) {
    q = mx::fast::rms_norm(q, in[i++], c.eps, s);
    k = mx::fast::rms_norm(k, in[i++], c.eps, s);
  }
  std::optional<array> freqs;
  if (c.has_freqs) {
    freqs = in[i++];
  }
  q = mx::transpose(q, {0, 2, 1, 3}, s);
  k = mx::transpose(k, {0, 2, 1, 3}, s);
  v = mx::transpose(v, {0, 2, 1, 3}, s);
  auto rope = [&](array t, int offset) {
    if (c.rope_mscale != 1.0f) {
      auto rotated = mx::multiply(
          mx::slice(t, {0, 0, 0, 0}, {t.shape(0), t.shape(1), t.shape(2), c.rope_dims}, s),
          mx::array(c.rope_mscale, t.dtype()), s);
      t = c.rope_dims < D
          ? mx::concatenate(
                {rotated,
                 mx::slice(t, {0, 0, 0, c.rope_dims}, {t.shape(0), t.shape(1), t.shape(2), D}, s)},
                -1, s)
          : rotated;
    }
    std::optional<float> base;
    if (!freqs) {
      base = c.rope_base;
    }
    return mx::fast::rope(t, c.rope_dims, c.rope_traditional, base, c.rope_scale, offset, freqs, s);
  };
  std::vector<array> rows, new_caches;
  for (int b = 0; b < B; ++b) {
    int off = c.offsets[b];
    auto qb = rope(mx::slice(q, {b, 0, 0, 0}, {b + 1, nq, 1, D}, s), off);
    auto kb = rope(mx::slice(k, {b, 0, 0, 0}, {b + 1, nkv, 1, D}, s), off);
    auto vb = mx::slice(v, {b, 0, 0, 0}, {b + 1, nkv, 1, D}, s);
    auto keys = mx::slice_update(in[i + 2 * b], kb, mx::Shape{0, 0, off, 0}, mx::Shape{1, nkv, off + 1, D}, s);
    auto values = mx::slice_update(in[i + 2 * b + 1], vb, mx::Shape{0, 0, off, 0}, mx::Shape{1, nkv, off + 1, D}, s);
    rows.push_back(mx::fast::scaled_dot_product_attention(
        qb, mx::slice(keys, {0, 0, 0, 0}, {1, nkv, off + 1, D}, s),
        mx::slice(values, {0, 0, 0, 0}, {1, nkv, off + 1, D}, s), c.attn_scale, "",
        std::nullopt, std::nullopt, false, s));
    new_caches.push_back(keys);
    new_caches.push_back(values);
  }
  auto o = mx::reshape(
      mx::transpose(mx::concatenate(rows, 0, s), {0, 2, 1, 3}, s), {B, 1, nq * D}, s);
  auto h1 = mx::add(x, qmm(o, 3), s);
  auto hn = mx::fast::rms_norm(h1, ln2, c.eps, s);
  auto g = qmm(hn, 4);
  auto act = mx::multiply(mx::multiply(g, mx::sigmoid(g, s), s), qmm(hn, 5), s);
  std::vector<array> out{mx::add(h1, qmm(act, 6), s)};
  out.insert(out.end(), new_caches.begin(), new_caches.end());
  return out;
}

DecoderLayerSpec to_spec(const LayerConfig& c, const array& norms_like, const array& scales_like) {
  DecoderLayerSpec s;
  s.batch = c.batch;
  s.hidden = c.hidden;
  s.intermediate = c.intermediate;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.eps = c.eps;
  s.attn_scale = c.attn_scale;
  s.rope_dims = c.rope_dims;
  s.rope_traditional = c.rope_traditional;
  s.rope_base = c.rope_base;
  s.rope_scale = c.rope_scale;
  s.rope_mscale = c.rope_mscale;
  s.has_freqs = c.has_freqs;
  s.has_qkv_bias = c.has_qkv_bias;
  s.has_qk_norm = c.has_qk_norm;
  s.activations = c.activations;
  s.params_dtype = static_cast<int32_t>(scales_like.dtype().val());
  s.norms_dtype = static_cast<int32_t>(norms_like.dtype().val());
  return s;
}

LayerConfig from_spec(const DecoderLayerSpec& s, rust::Slice<const int32_t> quant) {
  return LayerConfig{
      static_cast<int>(s.batch),
      static_cast<int>(s.hidden),
      static_cast<int>(s.intermediate),
      static_cast<int>(s.n_heads),
      static_cast<int>(s.n_kv_heads),
      static_cast<int>(s.head_dim),
      s.eps,
      s.attn_scale,
      static_cast<int>(s.rope_dims),
      s.rope_traditional,
      s.rope_base,
      s.rope_scale,
      s.rope_mscale,
      s.has_freqs,
      s.has_qkv_bias,
      s.has_qk_norm,
      s.activations,
      std::vector<int>(quant.begin(), quant.end()),
      {},
  };
}

void push_buffer(std::vector<size_t>& table, const array& a) {
  table.push_back(reinterpret_cast<size_t>(a.data<uint8_t>()));
  table.push_back(a.nbytes());
}

// Parameters made dense and evaluated once (the kernel reads them as plain
// buffers) into `params`, with their (address, bytes) into `table`.
void prepare_params(
    const std::vector<array>& in,
    std::vector<array>& params,
    std::vector<size_t>& table,
    const char* what) {
  for (const auto& p : in) {
    params.push_back(p.flags().row_contiguous ? p : mx::contiguous(p));
  }
  mx::eval(params);
  for (const auto& p : params) {
    require_row_contiguous(p, what);
    push_buffer(table, p);
  }
}

// The block's vectors as the CUDA body reads them (see StepVectors); the
// inverse frequencies as the CPU body computes them (decoder_layer/cpu.rs).
StepVectors step_vectors(const std::vector<array>& params, const LayerConfig& c) {
  auto f32 = [](const array& a) { return mx::astype(a, mx::float32); };
  size_t i = 2 + 3 * kProjections;
  std::optional<array> bias[3];
  if (c.has_qkv_bias) {
    for (auto& b : bias) {
      b = f32(params[i++]);
    }
  }
  std::optional<array> norm[2];
  if (c.has_qk_norm) {
    for (auto& n : norm) {
      n = f32(params[i++]);
    }
  }
  const int half = c.rope_dims / 2;
  array inv_freqs = [&] {
    if (c.has_freqs) {
      return mx::divide(mx::array(1.0f), f32(params[i]));
    }
    std::vector<float> inv(half);
    const float step = std::log(c.rope_base) / static_cast<float>(half);
    for (int p = 0; p < half; ++p) {
      inv[p] = std::exp(-static_cast<float>(p) * step);
    }
    return mx::array(inv.data(), {half}, mx::float32);
  }();
  StepVectors v{f32(params[0]), f32(params[1]), {bias[0], bias[1], bias[2]}, {norm[0], norm[1]}, inv_freqs};
  std::vector<array> all{v.input_norm, v.post_norm, v.inv_freqs};
  for (const auto& o : v.qkv_bias) {
    if (o) {
      all.push_back(*o);
    }
  }
  for (const auto& o : v.qk_norm) {
    if (o) {
      all.push_back(*o);
    }
  }
  mx::eval(all);
  return v;
}

} // namespace

namespace {

using Layers = std::vector<std::shared_ptr<const PreparedLayer>>;

// Logits in f32 for rows h: the model's own head (RMSNorm, then the
// quantized matmul on f32 x).
array head_fallback(const array& h, const PreparedHead& head, mx::Stream s) {
  const auto& p = head.params;
  auto x = mx::astype(mx::fast::rms_norm(h, p[0], head.eps, s), mx::float32, s);
  return mx::astype(
      affine_quantized_matmul(x, p[1], p[2], p[3], true, head.group_size, head.bits, s),
      mx::float32, s);
}

// Rows of the table for token ids [B, 1], in f32: the model's own lookup
// (take, then dequantize with the scales widened first).
array embedding_fallback(const array& ids, const PreparedEmbedding& e, mx::Stream s) {
  const auto& p = e.params;
  return mx::dequantize(
      mx::take(p[0], ids, 0, s), mx::astype(mx::take(p[1], ids, 0, s), mx::float32, s),
      mx::astype(mx::take(p[2], ids, 0, s), mx::float32, s), e.group_size, e.bits, "affine",
      std::nullopt, std::nullopt, s);
}

// Block l's configuration for a call over `batch` rows.
LayerConfig call_config(const PreparedLayer& layer, int batch, const std::vector<int>& offsets, size_t l) {
  LayerConfig c = layer.config;
  c.batch = batch;
  c.offsets.assign(offsets.begin() + l * batch, offsets.begin() + (l + 1) * batch);
  return c;
}

// The blocks from MLX's ops, one after the other: `in` is [x, caches...]
// (token ids instead of x with an embedding).
std::vector<array> stack_fallback(
    const std::vector<array>& in,
    const Layers& layers,
    const std::shared_ptr<const PreparedEmbedding>& embedding,
    const std::shared_ptr<const PreparedHead>& head,
    int batch,
    const std::vector<int>& offsets,
    mx::Stream s) {
  array h = embedding ? embedding_fallback(in[0], *embedding, s) : in[0];
  std::vector<array> caches;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& layer = *layers[l];
    std::vector<array> block{h};
    block.insert(block.end(), layer.params.begin(), layer.params.end());
    auto first = in.begin() + 1 + 2 * l * batch;
    block.insert(block.end(), first, first + 2 * batch);
    auto out = fallback_graph(block, call_config(layer, batch, offsets, l), s);
    h = out[0];
    caches.insert(caches.end(), out.begin() + 1, out.end());
  }
  std::vector<array> out{head ? head_fallback(h, *head, s) : h};
  out.insert(out.end(), caches.begin(), caches.end());
  return out;
}

// Whether the kernel may write `caches` in their own buffers: each one
// may (cache_buffer_in_place) and no two share a buffer.
bool writable_in_place(std::span<const array> caches) {
  std::vector<size_t> buffers;
  buffers.reserve(caches.size());
  for (const auto& c : caches) {
    size_t at = cache_buffer_in_place(c);
    if (at == 0) {
      return false;
    }
    buffers.push_back(at);
  }
  std::sort(buffers.begin(), buffers.end());
  return std::adjacent_find(buffers.begin(), buffers.end()) == buffers.end();
}

} // namespace

// Evaluated, dense, row-contiguous and the only array holding its buffer,
// so no one else sees a write into it.
size_t cache_buffer_in_place(const array& cache) {
  if (cache.status() == array::Status::unscheduled || !cache.flags().row_contiguous ||
      cache.data_size() != cache.size() || cache.data_shared_ptr().use_count() != 1) {
    return 0;
  }
  return reinterpret_cast<size_t>(cache.data<void>());
}

size_t LayerConfig::param_inputs() const {
  return 1 + 2 + 3 * kProjections + (has_qkv_bias ? 3 : 0) + (has_qk_norm ? 2 : 0) +
      (has_freqs ? 1 : 0);
}

std::vector<array> caches_to_write(
    const std::vector<array>& inputs,
    std::vector<array>& outputs,
    bool in_place,
    std::vector<std::pair<array, array>>& copies) {
  if (in_place) {
    return std::vector<array>(inputs.begin() + 1, inputs.end());
  }
  // make_arrays gives every output its own copy of the inputs, so each
  // cache would be held once per output and never be donatable. Nothing
  // reads the siblings' copies once evaluation has begun (MLX detaches
  // them after this eval), so they are released here; tracers keep
  // theirs, and MLX then holds their inputs anyway.
  if (!outputs[0].is_tracer()) {
    for (auto& out : outputs) {
      if (&out.inputs() != &inputs) {
        out.inputs().clear();
      }
    }
  }
  // A cache whose buffer nothing else holds is updated in place (as MLX's
  // slice_update does); any other is copied into a fresh buffer first.
  for (size_t c = 1; c < inputs.size(); ++c) {
    const auto& in = inputs[c];
    auto& out = outputs[c];
    if (in.is_donatable() && in.flags().row_contiguous && in.data_size() == in.size()) {
      out.copy_shared_buffer(in);
    } else {
      allocate(out);
      copies.emplace_back(in, out);
    }
  }
  return std::vector<array>(outputs.begin() + 1, outputs.end());
}

void DecoderStackPrimitive::require_caches_writable(const std::vector<array>& inputs) const {
  // A cache shared since the node was built (a view evaluated first) is
  // the caller's error, on every device, not a failure of a body.
  if (in_place_ && !writable_in_place(std::span<const array>(inputs).subspan(1))) {
    fail("a cache given to be written in place is shared, strided or not evaluated");
  }
}

void DecoderStackPrimitive::eval_cpu(
    const std::vector<array>& inputs,
    std::vector<array>& outputs) {
  require_row_contiguous(inputs[0], embedding_ ? "decoder_layer tokens" : "decoder_layer x");
  require_caches_writable(inputs);
  allocate(outputs[0]);
  std::vector<std::pair<array, array>> copies;
  std::vector<array> caches = caches_to_write(inputs, outputs, in_place_, copies);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
  }
  for (auto& out : outputs) {
    enc.set_output_array(out);
  }
  std::vector<size_t> x_table, out_table, params, param_counts;
  push_buffer(x_table, inputs[0]);
  push_buffer(out_table, outputs[0]);
  for (const auto& c : caches) {
    push_buffer(out_table, c);
  }
  std::vector<DecoderLayerSpec> specs;
  std::vector<int32_t> quant, capacities;
  for (const auto& layer : layers_) {
    specs.push_back(layer->spec);
    specs.back().batch = batch_;
    params.insert(params.end(), layer->table.begin(), layer->table.end());
    param_counts.push_back(layer->params.size());
    quant.insert(quant.end(), layer->config.quant.begin(), layer->config.quant.end());
  }
  for (size_t c = 1; c < inputs.size(); c += 2) {
    capacities.push_back(inputs[c].shape(2));
  }
  std::vector<int32_t> offsets(offsets_.begin(), offsets_.end());
  StackInput input{};
  std::vector<size_t> embedding;
  if (embedding_) {
    input.tokens = true;
    input.tokens_dtype = static_cast<int32_t>(inputs[0].dtype().val());
    input.bits = embedding_->bits;
    input.group_size = embedding_->group_size;
    input.params_dtype = static_cast<int32_t>(embedding_->params[1].dtype().val());
    input.vocab = embedding_->vocab;
    embedding = embedding_->table;
  }
  StackHead head{};
  std::vector<size_t> head_table;
  if (head_) {
    head.head = true;
    head.bits = head_->bits;
    head.group_size = head_->group_size;
    head.params_dtype = static_cast<int32_t>(head_->params[2].dtype().val());
    head.norm_dtype = static_cast<int32_t>(head_->params[0].dtype().val());
    head.eps = head_->eps;
    head.activations = head_->activations;
    head.vocab = head_->vocab;
    head_table = head_->table;
  }
  // The layers and the table keep their parameters alive until the kernel
  // has run.
  enc.dispatch([layers = layers_, table = embedding_, head_params = head_, x = inputs[0], outputs,
                caches = std::move(caches), copies = std::move(copies), input, embedding = std::move(embedding), head,
                head_table = std::move(head_table),
                specs = std::move(specs), quant = std::move(quant), offsets = std::move(offsets),
                capacities = std::move(capacities), x_table = std::move(x_table),
                params = std::move(params), param_counts = std::move(param_counts),
                out_table = std::move(out_table)]() mutable {
    for (auto& [src, dst] : copies) {
      DenseInput dense(src, "decoder_layer cache");
      dense.fill();
      std::memcpy(dst.data<uint8_t>(), dense.get().data<uint8_t>(), dst.nbytes());
    }
    if (!decoder_stack_cpu(
            input, rust::Slice<const size_t>(embedding.data(), embedding.size()), head,
            rust::Slice<const size_t>(head_table.data(), head_table.size()),
            rust::Slice<const DecoderLayerSpec>(specs.data(), specs.size()), copies.size(),
            rust::Slice<const int32_t>(quant.data(), quant.size()),
            rust::Slice<const int32_t>(offsets.data(), offsets.size()),
            rust::Slice<const int32_t>(capacities.data(), capacities.size()),
            rust::Slice<const size_t>(x_table.data(), x_table.size()),
            rust::Slice<const size_t>(params.data(), params.size()),
            rust::Slice<const size_t>(param_counts.data(), param_counts.size()),
            rust::Slice<const size_t>(out_table.data(), out_table.size()))) {
      // In place, the caches keep every position they held: the kernel
      // writes only at each row's offset, which the caller has not
      // counted yet.
      for (auto& out : outputs) {
        poison(out);
      }
    }
  });
}

void DecoderStackPrimitive::eval_gpu(
    const std::vector<array>& inputs,
    std::vector<array>& outputs) {
  require_caches_writable(inputs);
  FallbackPrimitive::eval_gpu(inputs, outputs);
}

bool DecoderStackPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto o = dynamic_cast<const DecoderStackPrimitive*>(&other);
  return o && o->layers_ == layers_ && o->embedding_ == embedding_ && o->head_ == head_ &&
      o->batch_ == batch_ && o->offsets_ == offsets_ && o->in_place_ == in_place_;
}

std::vector<mx::Shape> DecoderStackPrimitive::output_shapes(const std::vector<array>& inputs) {
  std::vector<mx::Shape> shapes{
      head_ ? mx::Shape{batch_, 1, head_->vocab}
            : embedding_ ? mx::Shape{batch_, 1, embedding_->hidden} : inputs[0].shape()};
  for (size_t i = 1; !in_place_ && i < inputs.size(); ++i) {
    shapes.push_back(inputs[i].shape());
  }
  return shapes;
}

std::unique_ptr<DecoderStack> new_decoder_stack() {
  return std::make_unique<DecoderStack>();
}

void decoder_stack_push(
    DecoderStack& stack,
    const ArrayList& params,
    const DecoderLayerSpec& spec,
    rust::Slice<const int32_t> quant) {
  LayerConfig config = from_spec(spec, quant);
  config.batch = 0;
  check_params(params.items, config);
  std::vector<array> prepared;
  std::vector<size_t> table;
  prepare_params(params.items, prepared, table, "decoder_layer parameter");
  // params: input norm, post norm, then q's weight, scales, biases, ...
  DecoderLayerSpec layer_spec = to_spec(config, prepared[0], prepared[3]);
  StepVectors vectors = step_vectors(prepared, config);
  stack.layers.push_back(std::make_shared<const PreparedLayer>(PreparedLayer{
      std::move(config), std::move(prepared), std::move(table), layer_spec, std::move(vectors)}));
}

void decoder_stack_set_embedding(
    DecoderStack& stack,
    const ArrayList& table,
    int32_t bits,
    int32_t group_size) {
  if (stack.layers.empty()) {
    fail("push the blocks before the embedding table");
  }
  const int hidden = stack.layers[0]->config.hidden;
  if (table.items.size() != 3) {
    fail("the embedding table needs [w, scales, biases]");
  }
  auto e = std::make_shared<PreparedEmbedding>();
  e->vocab = check_quant_matrix(kOp, "embedding", table.items, hidden, group_size, bits, {0});
  e->bits = bits;
  e->group_size = group_size;
  e->hidden = hidden;
  prepare_params(table.items, e->params, e->table, "decoder_layer embedding");
  stack.embedding = std::move(e);
}

void decoder_stack_set_head(
    DecoderStack& stack,
    const ArrayList& params,
    float eps,
    int32_t bits,
    int32_t group_size,
    int32_t activations) {
  if (stack.layers.empty()) {
    fail("push the blocks before the head");
  }
  const int hidden = stack.layers[0]->config.hidden;
  if (params.items.size() != 4) {
    fail("the head needs [norm, w, scales, biases]");
  }
  check_vector(params.items[0], hidden, "final norm weight");
  std::vector<array> q(params.items.begin() + 1, params.items.end());
  int vocab = check_quant_matrix(kOp, "head", q, hidden, group_size, bits, {0});
  std::vector<array> prepared;
  std::vector<size_t> table;
  prepare_params(params.items, prepared, table, "decoder_layer head");
  array norm_f32 = mx::astype(prepared[0], mx::float32);
  mx::eval(norm_f32);
  stack.head = std::make_shared<const PreparedHead>(PreparedHead{
      std::move(prepared), std::move(table), eps, bits, group_size, activations, vocab,
      std::move(norm_f32)});
}

std::unique_ptr<ArrayList> kernel_decoder_stack(
    const array& input,
    bool tokens,
    const DecoderStack& stack,
    size_t first,
    size_t count,
    const ArrayList& caches,
    rust::Slice<const int32_t> offsets,
    bool fused,
    bool in_place,
    StreamSpec spec) {
  if (count == 0 || first > stack.layers.size() || count > stack.layers.size() - first) {
    fail("blocks " + std::to_string(first) + ".." + std::to_string(first + count) +
         " are not within the stack's " + std::to_string(stack.layers.size()));
  }
  Layers layers(stack.layers.begin() + first, stack.layers.begin() + first + count);
  std::shared_ptr<const PreparedEmbedding> embedding;
  if (tokens) {
    if (first != 0 || !stack.embedding) {
      fail("token ids need the stack's embedding table and block 0");
    }
    embedding = stack.embedding;
    if (input.ndim() != 2 || input.shape(1) != 1 ||
        (input.dtype() != mx::uint32 && input.dtype() != mx::int32)) {
      fail("token ids must be [B, 1] uint32 or int32, got " + shape_str(input.shape()));
    }
  } else if (input.ndim() != 3 || input.shape(1) != 1 || !is_float(input.dtype())) {
    fail("x must be a float [B, 1, hidden] (one decode token per row), got " +
         shape_str(input.shape()));
  }
  const int batch = input.shape(0);
  if (batch < 1) {
    fail("need one row or more");
  }
  // What the blocks see as x: the rows' width and dtype.
  const int hidden = tokens ? stack.embedding->hidden : input.shape(2);
  const mx::Dtype dtype = tokens ? mx::float32 : input.dtype();
  const size_t pairs = layers.size() * static_cast<size_t>(batch);
  if (caches.items.size() != 2 * pairs || offsets.size() != pairs) {
    fail("need keys, values and an offset per block and row: " + std::to_string(pairs) +
         " of each, got " + std::to_string(caches.items.size() / 2) + " caches and " +
         std::to_string(offsets.size()) + " offsets");
  }
  std::vector<int> offs(offsets.begin(), offsets.end());
  for (size_t l = 0; l < layers.size(); ++l) {
    check_call(hidden, dtype, caches.items.data() + 2 * l * batch, call_config(*layers[l], batch, offs, l), l);
  }
  std::shared_ptr<const PreparedHead> head;
  if (first + count == stack.layers.size()) {
    head = stack.head;
  }
  auto s = to_stream(spec);
  std::vector<array> inputs{input};
  inputs.insert(inputs.end(), caches.items.begin(), caches.items.end());
  Fallback fallback = [layers, embedding, head, batch, offs, s](std::vector<array> in) {
    return stack_fallback(in, layers, embedding, head, batch, offs, s);
  };
  auto out = std::make_unique<ArrayList>();
  if (!fused) {
    out->items = fallback(inputs);
    return out;
  }
  if (in_place) {
    // The caller checked the caches (DecoderStack::caches_writable_in_place);
    // eval_cpu checks them again, as a view made since would share a buffer.
    // The node's one output is `out`; under a transform (vjp, jvp,
    // vmap) the cache updates are not part of what it returns.
    fallback = [full = std::move(fallback)](std::vector<array> in) {
      return std::vector<array>{full(std::move(in))[0]};
    };
  }
  // x (or the ids) is read dense; the caches are not wrapped, so that their
  // buffers can be donated or written in place.
  inputs[0] = dense_input(inputs[0], s);
  std::vector<mx::Shape> shapes{{batch, 1, head ? head->vocab : hidden}};
  std::vector<mx::Dtype> dtypes{head ? mx::float32 : dtype};
  for (size_t i = 1; !in_place && i < inputs.size(); ++i) {
    shapes.push_back(inputs[i].shape());
    dtypes.push_back(inputs[i].dtype());
  }
  auto primitive = std::make_shared<DecoderStackPrimitive>(
      s, std::move(fallback), layers, embedding, head, batch, offs, in_place);
  if (s.device == mx::Device::gpu) {
    primitive->set_gpu_body(MLX_BACKEND_GPU_BODY(
        "decoder_layer", decoder_stack_cuda(layers, embedding, head, batch, offs, in_place), nullptr));
  }
  out->items = array::make_arrays(std::move(shapes), dtypes, std::move(primitive), inputs);
  return out;
}

} // namespace mlx_backend
