#pragma once
/// \file zerotk/parallel/elementwise.hpp
/// The per-element definitions of the tensor-parallel layers, shared by the host loops
/// (region.hpp, vocab.hpp) and the CUDA kernels (parallel/cuda/kernels.cuh). Index math and the
/// cross-entropy gradient; split.hpp's full_index and rng.hpp's streams are the others.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "zerotk/core/macros.hpp"

namespace zerotk::parallel {

/// Per element: where element `i` of the full [rows, cols] matrix sits in the all-gathered buffer of
/// T column blocks ([T][rows][cols / T], rank-major). The one definition host and device share.
ZEROTK_HD constexpr std::size_t gathered_index(std::size_t i, std::size_t rows, std::size_t cols, int size) noexcept {
  const std::size_t local = cols / static_cast<std::size_t>(size);
  const std::size_t row = i / cols, col = i % cols;
  return (col / local) * rows * local + row * local + col % local;
}

/// The ids a rank owns: [begin, end).
struct VocabRange {
  std::int64_t begin = 0, end = 0;
  ZEROTK_HD constexpr bool owns(std::int64_t id) const noexcept { return id >= begin && id < end; }
  constexpr std::int64_t size() const noexcept { return end - begin; }
};

/// Per element: d loss_i / d logit_ij = (exp(logit - max) / sum - [j is the target]) * dloss_i.
ZEROTK_HD inline float xent_grad(float logit, float max, float sum, bool target, float dloss) noexcept {
  const float p = expf(logit - max) / sum;
  return (target ? p - 1.0f : p) * dloss;
}

}  // namespace zerotk::parallel
