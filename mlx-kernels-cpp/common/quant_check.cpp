#include "common/quant_check.h"

#include <stdexcept>

#include "common/fallback_primitive.h"

namespace mx = mlx::core;

namespace mlx_backend {

namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string(op) + ": " + msg);
}

} // namespace

void quant_fail(const char* op, const std::string& msg) {
  fail(op, msg);
}

std::string shape_str(const mx::Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + ")";
}

int check_quant_matrix(
    const char* op,
    const char* what,
    const std::vector<array>& q,
    int k,
    int group_size,
    int bits,
    mx::Shape lead) {
  if (q.size() != 3) {
    fail(op, std::string(what) + " must be [weight, scales, biases]");
  }
  const auto& w = q[0];
  if (w.dtype() != mx::uint32) {
    fail(op, std::string(what) + " weight must be uint32 (packed), got another dtype");
  }
  if (w.ndim() != lead.size() + 1) {
    fail(op, std::string(what) + " weight must have rank " + std::to_string(lead.size() + 1) +
         ", got shape " + shape_str(w.shape()));
  }
  for (size_t i = 0; i < lead.size(); ++i) {
    if (lead[i] != 0 && w.shape(i) != lead[i]) {
      fail(op, std::string(what) + " weight shape " + shape_str(w.shape()) +
           " does not match the other projection");
    }
  }
  if (static_cast<int64_t>(w.shape(-1)) * 32 != static_cast<int64_t>(k) * bits) {
    fail(op, std::string(what) + " weight has " + std::to_string(w.shape(-1)) +
         " packed words per row; K = " + std::to_string(k) + " at " + std::to_string(bits) +
         " bits needs " + std::to_string(k * bits / 32));
  }
  auto gshape = w.shape();
  gshape.back() = k / group_size;
  for (int i = 1; i < 3; ++i) {
    if (q[i].shape() != gshape) {
      fail(op, std::string(what) + (i == 1 ? " scales" : " biases") + " must have shape " +
           shape_str(gshape) + ", got " + shape_str(q[i].shape()));
    }
    if (!is_float(q[i].dtype())) {
      fail(op, std::string(what) + " scales and biases must be float");
    }
  }
  return w.shape(-2);
}

int check_quant_x(const char* op, const array& x, int group_size, int bits) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
    fail(op, "bits must be one of 2, 3, 4, 5, 6, 8 (MLX affine), got " + std::to_string(bits));
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    fail(op, "group size must be 32, 64 or 128, got " + std::to_string(group_size));
  }
  if (x.ndim() < 1 || !is_float(x.dtype())) {
    fail(op, "x must be a float array of rank >= 1");
  }
  int k = x.shape(-1);
  if (k % group_size != 0) {
    fail(op, "K = " + std::to_string(k) + " is not a multiple of the group size " +
         std::to_string(group_size));
  }
  return k;
}

} // namespace mlx_backend
