#include "common/grad_check.h"

#include "mlx-backend/mlx-backend/ffi.rs.h"
#include "moe_combine/moe_combine.h"
#include "rms_norm/rms_norm.h"

namespace mx = mlx::core;

namespace mlx_backend {

std::unique_ptr<ArrayList> kernel_vjp(
    int32_t kernel,
    bool fused,
    const ArrayList& primals,
    const ArrayList& cotangents,
    float eps,
    StreamSpec spec) {
  auto s = to_stream(spec);
  std::function<std::vector<array>(const std::vector<array>&)> f;
  switch (kernel) {
    case 0:
      f = [=](const std::vector<array>& in) {
        return std::vector<array>{rms_norm_op(in.at(0), in.at(1), eps, fused, s)};
      };
      break;
    case 1:
      f = [=](const std::vector<array>& in) {
        return rms_norm_residual_op(in.at(0), in.at(1), in.at(2), eps, fused, s);
      };
      break;
    case 2:
      f = [=](const std::vector<array>& in) {
        return std::vector<array>{moe_combine_op(in.at(0), in.at(1), fused, s)};
      };
      break;
    default:
      throw std::invalid_argument("kernel_vjp: unknown kernel " + std::to_string(kernel));
  }
  auto [_, grads] = mx::vjp(f, primals.items, cotangents.items);
  auto out = std::make_unique<ArrayList>();
  out->items = std::move(grads);
  return out;
}

} // namespace mlx_backend
