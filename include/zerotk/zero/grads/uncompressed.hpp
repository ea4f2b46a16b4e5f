#pragma once
/// \file zerotk/zero/grads/uncompressed.hpp
/// Uncompressed: what a gradient path that sends dense reductions has of the compressed path's
/// members (zero/concepts.hpp, GradientPath): nothing to reset, no error feedback, no replaced
/// traffic. The uncompressed paths derive from it.

#include <cstdint>
#include <span>

namespace zerotk::zero {

struct Uncompressed {
  void reset() noexcept {}
  std::span<const float> error_feedback() const noexcept { return {}; }
  void load_error_feedback(std::span<const float>) noexcept {}
  std::uint64_t wire_bytes() const noexcept { return 0; }
  std::uint64_t dense_bytes() const noexcept { return 0; }
};

}  // namespace zerotk::zero
