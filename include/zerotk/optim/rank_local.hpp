#pragma once
/// \file zerotk/optim/rank_local.hpp
/// The state a rank's compressed communication carries from step to step (the 1-bit optimizers'
/// exchanges, optim/onebit_exchange.hpp; GradientCompression's residuals), and how its parts read
/// it back in the order they appended it. Part of an engine's state (engine/state.hpp); here, below
/// the engine, so that the exchanges that own it sit next to their optimizers.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk {

/// What one rank's compressed communication carries from step to step, meaningful only on the same
/// rank of the same world size and layout: the error feedback (GradientCompression's residual per
/// element; 1-bit Adam's, 0/1 Adam's and 1-bit LAMB's worker and server errors), 0/1 Adam's
/// accumulator u (values) and lr sums L (scalars), 1-bit LAMB's flat tail. Each part of a group
/// appends its own in a fixed order (engine/group.hpp). Empty: they start from zero.
struct RankLocalState {
  std::vector<float> values;
  std::vector<double> scalars;
  bool empty() const noexcept { return values.empty() && scalars.empty(); }
};

/// How many values and scalars a group's rank-local state has.
struct RankLocalSize {
  std::size_t values = 0, scalars = 0;
  friend bool operator==(const RankLocalSize&, const RankLocalSize&) = default;
  RankLocalSize& operator+=(const RankLocalSize& o) noexcept {
    values += o.values;
    scalars += o.scalars;
    return *this;
  }
};

inline RankLocalSize size_of(const RankLocalState& s) noexcept { return {s.values.size(), s.scalars.size()}; }

/// Reads a RankLocalState front to back, each part taking its own (the order it was appended in).
class RankLocalReader {
 public:
  explicit RankLocalReader(const RankLocalState& s) : values_(s.values), scalars_(s.scalars) {}
  std::span<const float> values(std::size_t n) { return take(values_, n); }
  std::span<const double> scalars(std::size_t n) { return take(scalars_, n); }

 private:
  template <class T>
  static std::span<const T> take(std::span<const T>& from, std::size_t n) {
    if (n > from.size()) {
      throw usage_error("rank-local state is shorter than this engine's", "engine::RankLocalReader",
                        std::to_string(n) + " wanted, " + std::to_string(from.size()) + " left");
    }
    std::span<const T> out = from.first(n);
    from = from.subspan(n);
    return out;
  }
  std::span<const float> values_;
  std::span<const double> scalars_;
};

}  // namespace zerotk
