// The shared base of this crate's custom Primitives, modelled on MLX's
// fast::Custom (which libmlx does not export): the Primitive stores its
// fallback graph as a function and derives vjp, jvp and vmap from it, so
// gradients and vectorisation equal those of the unfused MLX ops.
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/gpu_body.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "rust/cxx.h"

namespace mlx_backend {

using Fallback =
    std::function<std::vector<mlx::core::array>(std::vector<mlx::core::array>)>;

class FallbackPrimitive : public mlx::core::Primitive {
 public:
  FallbackPrimitive(mlx::core::Stream stream, Fallback fallback)
      : mlx::core::Primitive(stream), fallback_(std::move(fallback)) {}

  // Runs the GPU body the op attached; the op builds the fallback graph on
  // a GPU stream where the kernel has no body (the registry's table).
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override {
    if (!gpu_body_) {
      throw std::runtime_error(std::string(name()) + " has no GPU body in this build");
    }
    gpu_body_->run(stream(), inputs, outputs);
  }

  void set_gpu_body(std::shared_ptr<GpuBody> body) {
    gpu_body_ = std::move(body);
  }

  std::vector<mlx::core::array> vjp(
      const std::vector<mlx::core::array>& primals,
      const std::vector<mlx::core::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mlx::core::array>& outputs) override;

  std::vector<mlx::core::array> jvp(
      const std::vector<mlx::core::array>& primals,
      const std::vector<mlx::core::array>& tangents,
      const std::vector<int>& argnums) override;

  std::pair<std::vector<mlx::core::array>, std::vector<int>> vmap(
      const std::vector<mlx::core::array>& inputs,
      const std::vector<int>& axes) override;

 protected:
  Fallback fallback_;
  std::shared_ptr<GpuBody> gpu_body_;
};

// Allocates an output buffer before a kernel writes it.
void allocate(mlx::core::array& out);

// The bytes of a (row-contiguous) array, for the Rust kernels.
rust::Slice<const uint8_t> bytes_of(const mlx::core::array& a);
rust::Slice<uint8_t> bytes_of_mut(mlx::core::array& a);

// Fills a float output with NaN: what a failed kernel leaves behind.
void poison(mlx::core::array& out);

// Rejects a non-row-contiguous input at eval time (for ops that feed their
// inputs through mlx::core::contiguous; it guards against a strided array
// ever being read as if dense).
void require_row_contiguous(const mlx::core::array& a, const char* what);

// The start of eval_cpu for ops whose inputs all went through
// mlx::core::contiguous: checks them, allocates `out` and registers both with
// the stream's CPU encoder, which it returns for the dispatch.
mlx::core::cpu::CommandEncoder& begin_dense_eval(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    mlx::core::array& out,
    const char* what);

// An input as a kernel reads it: the array itself when it is row-contiguous
// (the usual case, no copy and no graph node), otherwise a dense buffer
// allocated in eval_cpu and filled on the stream by fill(), before the
// kernel runs. Views (transposes, slices, broadcasts) take the copy, so the
// op functions need no mlx::core::contiguous node per input.
class DenseInput {
 public:
  // Throws when the dense copy cannot be allocated (MLX's allocator hands
  // back a null buffer rather than throwing).
  DenseInput(const mlx::core::array& a, const char* what);
  const mlx::core::array& get() const {
    return dense_;
  }
  // Copies the view into the dense buffer; a no-op for a dense input. Call
  // on the stream (the input's data is ready there).
  void fill();

 private:
  mlx::core::array src_;
  mlx::core::array dense_;
  bool copy_;
};

bool is_float(mlx::core::Dtype t);

// `a` itself when it is already evaluated and row-contiguous (a model's
// weights), else `mlx::core::contiguous(a)`: ops that read inputs as dense
// buffers add no graph node for inputs that are dense already.
mlx::core::array dense_input(const mlx::core::array& a, mlx::core::Stream s);

} // namespace mlx_backend
