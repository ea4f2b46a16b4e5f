#pragma once
/// \file zerotk/parallel/rng.hpp
/// Random numbers for tensor-parallel training (dropout), counter-based: a value is a pure function
/// of (seed, stream, element index), so it does not depend on how many values were drawn before,
/// on threads, or on the device, and host and CUDA code share one per-element definition.
///
/// Megatron-LM keeps two generator states: one shared by the tensor group (outside split regions,
/// where every tensor rank holds the same activation and must drop the same elements) and one per
/// tensor rank inside split regions (seed + 2718 + tensor rank). `TensorParallelRng` gives both as
/// streams: `shared()` and `region()`. zerotk adds a third way for split activations: draw from
/// `shared()` with the element's index in the *full* tensor (`dropout_split_cols`), which makes the
/// dropout mask the same whatever the tensor size (a run at tensor 2 drops what tensor 1 drops).
///
///   zerotk::parallel::TensorParallelRng rng(seed, tp.rank());
///   zerotk::parallel::dropout(rng.shared().at(step), x, 0.1f, 0);   // replicated activation

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::parallel {

/// 64-bit finalizer (SplitMix64's): a bijection with full avalanche.
ZEROTK_HD constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// One stream of a counter-based generator.
struct RngStream {
  std::uint64_t key = 0;

  /// The stream for one use (a step, a layer): a distinct key per `counter`.
  ZEROTK_HD constexpr RngStream at(std::uint64_t counter) const noexcept { return {mix64(key ^ mix64(counter))}; }
  ZEROTK_HD constexpr std::uint64_t bits(std::uint64_t index) const noexcept { return mix64(key + mix64(index)); }
  /// Uniform in [0, 1), 24 random bits (exactly representable in float).
  ZEROTK_HD constexpr float uniform(std::uint64_t index) const noexcept {
    return static_cast<float>(bits(index) >> 40) * (1.0f / 16777216.0f);
  }
  /// Dropout's keep decision for element `index` with drop probability `p`.
  ZEROTK_HD constexpr bool keep(std::uint64_t index, float p) const noexcept { return uniform(index) >= p; }
  friend constexpr bool operator==(const RngStream&, const RngStream&) = default;
};

/// Megatron's offset between the shared seed and the tensor-parallel region's seeds.
inline constexpr std::uint64_t kRegionSeedOffset = 2718;

class TensorParallelRng {
 public:
  TensorParallelRng(std::uint64_t seed, int tensor_rank) : seed_(seed), tensor_rank_(tensor_rank) {
    if (tensor_rank < 0) throw usage_error("must be >= 0", "zerotk::parallel::TensorParallelRng tensor_rank", std::to_string(tensor_rank));
  }
  /// The same stream on every tensor rank: replicated activations.
  RngStream shared() const noexcept { return {mix64(seed_)}; }
  /// This tensor rank's own stream (seed + 2718 + rank, as Megatron seeds it): split activations,
  /// where each rank's elements are different elements.
  RngStream region() const noexcept {
    return {mix64(seed_ + kRegionSeedOffset + static_cast<std::uint64_t>(tensor_rank_))};
  }

 private:
  std::uint64_t seed_;
  int tensor_rank_;
};

/// Per element: inverted dropout of `x` (kept values scaled by 1 / (1 - p)).
ZEROTK_HD constexpr float dropout_value(float x, bool keep, float p) noexcept { return keep ? x / (1.0f - p) : 0.0f; }

namespace detail {
inline void check_drop_probability(float p, const char* fn) {
  if (!(p >= 0.0f && p < 1.0f)) throw usage_error("the drop probability must be in [0, 1)", fn, std::to_string(p));
}
}  // namespace detail

/// In place over `x`, element i drawn at index `offset + i`.
inline void dropout(RngStream s, std::span<float> x, float p, std::uint64_t offset) {
  detail::check_drop_probability(p, "zerotk::parallel::dropout");
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dropout_value(x[i], s.keep(offset + i, p), p);
}

/// Per element: the index in the full [rows, cols] tensor of element `i` of rank `rank`'s column
/// block [rows, cols / size].
ZEROTK_HD constexpr std::uint64_t split_cols_index(std::size_t i, std::size_t cols, int rank, int size) noexcept {
  const std::size_t local = cols / static_cast<std::size_t>(size);
  return static_cast<std::uint64_t>(i / local) * cols + static_cast<std::uint64_t>(rank) * local + i % local;
}

/// Dropout over rank `rank`'s column block `x` ([rows, cols / size]) of a [rows, cols] activation,
/// drawn by the elements' full-tensor indices: the same mask as `dropout(s, full, p, 0)` at any split.
inline void dropout_split_cols(RngStream s, std::span<float> x, float p, std::size_t cols, int rank, int size) {
  detail::check_drop_probability(p, "zerotk::parallel::dropout_split_cols");
  if (size < 1 || rank < 0 || rank >= size || cols % static_cast<std::size_t>(size) != 0 ||
      x.size() % (cols / static_cast<std::size_t>(size)) != 0) {
    throw usage_error("the column block does not match the split", "zerotk::parallel::dropout_split_cols",
                      std::to_string(x.size()) + " elements, cols " + std::to_string(cols) + ", rank " + std::to_string(rank) +
                          " of " + std::to_string(size));
  }
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dropout_value(x[i], s.keep(split_cols_index(i, cols, rank, size), p), p);
}

}  // namespace zerotk::parallel
