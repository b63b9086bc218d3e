// Contract checks shared by the ops on MLX affine-quantized weights; every
// failure throws std::invalid_argument prefixed with the op's name.
#pragma once

#include <string>
#include <vector>

#include "bridge.h"

namespace mlx_backend {

[[noreturn]] void quant_fail(const char* op, const std::string& msg);

std::string shape_str(const mlx::core::Shape& s);

// Checks one [weight, scales, biases] triple against x's K; `lead` is the
// expected leading shape of the weight ([N] dense, [E, N] indexed, N taken
// from the weight itself when 0). Returns N.
int check_quant_matrix(
    const char* op,
    const char* what,
    const std::vector<array>& q,
    int k,
    int group_size,
    int bits,
    mlx::core::Shape lead);

// Checks bits, group size and x (float, rank >= 1, K a multiple of the
// group size). Returns K.
int check_quant_x(const char* op, const array& x, int group_size, int bits);

} // namespace mlx_backend
