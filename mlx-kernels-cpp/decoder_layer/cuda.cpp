#include "decoder_layer/cuda.h"

#include <algorithm>
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
constexpr int kNormThreads = 256; // decoder_layer/cuda.cu
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

// Launches of one decode step on one stream: every kernel a node of MLX's
// CUDA graph, ordered by the arrays each reads and writes.
class StepLauncher {
 public:
  StepLauncher(const mx::Stream& s, mx::Dtype t) : s_(s), t_(t), dt_(dtype_suffix(t)) {}

  // A buffer for the step's intermediates, alive until the step has run.
  array scratch(mx::Shape shape, mx::Dtype t) {
    array a(std::move(shape), t, nullptr, {});
    allocate(a);
    keep_until_done(s_, a);
    return a;
  }

  void launch(
      const std::string& name,
      dim3 grid,
      dim3 block,
      const std::vector<array>& in,
      std::vector<array> out,
      std::vector<void*> args) {
    cuda_enqueue(s_, cuda_function(s_, fatbin::decoder_layer(), name), grid, block, in, out, std::move(args));
  }

  // out[:, col0 ..] = x · [matrices]ᵀ (+ bias) (+ residual), x and out of
  // dtype x_t and out_t; matrices of one bit width share a launch when
  // their columns suit the kernel's bucket.
  void project(
      const array& x,
      mx::Dtype x_t,
      const std::vector<Matrix>& matrices,
      const array* residual,
      array& out,
      mx::Dtype out_t,
      int rows,
      int k_len) {
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
        if (m.bias) {
          in.push_back(*m.bias);
        }
      }
      a.n_cols = cols;
      vec = vec && aligned16(in);
      std::string name = std::string("mlx_backend_step_proj_") + dtype_suffix(x_t) + "_" +
          dtype_suffix(matrices[first].scales->dtype()) + "_" + dtype_suffix(out_t) + "_b" +
          std::to_string(matrices[first].bits) + "_r" + std::to_string(b.rows);
      int per_block = kQmvWarpsPerBlock * b.cols;
      launch(
          name, dim3((cols + per_block - 1) / per_block, (rows + b.rows - 1) / b.rows),
          dim3(32 * kQmvWarpsPerBlock), in, {out}, {&a, &vec});
      col0 += cols;
      first = end;
    }
  }

  // out = silu(x·Gᵀ)·(x·Uᵀ).
  void gate(const array& x, const Matrix& g, const Matrix& u, array& out, int rows, int k_len) {
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
    std::vector<array> in{x, *g.w, *g.scales, *g.biases, *u.w, *u.scales, *u.biases};
    bool vec = k_len % 32 == 0 && (k_len * static_cast<int>(x.itemsize())) % 16 == 0 && aligned16(in);
    std::string name = std::string("mlx_backend_step_gate_") + dt_ + "_" +
        dtype_suffix(g.scales->dtype()) + "_b" + std::to_string(g.bits) + "_r" + std::to_string(b.rows);
    int per_block = kQmvWarpsPerBlock * b.gate_cols;
    launch(
        name, dim3((a.n_len + per_block - 1) / per_block, (rows + b.rows - 1) / b.rows),
        dim3(32 * kQmvWarpsPerBlock), in, {out}, {&a, &vec});
  }

  // normed = RMSNorm(x) with f32 weights w.
  void norm(const array& x, const array& w, float eps, array& normed, int rows, int hidden) {
    const void* xp = device_ptr(x);
    const void* wp = device_ptr(w);
    void* np = device_ptr_mut(normed);
    launch(
        std::string("mlx_backend_step_norm_") + dt_, dim3(rows), dim3(kNormThreads), {x, w}, {normed},
        {&xp, &wp, &np, &eps, &hidden});
  }

  const char* dt() const {
    return dt_;
  }

 private:
  mx::Stream s_;
  mx::Dtype t_;
  const char* dt_;
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
    const auto& first = layers_[0]->config;
    const int hidden = first.hidden;
    const mx::Dtype t = embedding_ ? mx::float32 : inputs[0].dtype();
    StepLauncher step(s, t);
    auto& out = outputs[0];
    allocate(out);
    std::vector<std::pair<array, array>> copies;
    std::vector<array> caches = caches_to_write(inputs, outputs, in_place_, copies);
    for (auto& [src, dst] : copies) {
      copy(step, src, dst);
    }

    // The running hidden state h, the block's h + attention, the norms'
    // output and the other intermediates, reused by every block: each
    // kernel reads what the one before wrote, so the step is one chain.
    array h = embedding_ ? step.scratch({rows, hidden}, mx::float32) : inputs[0];
    if (embedding_) {
      embed(step, inputs[0], h);
    }
    array running = step.scratch({rows, hidden}, t);
    array h1 = step.scratch({rows, hidden}, t);
    array normed = step.scratch({rows, hidden}, t);
    // Flat, sized for the widest block; each block reads them with its
    // own row widths.
    int qkv_cols = 0, q_width = 0, inter = 0;
    for (const auto& layer : layers_) {
      const auto& c = layer->config;
      qkv_cols = std::max(qkv_cols, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim);
      q_width = std::max(q_width, c.n_heads * c.head_dim);
      inter = std::max(inter, c.intermediate);
    }
    array qkv = step.scratch({rows * qkv_cols}, t);
    array q = step.scratch({rows * q_width}, t);
    array attended = step.scratch({rows * q_width}, t);
    array act = step.scratch({rows * inter}, t);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& layer = *layers_[l];
      const auto& c = layer.config;
      const auto& v = layer.vectors;
      const int q_cols = c.n_heads * c.head_dim;
      step.norm(h, v.input_norm, c.eps, normed, rows, hidden);
      step.project(
          normed, t,
          {matrix(layer, 0, optional_ptr(v.qkv_bias[0])), matrix(layer, 1, optional_ptr(v.qkv_bias[1])),
           matrix(layer, 2, optional_ptr(v.qkv_bias[2]))},
          nullptr, qkv, t, rows, hidden);
      attend(step, layer, qkv, q, attended, caches, l);
      step.project(attended, t, {matrix(layer, 3)}, &h, h1, t, rows, q_cols);
      step.norm(h1, v.post_norm, c.eps, normed, rows, hidden);
      step.gate(normed, matrix(layer, 4), matrix(layer, 5), act, rows, hidden);
      const bool last = l + 1 == layers_.size();
      array& dst = last && !head_ ? out : running;
      step.project(act, t, {matrix(layer, 6)}, &h1, dst, t, rows, c.intermediate);
      h = dst;
    }
    if (head_) {
      step.norm(h, head_->norm_f32, head_->eps, normed, rows, hidden);
      const auto& p = head_->params;
      Matrix m{&p[1], &p[2], &p[3], head_->bits, head_->group_size, nullptr};
      step.project(normed, t, {m}, nullptr, out, mx::float32, rows, hidden);
    }
  }

 private:
  // dst = src, a cache that cannot be written in place (any view).
  void copy(StepLauncher& step, const array& src, array& dst) {
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
    step.launch(
        std::string("mlx_backend_step_copy_b") + std::to_string(src.itemsize()), dim3(std::max(blocks, 1)),
        dim3(256), {src}, {dst}, {&a});
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
        dim3(batch_), dim3(kNormThreads), {ids, p[0], p[1], p[2]}, {h},
        {&ip, &wp, &sp, &bp, &op, &vocab, &hidden, &group});
  }

  // RoPE and the cache append, then attention, for block l: rows go in
  // launches of up to kStepRowsPerLaunch rows (their caches travel in the
  // arguments); each launch also reads what the previous one wrote, so the
  // launches stay ordered.
  void attend(
      StepLauncher& step,
      const PreparedLayer& layer,
      const array& qkv,
      array& q,
      array& attended,
      const std::vector<array>& caches,
      size_t l) {
    const auto& c = layer.config;
    const auto& v = layer.vectors;
    const int rows = batch_;
    const int d = c.head_dim;
    int longest = 0;
    for (int b = 0; b < rows; ++b) {
      longest = std::max(longest, offsets_[l * rows + b] + 1);
    }
    const int splits = cuda_attention_key_splits(rows * c.n_heads, longest);
    std::optional<array> partials;
    if (splits > 1) {
      partials = step.scratch({rows * c.n_heads * splits * (d + 2)}, mx::float32);
    }
    for (int first = 0; first < rows; first += kStepRowsPerLaunch) {
      const int count = std::min(kStepRowsPerLaunch, rows - first);
      RowCaches rc{};
      std::vector<array> row_caches;
      for (int i = 0; i < count; ++i) {
        const size_t at = 2 * (l * rows + first + i);
        const array& k = caches[at];
        const array& vv = caches[at + 1];
        rc.k[i] = const_cast<void*>(device_ptr(k));
        rc.v[i] = const_cast<void*>(device_ptr(vv));
        rc.offset[i] = offsets_[l * rows + first + i];
        rc.capacity[i] = k.shape(2);
        row_caches.push_back(k);
        row_caches.push_back(vv);
      }
      RopeAppendArgs ra{};
      ra.qkv = device_ptr(qkv);
      ra.q_out = device_ptr_mut(q);
      ra.q_norm = v.qk_norm[0] ? static_cast<const float*>(device_ptr(*v.qk_norm[0])) : nullptr;
      ra.k_norm = v.qk_norm[1] ? static_cast<const float*>(device_ptr(*v.qk_norm[1])) : nullptr;
      ra.inv_freqs = static_cast<const float*>(device_ptr(v.inv_freqs));
      ra.caches = rc;
      ra.first_row = first;
      ra.nq = c.n_heads;
      ra.nkv = c.n_kv_heads;
      ra.d = d;
      ra.dims = c.rope_dims;
      ra.traditional = c.rope_traditional;
      ra.position_scale = c.rope_scale;
      ra.mscale = c.rope_mscale;
      ra.eps = c.eps;
      std::vector<array> in{qkv, v.inv_freqs};
      for (const auto& n : v.qk_norm) {
        if (n) {
          in.push_back(*n);
        }
      }
      if (first > 0) {
        in.push_back(q);
      }
      std::vector<array> written = row_caches;
      written.push_back(q);
      step.launch(
          std::string("mlx_backend_step_rope_append_") + step.dt(),
          dim3(c.n_heads + 2 * c.n_kv_heads, count), dim3(32), in, written, {&ra});

      StepAttentionArgs aa{};
      aa.q = device_ptr(q);
      aa.out = device_ptr_mut(attended);
      aa.partials = partials ? static_cast<float*>(device_ptr_mut(*partials)) : nullptr;
      aa.caches = rc;
      aa.first_row = first;
      aa.nq = c.n_heads;
      aa.nkv = c.n_kv_heads;
      aa.d = d;
      aa.splits = splits;
      aa.scale = c.attn_scale;
      std::vector<array> attn_in{q};
      attn_in.insert(attn_in.end(), row_caches.begin(), row_caches.end());
      if (first > 0) {
        attn_in.push_back(partials ? *partials : attended);
      }
      step.launch(
          std::string("mlx_backend_step_attention_") + step.dt(), dim3(splits, c.n_heads, count),
          dim3(32 * kAttendWarps), attn_in, {partials ? *partials : attended}, {&aa});
    }
    if (partials) {
      const void* pp = device_ptr(*partials);
      void* op = device_ptr_mut(attended);
      int dd = d;
      int ss = splits;
      step.launch(
          std::string("mlx_backend_step_attention_merge_") + step.dt(), dim3(rows * c.n_heads),
          dim3(32 * kAttendWarps), {*partials}, {attended}, {&pp, &op, &dd, &ss});
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
