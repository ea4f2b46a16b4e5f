#pragma once
/// \file zerotk/pipeline/partition.hpp
/// Which layers each (virtual) stage holds: by count, or by a cost per layer. Both return the
/// stage boundaries: `parts + 1` layer indices, stage k holding layers [bounds[k], bounds[k+1]).
///
///   auto b = zerotk::pipeline::partition_uniform(10, 4);            // {0, 3, 6, 8, 10}
///   auto c = zerotk::pipeline::partition_balanced(param_counts, 4);  // DeepSpeed's "parameters"
///
/// The meanings follow DeepSpeed's PipelineModule `partition_method`: "uniform" balances the
/// number of layers (the first `layers % parts` stages get one more; with fewer layers than stages
/// the last stages are empty), "parameters" balances the trainable parameters per stage. Here any
/// cost works (parameters, measured times, FLOPs): `partition_balanced` gives the partition whose
/// most expensive stage costs least, every stage non-empty when there are enough layers, and among
/// those the one whose earlier stages take as many layers as that bound allows.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::pipeline {

inline std::vector<std::size_t> partition_uniform(std::size_t layers, int parts) {
  if (parts < 1) throw usage_error("needs at least one part", "pipeline::partition_uniform", std::to_string(parts));
  const auto n = static_cast<std::size_t>(parts);
  std::vector<std::size_t> b(n + 1, 0);
  const std::size_t base = layers / n, extra = layers % n;
  for (std::size_t k = 0; k < n; ++k) b[k + 1] = b[k] + base + (k < extra ? 1 : 0);
  return b;
}

namespace detail {

// The greedy partition under `bound`: each stage takes layers while its cost stays within the bound
// and enough layers remain for the later stages to be non-empty. Empty when it does not fit.
inline std::vector<std::size_t> fill_within(std::span<const std::uint64_t> cost, std::size_t parts, std::uint64_t bound) {
  const std::size_t n = cost.size();
  std::vector<std::size_t> b(parts + 1, 0);
  std::size_t at = 0;
  for (std::size_t k = 0; k < parts; ++k) {
    const std::size_t keep = n >= parts ? parts - k - 1 : 0;  // layers the later stages need
    std::uint64_t sum = 0;
    while (at < n && at + keep < n && sum + cost[at] <= bound) sum += cost[at++];
    b[k + 1] = at;
  }
  if (at != n) return {};
  return b;
}

}  // namespace detail

inline std::vector<std::size_t> partition_balanced(std::span<const std::uint64_t> cost, int parts) {
  if (parts < 1) throw usage_error("needs at least one part", "pipeline::partition_balanced", std::to_string(parts));
  const auto n = static_cast<std::size_t>(parts);
  std::uint64_t lo = 0, hi = 0;
  for (std::uint64_t c : cost) {
    lo = std::max(lo, c);
    if (hi + c < hi) throw usage_error("layer costs overflow 64 bits", "pipeline::partition_balanced");
    hi += c;
  }
  // The smallest bound under which the greedy fill succeeds (it succeeds under every larger one).
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (detail::fill_within(cost, n, mid).empty()) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return detail::fill_within(cost, n, lo);
}

/// The layers [first, last) of part `k`.
struct LayerRange {
  std::size_t first = 0, last = 0;
  std::size_t size() const noexcept { return last - first; }
  bool operator==(const LayerRange&) const = default;
};

inline LayerRange layers_of(const std::vector<std::size_t>& bounds, int part) {
  if (part < 0 || static_cast<std::size_t>(part) + 1 >= bounds.size()) {
    throw usage_error("part must be in [0, parts)", "pipeline::layers_of", std::to_string(part));
  }
  return {bounds[static_cast<std::size_t>(part)], bounds[static_cast<std::size_t>(part) + 1]};
}

}  // namespace zerotk::pipeline
