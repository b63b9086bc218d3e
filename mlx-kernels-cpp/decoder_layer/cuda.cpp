#include "decoder_layer/cuda.h"

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "attention/cuda.h"
#include "common/cuda_launch.h"
#include "common/fallback_primitive.h"
#include "decoder_layer/cuda_args.h"
#include "decoder_layer/prepared.h"
#include "mlx_backend_fatbins.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

constexpr int kQmvWarpsPerBlock = 4; // common/qmv.cuh
constexpr int kEmbedThreads = 256; // decoder_layer/cuda.cu
constexpr int kAttendWarps = 4; // common/attend.cuh

using Layers = std::vector<std::shared_ptr<const PreparedLayer>>;

// One quantized matrix of a projection launch.
struct Matrix {
  const array* w;
  const array* scales;
  const array* biases;
  int bits;
  int group_size;
  // Added after the product (f32), or null.
  const array* bias;
};

// An RMSNorm folded into the projection that reads its output: f32
// weights (null: none) and epsilon.
struct Norm {
  const array* w = nullptr;
  float eps = 0.0f;
};

// The (rows, columns) bucket of the projection and gate kernels for
// `rows` rows of x: the kernel takes up to ROWS rows per grid row, each
// warp COLS columns (common/qmv.cuh).
struct RowsBucket {
  int rows;
  int cols;
  int gate_cols;
};

RowsBucket bucket_for(int rows) {
  if (rows == 1) {
    return {1, 1, 1};
  }
  if (rows == 2) {
    return {2, 2, 2};
  }
  return {4, 4, 2};
}

// The kernels of one decode step, added in order to a KernelChain; the
// intermediates are buffers that live as long as the chain.
class StepLauncher {
 public:
  StepLauncher(const mx::Stream& s, mx::Dtype t, KernelChain& chain, std::vector<array>& buffers)
      : s_(s), t_(t), dt_(dtype_suffix(t)), chain_(chain), buffers_(buffers) {}

  // A buffer kept with the chain.
  array scratch(mx::Shape shape, mx::Dtype t) {
    array a(std::move(shape), t, nullptr, {});
    allocate(a);
    buffers_.push_back(a);
    return a;
  }

  void launch(const std::string& name, dim3 grid, dim3 block, std::vector<void*> args) {
    chain_.add(cuda_function(s_, fatbin::decoder_layer(), name), grid, block, std::move(args));
  }

  // out[:, col0 ..] = norm(x) · [matrices]ᵀ (+ bias) (+ residual), x and
  // out of dtype x_t and out_t; matrices of one bit width share a launch
  // when their columns suit the kernel's bucket. norm(x) is x RMS-normed
  // with `norm` (f32 weights) when given, else x.
  void project(
      const array& x,
      mx::Dtype x_t,
      const std::vector<Matrix>& matrices,
      const array* residual,
      array& out,
      mx::Dtype out_t,
      int rows,
      int k_len,
      const Norm& norm) {
    const RowsBucket b = bucket_for(rows);
    int out_stride = 0;
    for (const auto& m : matrices) {
      out_stride += m.w->shape(0);
    }
    bool together = true;
    for (const auto& m : matrices) {
      together = together && m.bits == matrices[0].bits && m.w->shape(0) % b.cols == 0;
    }
    int col0 = 0;
    size_t first = 0;
    while (first < matrices.size()) {
      size_t end = together ? matrices.size() : first + 1;
      ProjectionArgs a{};
      a.x = device_ptr(x);
      a.residual = residual ? device_ptr(*residual) : nullptr;
      a.out = static_cast<char*>(device_ptr_mut(out)) + static_cast<size_t>(col0) * out.itemsize();
      a.rows = rows;
      a.k_len = k_len;
      a.out_stride = out_stride;
      a.norm_w = norm.w ? static_cast<const float*>(device_ptr(*norm.w)) : nullptr;
      a.norm_eps = norm.eps;
      a.mats = static_cast<int>(end - first);
      int cols = 0;
      std::vector<array> in{x};
      if (residual) {
        in.push_back(*residual);
        a.residual = static_cast<const char*>(a.residual) + static_cast<size_t>(col0) * out.itemsize();
      }
      bool vec = k_len % 32 == 0 && (k_len * static_cast<int>(mx::size_of(x_t))) % 16 == 0;
      for (size_t i = first; i < end; ++i) {
        const auto& m = matrices[i];
        int j = static_cast<int>(i - first);
        a.w[j] = static_cast<const uint32_t*>(device_ptr(*m.w));
        a.scales[j] = device_ptr(*m.scales);
        a.biases[j] = device_ptr(*m.biases);
        a.bias[j] = m.bias ? static_cast<const float*>(device_ptr(*m.bias)) : nullptr;
        a.n[j] = m.w->shape(0);
        a.group_size[j] = m.group_size;
        cols += a.n[j];
        in.insert(in.end(), {*m.w, *m.scales, *m.biases});
      }
      a.n_cols = cols;
      vec = vec && aligned16(in);
      std::string name = std::string("mlx_backend_step_proj_") + dtype_suffix(x_t) + "_" +
          dtype_suffix(matrices[first].scales->dtype()) + "_" + dtype_suffix(out_t) + "_b" +
          std::to_string(matrices[first].bits) + "_r" + std::to_string(b.rows);
      int per_block = kQmvWarpsPerBlock * b.cols;
      launch(
          name, dim3((cols + per_block - 1) / per_block, (rows + b.rows - 1) / b.rows),
          dim3(32 * kQmvWarpsPerBlock), {&a, &vec});
      col0 += cols;
      first = end;
    }
  }

  // out = silu(norm(x)·Gᵀ)·(norm(x)·Uᵀ), norm as in `project`.
  void gate(
      const array& x,
      const Matrix& g,
      const Matrix& u,
      array& out,
      int rows,
      int k_len,
      const Norm& norm) {
    const RowsBucket b = bucket_for(rows);
    GateArgs a{};
    a.x = device_ptr(x);
    a.out = device_ptr_mut(out);
    a.w[0] = static_cast<const uint32_t*>(device_ptr(*g.w));
    a.w[1] = static_cast<const uint32_t*>(device_ptr(*u.w));
    a.scales[0] = device_ptr(*g.scales);
    a.scales[1] = device_ptr(*u.scales);
    a.biases[0] = device_ptr(*g.biases);
    a.biases[1] = device_ptr(*u.biases);
    a.rows = rows;
    a.k_len = k_len;
    a.n_len = g.w->shape(0);
    a.group_size = g.group_size;
    a.norm_w = norm.w ? static_cast<const float*>(device_ptr(*norm.w)) : nullptr;
    a.norm_eps = norm.eps;
    std::vector<array> in{x, *g.w, *g.scales, *g.biases, *u.w, *u.scales, *u.biases};
    bool vec = k_len % 32 == 0 && (k_len * static_cast<int>(x.itemsize())) % 16 == 0 && aligned16(in);
    std::string name = std::string("mlx_backend_step_gate_") + dt_ + "_" +
        dtype_suffix(g.scales->dtype()) + "_b" + std::to_string(g.bits) + "_r" + std::to_string(b.rows);
    int per_block = kQmvWarpsPerBlock * b.gate_cols;
    launch(
        name, dim3((a.n_len + per_block - 1) / per_block, (rows + b.rows - 1) / b.rows),
        dim3(32 * kQmvWarpsPerBlock), {&a, &vec});
  }

  const char* dt() const {
    return dt_;
  }

 private:
  mx::Stream s_;
  mx::Dtype t_;
  const char* dt_;
  KernelChain& chain_;
  std::vector<array>& buffers_;
};

// The projection matrix p (0..6: q, k, v, o, gate, up, down) of a block.
Matrix matrix(const PreparedLayer& layer, int p, const array* bias = nullptr) {
  const auto& prm = layer.params;
  const size_t at = 2 + 3 * static_cast<size_t>(p);
  return {&prm[at], &prm[at + 1], &prm[at + 2], layer.config.quant[2 * p], layer.config.quant[2 * p + 1], bias};
}

const array* optional_ptr(const std::optional<array>& a) {
  return a ? &*a : nullptr;
}

// A decode step's kernels for one shape, built once and replayed: the
// chain, its intermediates, and the buffers each replay exchanges with the
// node's arrays (the input copied in, the output copied out, the row table
// rewritten).
struct StepGraph {
  // The blocks it was built from (the embedding and head die with their
  // stack): a replay needs them alive.
  std::vector<std::weak_ptr<const PreparedLayer>> layers;
  std::vector<array> buffers;
  // Indices into `buffers`.
  size_t input = 0, output = 0, table = 0;
  std::unique_ptr<KernelChain> chain;

  bool alive() const {
    for (const auto& l : layers) {
      if (l.expired()) {
        return false;
      }
    }
    return true;
  }
};

// Step graphs per stream, most recently used first: a few shapes (batch
// sizes, attention splits) alternate in a serving loop.
constexpr size_t kStepGraphsPerStream = 8;

using StepKey = std::vector<long long>;

struct StepGraphCache {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::list<std::pair<StepKey, std::shared_ptr<StepGraph>>>> by_stream;
};

StepGraphCache& step_graphs() {
  static StepGraphCache cache;
  return cache;
}

// The table's byte layout for `entries` (blocks × rows) rows: keys' and
// values' addresses, then offsets and capacities.
struct TableLayout {
  size_t k, v, offset, capacity, bytes;
  explicit TableLayout(size_t entries)
      : k(0),
        v(entries * sizeof(void*)),
        offset(2 * entries * sizeof(void*)),
        capacity(offset + entries * sizeof(int)),
        bytes(capacity + entries * sizeof(int)) {}
};

// Attention splits rounded up to a power of two, so that a growing cache
// changes the graph's shape a few times rather than every 256 keys (the
// merge skips empty splits).
int rounded_splits(int splits) {
  int p = 1;
  while (p < splits) {
    p *= 2;
  }
  return p;
}

class DecoderStackCuda : public GpuBody {
 public:
  DecoderStackCuda(
      Layers layers,
      std::shared_ptr<const PreparedEmbedding> embedding,
      std::shared_ptr<const PreparedHead> head,
      int batch,
      std::vector<int> offsets,
      bool in_place)
      : GpuBody(KernelId::DecoderLayer),
        layers_(std::move(layers)),
        embedding_(std::move(embedding)),
        head_(std::move(head)),
        batch_(batch),
        offsets_(std::move(offsets)),
        in_place_(in_place) {}

 protected:
  void enqueue(
      const mx::Stream& s,
      const std::vector<array>& inputs,
      std::vector<array>& outputs) override {
    const int rows = batch_;
    const mx::Dtype t = embedding_ ? mx::float32 : inputs[0].dtype();
    auto& out = outputs[0];
    allocate(out);
    std::vector<std::pair<array, array>> copies;
    std::vector<array> caches = caches_to_write(inputs, outputs, in_place_, copies);
    for (auto& [src, dst] : copies) {
      copy_cache(s, src, dst);
    }
    std::vector<int> splits;
    for (size_t l = 0; l < layers_.size(); ++l) {
      int longest = 0;
      for (int b = 0; b < rows; ++b) {
        longest = std::max(longest, offsets_[l * rows + b] + 1);
      }
      splits.push_back(
          rounded_splits(cuda_attention_key_splits(rows * layers_[l]->config.n_heads, longest)));
    }
    std::shared_ptr<StepGraph> graph = step_graph(s, t, splits);

    const size_t entries = layers_.size() * static_cast<size_t>(rows);
    const TableLayout layout(entries);
    std::vector<char> table(layout.bytes);
    auto* k = reinterpret_cast<const void**>(table.data() + layout.k);
    auto* v = reinterpret_cast<const void**>(table.data() + layout.v);
    auto* offset = reinterpret_cast<int*>(table.data() + layout.offset);
    auto* capacity = reinterpret_cast<int*>(table.data() + layout.capacity);
    for (size_t i = 0; i < entries; ++i) {
      k[i] = device_ptr(caches[2 * i]);
      v[i] = device_ptr(caches[2 * i + 1]);
      offset[i] = offsets_[i];
      capacity[i] = caches[2 * i].shape(2);
    }
    auto& buffers = graph->buffers;
    CUstream stream = flushed_stream(s);
    copy_host_to_device(device_ptr_mut(buffers[graph->table]), table.data(), layout.bytes, stream);
    copy_device_to_device(
        device_ptr_mut(buffers[graph->input]), device_ptr(inputs[0]), inputs[0].nbytes(), stream);
    graph->chain->launch(stream);
    copy_device_to_device(device_ptr_mut(out), device_ptr(buffers[graph->output]), out.nbytes(), stream);
  }

 private:
  // The graph for this stack, batch, dtype and splits on stream s: cached,
  // or built.
  std::shared_ptr<StepGraph> step_graph(const mx::Stream& s, mx::Dtype t, const std::vector<int>& splits) {
    StepKey key{batch_, static_cast<long long>(t.val()), reinterpret_cast<long long>(embedding_.get()),
                reinterpret_cast<long long>(head_.get())};
    for (const auto& l : layers_) {
      key.push_back(reinterpret_cast<long long>(l.get()));
    }
    key.insert(key.end(), splits.begin(), splits.end());
    auto& cache = step_graphs();
    std::unique_lock<std::mutex> lock(cache.mutex);
    auto& list = cache.by_stream[{s.device.index, s.index}];
    // Graphs of stacks that are gone go too; what a replay may still be
    // reading is released after the stream's work.
    auto retire = [&](std::shared_ptr<StepGraph> g) {
      for (const auto& b : g->buffers) {
        keep_until_done(s, b);
      }
    };
    for (auto it = list.begin(); it != list.end();) {
      if (!it->second->alive()) {
        retire(it->second);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->first == key) {
        list.splice(list.begin(), list, it);
        return list.front().second;
      }
    }
    lock.unlock();
    auto graph = build(s, t, splits);
    lock.lock();
    list.emplace_front(std::move(key), graph);
    while (list.size() > kStepGraphsPerStream) {
      retire(list.back().second);
      list.pop_back();
    }
    return graph;
  }

  std::shared_ptr<StepGraph> build(const mx::Stream& s, mx::Dtype t, const std::vector<int>& splits) {
    auto g = std::make_shared<StepGraph>();
    for (const auto& l : layers_) {
      g->layers.push_back(l);
    }
    g->chain = std::make_unique<KernelChain>(s);
    StepLauncher step(s, t, *g->chain, g->buffers);
    const int rows = batch_;
    const auto& first = layers_[0]->config;
    const int hidden = first.hidden;

    g->input = g->buffers.size();
    array input = embedding_ ? step.scratch({rows}, mx::uint32) : step.scratch({rows, hidden}, t);
    g->output = g->buffers.size();
    array output =
        head_ ? step.scratch({rows, head_->vocab}, mx::float32) : step.scratch({rows, hidden}, t);
    const size_t entries = layers_.size() * static_cast<size_t>(rows);
    const TableLayout layout(entries);
    g->table = g->buffers.size();
    array table = step.scratch({static_cast<int>(layout.bytes)}, mx::uint8);
    char* table_at = static_cast<char*>(device_ptr_mut(table));

    // The running hidden state h, the block's h + attention and the other
    // intermediates, reused by every block: each kernel reads what the one
    // before wrote, so the step is one chain. The norms run inside the
    // projections that read them (qkv, gate/up, head).
    array h = embedding_ ? step.scratch({rows, hidden}, mx::float32) : input;
    if (embedding_) {
      embed(step, input, h);
    }
    array running = step.scratch({rows, hidden}, t);
    array h1 = step.scratch({rows, hidden}, t);
    // Flat, sized for the widest block; each block reads them with its
    // own row widths.
    int qkv_cols = 0, q_width = 0, inter = 0, partial_floats = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& c = layers_[l]->config;
      qkv_cols = std::max(qkv_cols, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim);
      q_width = std::max(q_width, c.n_heads * c.head_dim);
      inter = std::max(inter, c.intermediate);
      partial_floats = std::max(partial_floats, c.n_heads * splits[l] * (c.head_dim + 2));
    }
    array qkv = step.scratch({rows * qkv_cols}, t);
    array q = step.scratch({rows * q_width}, t);
    array attended = step.scratch({rows * q_width}, t);
    array act = step.scratch({rows * inter}, t);
    array partials = step.scratch({std::max(1, rows * partial_floats)}, mx::float32);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& layer = *layers_[l];
      const auto& c = layer.config;
      const auto& v = layer.vectors;
      const int q_cols = c.n_heads * c.head_dim;
      const size_t at = l * static_cast<size_t>(rows);
      RowCaches rc{
          reinterpret_cast<void* const*>(table_at + layout.k) + at,
          reinterpret_cast<void* const*>(table_at + layout.v) + at,
          reinterpret_cast<const int*>(table_at + layout.offset) + at,
          reinterpret_cast<const int*>(table_at + layout.capacity) + at};
      step.project(
          h, t,
          {matrix(layer, 0, optional_ptr(v.qkv_bias[0])), matrix(layer, 1, optional_ptr(v.qkv_bias[1])),
           matrix(layer, 2, optional_ptr(v.qkv_bias[2]))},
          nullptr, qkv, t, rows, hidden, Norm{&v.input_norm, c.eps});
      attend(step, layer, rc, splits[l], qkv, q, attended, partials);
      step.project(attended, t, {matrix(layer, 3)}, &h, h1, t, rows, q_cols, Norm{});
      step.gate(h1, matrix(layer, 4), matrix(layer, 5), act, rows, hidden, Norm{&v.post_norm, c.eps});
      const bool last = l + 1 == layers_.size();
      array& dst = last && !head_ ? output : running;
      step.project(act, t, {matrix(layer, 6)}, &h1, dst, t, rows, c.intermediate, Norm{});
      h = dst;
    }
    if (head_) {
      const auto& p = head_->params;
      Matrix m{&p[1], &p[2], &p[3], head_->bits, head_->group_size, nullptr};
      step.project(h, t, {m}, nullptr, output, mx::float32, rows, hidden, Norm{&head_->norm_f32, head_->eps});
    }
    g->chain->instantiate();
    return g;
  }

  // dst = src, a cache that cannot be written in place (any view), as a
  // node of MLX's graph ahead of the step.
  void copy_cache(const mx::Stream& s, const array& src, array& dst) {
    if (src.ndim() != 4 || (src.itemsize() != 2 && src.itemsize() != 4)) {
      throw std::logic_error("decoder_layer CUDA body: caches are 4-D float arrays (the op checks this)");
    }
    CopyArgs a{};
    a.src = device_ptr(src);
    a.dst = device_ptr_mut(dst);
    for (int d = 0; d < 4; ++d) {
      a.shape[d] = src.shape(d);
      a.strides[d] = src.strides(d);
    }
    a.n = static_cast<long long>(src.size());
    int blocks = static_cast<int>(std::min<long long>((a.n + 255) / 256, 4096));
    std::vector<array> out{dst};
    cuda_enqueue(
        s,
        cuda_function(s, fatbin::decoder_layer(), std::string("mlx_backend_step_copy_b") + std::to_string(src.itemsize())),
        dim3(std::max(blocks, 1)), dim3(256), {src}, out, {&a});
  }

  void embed(StepLauncher& step, const array& ids, array& h) {
    const auto& e = *embedding_;
    const auto& p = e.params;
    const void* ip = device_ptr(ids);
    const void* wp = device_ptr(p[0]);
    const void* sp = device_ptr(p[1]);
    const void* bp = device_ptr(p[2]);
    void* op = device_ptr_mut(h);
    int vocab = e.vocab, hidden = e.hidden, group = e.group_size;
    step.launch(
        std::string("mlx_backend_step_embed_") + dtype_suffix(p[1].dtype()) + "_b" + std::to_string(e.bits),
        dim3(batch_), dim3(kEmbedThreads), {&ip, &wp, &sp, &bp, &op, &vocab, &hidden, &group});
  }

  // RoPE and the cache append, then attention, for one block: each row's
  // cache and length come from the step table (rc).
  void attend(
      StepLauncher& step,
      const PreparedLayer& layer,
      const RowCaches& rc,
      int splits,
      const array& qkv,
      array& q,
      array& attended,
      array& partials) {
    const auto& c = layer.config;
    const auto& v = layer.vectors;
    const int rows = batch_;
    const int d = c.head_dim;
    RopeAppendArgs ra{};
    ra.qkv = device_ptr(qkv);
    ra.q_out = device_ptr_mut(q);
    ra.q_norm = v.qk_norm[0] ? static_cast<const float*>(device_ptr(*v.qk_norm[0])) : nullptr;
    ra.k_norm = v.qk_norm[1] ? static_cast<const float*>(device_ptr(*v.qk_norm[1])) : nullptr;
    ra.inv_freqs = static_cast<const float*>(device_ptr(v.inv_freqs));
    ra.caches = rc;
    ra.nq = c.n_heads;
    ra.nkv = c.n_kv_heads;
    ra.d = d;
    ra.dims = c.rope_dims;
    ra.traditional = c.rope_traditional;
    ra.position_scale = c.rope_scale;
    ra.mscale = c.rope_mscale;
    ra.eps = c.eps;
    step.launch(
        std::string("mlx_backend_step_rope_append_") + step.dt(),
        dim3(c.n_heads + 2 * c.n_kv_heads, rows), dim3(32), {&ra});

    StepAttentionArgs aa{};
    aa.q = device_ptr(q);
    aa.out = device_ptr_mut(attended);
    aa.partials = splits > 1 ? static_cast<float*>(device_ptr_mut(partials)) : nullptr;
    aa.caches = rc;
    aa.nq = c.n_heads;
    aa.nkv = c.n_kv_heads;
    aa.d = d;
    aa.splits = splits;
    aa.scale = c.attn_scale;
    step.launch(
        std::string("mlx_backend_step_attention_") + step.dt(), dim3(splits, c.n_heads, rows),
        dim3(32 * kAttendWarps), {&aa});
    if (splits > 1) {
      const void* pp = device_ptr(partials);
      void* op = device_ptr_mut(attended);
      int dd = d;
      int ss = splits;
      step.launch(
          std::string("mlx_backend_step_attention_merge_") + step.dt(), dim3(rows * c.n_heads),
          dim3(32 * kAttendWarps), {&pp, &op, &dd, &ss});
    }
  }

  Layers layers_;
  std::shared_ptr<const PreparedEmbedding> embedding_;
  std::shared_ptr<const PreparedHead> head_;
  int batch_;
  std::vector<int> offsets_;
  bool in_place_;
};

} // namespace

std::shared_ptr<GpuBody> decoder_stack_cuda(
    Layers layers,
    std::shared_ptr<const PreparedEmbedding> embedding,
    std::shared_ptr<const PreparedHead> head,
    int batch,
    std::vector<int> offsets,
    bool in_place) {
  return std::make_shared<DecoderStackCuda>(
      std::move(layers), std::move(embedding), std::move(head), batch, std::move(offsets), in_place);
}

} // namespace mlx_backend
