#pragma once
/// \file zerotk/engine/norm_share.hpp
/// NormShare: what this rank adds to the boundary's global sums (engine/boundary.hpp), so that over
/// the whole grid every gradient element enters the norm once and every micro-batch's loss enters
/// the loss sum once, and the element count every rank agrees on for the norm's grid.
///
///   axis       what a rank holds                        what it counts
///   data       a disjoint part of its model shard's      all of it (the gradient path's owned
///              gradients (stage 0: the whole buffer)      blocks)
///   tensor     a shard of each split parameter; the       its shards of split parameters; the
///              whole of every other parameter             others on tensor rank 0 only; the loss
///                                                         on tensor rank 0 only (all compute it)
///   pipeline   its stage's layers                         its stage's
///
///   expert     its experts (the expert group's; their      all of it, by the same tensor rule
///              expert-data group shares them out)         (expert_tensor == tensor)
///
/// The agreed count: data rank 0 of each model shard adds what its rank counts (split parameters'
/// shards on every tensor rank, the rest on tensor rank 0), summed over the grid's world; of the
/// expert group, expert-data rank 0 of each expert shard.
/// Whether a parameter is split comes from the registry (ParamEntry::tensor_split); that every rank
/// of a stage declares the same splits is checked at construction (check_splits, collective over
/// the world: tensor_splits.hpp). A new axis that replicates or shards parameters (experts, context)
/// adds its rule here, not in the groups or the boundary.

#include <cstddef>
#include <cstdint>

#include "zerotk/engine/placement.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/tensor_splits.hpp"

namespace zerotk::engine {

class NormShare {
 public:
  /// One rank, or a rank of a data group alone: counts everything it owns, and its loss.
  NormShare() = default;
  explicit NormShare(const GridPlace& place) noexcept
      : whole_(place.tensor_index == 0), adds_count_(place.data_index == 0), adds_expert_count_(place.expert_data_index == 0) {}

  /// Counts every element it owns (false: only those of parameters split across the tensor group).
  bool whole() const noexcept { return whole_; }
  /// Whether it counts a parameter, given whether that parameter is split across the tensor group.
  bool counts(bool split) const noexcept { return whole_ || split; }
  /// What its `loss` adds to the loss sum. `rank_local`: the gradients differ by rank (1-bit Adam's
  /// compressed phase, a data group alone), every rank's loss counts.
  double loss_addend(double loss, bool rank_local) const noexcept { return whole_ || rank_local ? loss : 0.0; }
  /// What it adds to the agreed element count, given the elements its model shard counts.
  std::uint64_t count_addend(std::uint64_t counted) const noexcept { return adds_count_ ? counted : 0; }
  /// The same for the elements its expert shard counts.
  std::uint64_t expert_count_addend(std::uint64_t counted) const noexcept { return adds_expert_count_ ? counted : 0; }

  /// Checks at construction that every rank of each pipeline stage declares the same tensor splits
  /// (a usage_error on every rank otherwise; engine/tensor_splits.hpp). Collective over `world`, the
  /// grid's world, when the tensor size is above 1; nothing otherwise.
  template <class Comm>
  static void check_splits(Comm& world, const ParamRegistry& registry, const GridPlace& place) {
    if (place.tensor_size > 1) check_tensor_splits(world, registry, place.pipeline_index, place.pipeline_size);
  }

 private:
  bool whole_ = true;       // tensor rank 0: adds the parameters every tensor rank holds whole, and the loss
  bool adds_count_ = true;  // data rank 0: adds its model shard's count to the agreed one
  bool adds_expert_count_ = true;  // expert-data rank 0: adds its expert shard's count
};

}  // namespace zerotk::engine
