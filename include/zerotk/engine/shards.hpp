#pragma once
/// \file zerotk/engine/shards.hpp
/// ShardTable: where an engine keeps every parameter's fp32 master and optimizer state, on every
/// rank. Each flat group of EngineState (the working-precision group, the fp32-kept group, the
/// experts') is described rank by rank (the group's ranks) as fragments: "elements [a, a + n) of parameter p sit at offset o of this
/// rank's owned buffer". Two engines whose tables differ (another world size, stage or bucket size)
/// can still exchange state by intersecting fragments of the same parameter: that is how a
/// checkpoint loads on another world size, and how it is exported as whole tensors.

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/parallel/split.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::engine {

struct ShardParam {
  std::string name;
  std::vector<std::uint64_t> shape;  ///< the parameter's shape ({numel} if its type has none); a shard's own
  std::uint64_t numel = 0;
  std::string dtype;                  ///< the parameter's own element type ("fp32", "fp16", "bf16")
  std::uint32_t group = 0;            ///< flat group index in EngineState::groups
  std::uint32_t optimizer_group = 0;
  /// A parameter split across the tensor group (ModelOptions::tensor_split) is recorded once per
  /// tensor rank: tensor rank `tensor_index`'s shard of `tensor_size`, cut by `tensor_split`. A
  /// whole parameter (replicated, or a tensor size of 1) has tensor_size 1.
  int tensor_index = 0, tensor_size = 1;
  parallel::TensorSplit tensor_split{};

  bool is_shard() const noexcept { return tensor_size > 1; }
  /// The shard's extent as a matrix: dim 0 by the product of the others.
  parallel::MatrixShape shard_matrix() const noexcept {
    const std::uint64_t rows = shape.empty() ? numel : shape[0];
    return {static_cast<std::size_t>(rows), static_cast<std::size_t>(rows == 0 ? 0 : numel / rows)};
  }
  /// The whole parameter's extent (the shard's own when it is whole).
  parallel::MatrixShape full_matrix() const noexcept {
    return parallel::full_shape(shard_matrix(), tensor_split, tensor_size);
  }
  /// The whole parameter's shape: the shard's with the split dimension multiplied back.
  std::vector<std::uint64_t> full_shape() const {
    std::vector<std::uint64_t> s = shape.empty() ? std::vector<std::uint64_t>{numel} : shape;
    if (is_shard()) s[tensor_split.dim == parallel::SplitDim::rows ? 0 : 1] *= static_cast<std::uint64_t>(tensor_size);
    return s;
  }
  std::uint64_t full_numel() const noexcept { return numel * static_cast<std::uint64_t>(tensor_size); }
  friend bool operator==(const ShardParam&, const ShardParam&) = default;
};

struct ShardTable {
  std::vector<ShardParam> params;  ///< in the model's visitation order (ParamId)
  /// [flat group][rank]: the fragments each rank owns, in owned-buffer order; Fragment::param is a
  /// ParamId (an index into `params`).
  std::vector<std::vector<std::vector<zero::Fragment>>> fragments;
  std::vector<std::vector<std::uint64_t>> owned_numel;  ///< [flat group][rank], padding included
  friend bool operator==(const ShardTable&, const ShardTable&) = default;
};

/// The table of an engine's groups, computed from the layouts (the same on every rank of a group, no
/// communication): what each rank owns is each group's ownership (zero/ownership.hpp), over the
/// group's own ranks: `world` data ranks for the dense groups, the expert-data group's for the
/// experts' (engine/comms.hpp). `tensor_index` of `tensor_size`: this rank's place in its tensor
/// group, which a split parameter's entry records.
template <class Groups>
ShardTable make_shard_table(const Groups& groups, const ParamRegistry& registry, int world, int tensor_index = 0,
                            int tensor_size = 1) {
  ShardTable t;
  std::uint32_t index[kGroupKinds] = {};  // flat group index of each GroupKind
  groups.each([&](const auto& g) {
    using G = std::remove_cvref_t<decltype(g)>;
    using Own = typename G::Own;
    index[static_cast<std::size_t>(g.kind())] = static_cast<std::uint32_t>(t.fragments.size());
    auto& per_rank = t.fragments.emplace_back();
    auto& owned = t.owned_numel.emplace_back();
    const int ranks = g.kind() == GroupKind::expert ? g.layout().world() : world;
    for (int r = 0; r < ranks; ++r) {
      per_rank.push_back(Own::fragments(g.layout(), r));
      for (zero::Fragment& f : per_rank.back()) f.param = g.member(f.param);
      owned.push_back(Own::numel(g.layout()));
    }
  });
  for (const ParamEntry& e : registry.entries()) {
    ShardParam p;
    p.name = e.name;
    p.shape.assign(e.shape.begin(), e.shape.end());
    p.numel = e.numel;
    p.dtype = std::string(to_string(e.value_dtype));
    p.group = index[static_cast<std::size_t>(e.group)];
    p.optimizer_group = e.optimizer_group;
    if (tensor_size > 1 && e.tensor_split.is_split()) {
      p.tensor_index = tensor_index;
      p.tensor_size = tensor_size;
      p.tensor_split = e.tensor_split;
    }
    t.params.push_back(std::move(p));
  }
  return t;
}

}  // namespace zerotk::engine
