// The part of {fmt} that MLX's CUDA headers use (backend/cuda/lru_cache.h
// formats one error message), for CUDA builds where {fmt} is not installed:
// the pip wheels ship MLX's headers without it. Replaces each "{}" in order.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace fmt {

namespace detail {
inline void format_to(std::ostringstream& out, std::string_view text) {
  out << text;
}

template <typename T, typename... Rest>
void format_to(std::ostringstream& out, std::string_view text, const T& first, const Rest&... rest) {
  auto at = text.find("{}");
  if (at == std::string_view::npos) {
    out << text;
    return;
  }
  out << text.substr(0, at) << first;
  format_to(out, text.substr(at + 2), rest...);
}
} // namespace detail

template <typename... Args>
std::string format(std::string_view text, const Args&... args) {
  std::ostringstream out;
  detail::format_to(out, text, args...);
  return out.str();
}

} // namespace fmt
