#pragma once
/// \file zerotk/engine/tensor_splits.hpp
/// Construction-time agreement on how parameters are split across the tensor group
/// (ModelOptions::tensor_split): every rank of a pipeline stage must declare the same split for the
/// same parameter, or the norm would count some elements twice or not at all. Collective over the
/// grid's world (a small all-reduce, then one of two values per parameter of every stage), so a
/// disagreement is a usage_error on every rank, naming the first parameter that differs on the
/// stage's ranks and the stage on the others, never a hang or a wrong norm.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::engine {

namespace detail {
/// A parameter's declaration as a number below 2^52 (exact in the fp64 all-reduce): its name, split
/// and element count (the shard's, the same on every rank that holds that shard). An expert
/// parameter's name is left out (ranks of other expert indices hold other experts at the same
/// place in their models): that it is an expert's, its split and size must still agree.
inline double split_code(const ParamEntry& e) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  const auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xFF)) * 1099511628211ull;
  };
  if (e.group == GroupKind::expert) {
    mix(0x65787065727421ull);  // "expert!"
  } else {
    for (char c : e.name) mix(static_cast<unsigned char>(c));
  }
  mix(static_cast<std::uint64_t>(e.tensor_split.dim));
  mix(static_cast<std::uint64_t>(e.tensor_split.parts));
  mix(e.numel);
  return static_cast<double>(h & ((std::uint64_t{1} << 52) - 1));
}
}  // namespace detail

/// Why parameter `e`'s declared split cannot describe the shard its Param holds, or empty: a column
/// split needs a matrix (2 dimensions: the checkpoint merges and splits it by columns), and the split
/// dimension of the shard must divide into the fused parts.
inline std::string split_shape_problem(const ParamEntry& e) {
  const parallel::TensorSplit s = e.tensor_split;
  if (!s.is_split()) return {};
  if (s.parts < 1) return "the fused part count must be >= 1";
  if (s.dim == parallel::SplitDim::cols && e.shape.size() != 2) {
    return "a column split needs a parameter of 2 dimensions (rows, cols); this one has " + std::to_string(e.shape.size());
  }
  const std::size_t extent = s.dim == parallel::SplitDim::rows ? (e.shape.empty() ? e.numel : e.shape[0]) : e.shape[1];
  if (extent % static_cast<std::size_t>(s.parts) != 0) {
    return std::string(s.dim == parallel::SplitDim::rows ? "dim 0" : "dim 1") + " of this rank's shard (" +
           std::to_string(extent) + ") does not divide into " + std::to_string(s.parts) + " fused parts";
  }
  return {};
}

/// Checks that the ranks of each pipeline stage declare the same parameters (experts: at the same
/// places, whichever experts they hold) with the same splits,
/// each one a split its shard's shape allows. Collective over `world`, the grid's world (every
/// stage): this rank holds the parameters of stage `stage` of `stages`. Every rank sees every stage's
/// verdict, so all of them throw when one stage disagrees: its ranks naming the parameter, the others
/// naming the stage (issue 56: with pipeline stages the check used to be skipped).
template <class Comm>
void check_tensor_splits(Comm& world, const ParamRegistry& registry, int stage = 0, int stages = 1) {
  const std::size_t n = registry.size();
  const auto st = static_cast<std::size_t>(stage), ns = static_cast<std::size_t>(stages);
  std::size_t bad = n;  // the first parameter whose split does not fit its shape
  for (std::size_t i = 0; i < n && bad == n; ++i) {
    if (!split_shape_problem(registry[static_cast<ParamId>(i)]).empty()) bad = i;
  }
  const std::string here = "rank " + std::to_string(world.rank());
  const auto other = [&](std::size_t s) { return "pipeline stage " + std::to_string(s); };
  // Per stage {count, -count, a split that does not fit}; other stages' slots stay -inf (max).
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  std::vector<double> count(3 * ns, kNone);
  count[3 * st] = static_cast<double>(n);
  count[3 * st + 1] = -static_cast<double>(n);
  count[3 * st + 2] = bad < n ? 1.0 : 0.0;
  // Agreed before anyone throws: a rank that threw alone would leave the others in the next collective.
  world.all_reduce_host(count.data(), count.data(), count.size(), comm::ReduceOp::max);
  if (bad < n) {
    const ParamEntry& e = registry[static_cast<ParamId>(bad)];
    throw usage_error("the declared tensor split does not fit the parameter: " + split_shape_problem(e), e.name,
                      parallel::to_text(e.tensor_split) + " of a shard of " + std::to_string(e.numel) + " elements");
  }
  for (std::size_t s = 0; s < ns; ++s) {
    if (count[3 * s + 2] > 0) {
      throw usage_error("another rank of the grid (" + other(s) + ") declares a tensor split its parameter's shape "
                        "does not allow (that rank's error names it)",
                        here);
    }
  }
  for (std::size_t s = 0; s < ns; ++s) {
    if (count[3 * s] == -count[3 * s + 1]) continue;
    const std::string range = "between " + std::to_string(static_cast<long long>(-count[3 * s + 1])) + " and " +
                              std::to_string(static_cast<long long>(count[3 * s]));
    if (s == st) {
      throw usage_error("ranks of the grid register different numbers of parameters, so their tensor splits cannot agree",
                        here, std::to_string(n) + " here; " + range + " on the others");
    }
    throw usage_error("ranks of " + other(s) + " register different numbers of parameters (" + range +
                          "), so their tensor splits cannot agree",
                      here);
  }
  // Each stage's codes and their negations, one region per stage: [code..., -code...].
  std::vector<std::size_t> at(ns + 1, 0);
  for (std::size_t s = 0; s < ns; ++s) at[s + 1] = at[s] + 2 * static_cast<std::size_t>(count[3 * s]);
  std::vector<double> hi(at[ns], kNone);
  for (std::size_t i = 0; i < n; ++i) {
    hi[at[st] + i] = detail::split_code(registry[static_cast<ParamId>(i)]);
    hi[at[st] + n + i] = -hi[at[st] + i];
  }
  world.all_reduce_host(hi.data(), hi.data(), hi.size(), comm::ReduceOp::max);
  for (std::size_t s = 0; s < ns; ++s) {
    const std::size_t m = (at[s + 1] - at[s]) / 2;
    for (std::size_t i = 0; i < m; ++i) {
      if (hi[at[s] + i] == -hi[at[s] + m + i]) continue;
      if (s != st) {
        throw usage_error("ranks of " + other(s) + " declare their parameter " + std::to_string(i) +
                              " differently (their error names it)",
                          here);
      }
      const ParamEntry& e = registry[static_cast<ParamId>(i)];
      throw usage_error("ranks of the grid declare this parameter differently (its name, tensor split or shard size "
                        "differ between ranks); ModelOptions::tensor_split must give every rank the same answer",
                        e.name,
                        "on rank " + std::to_string(world.rank()) + ": " + parallel::to_text(e.tensor_split) + ", " +
                            std::to_string(e.numel) + " elements");
    }
  }
}

}  // namespace zerotk::engine
