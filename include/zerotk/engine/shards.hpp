#pragma once
/// \file zerotk/engine/shards.hpp
/// ShardTable: where an engine keeps every parameter's fp32 master and optimizer state, on every
/// rank. Each flat group of EngineState (the working-precision group, then the fp32-kept group) is
/// described rank by rank as fragments: "elements [a, a + n) of parameter p sit at offset o of this
/// rank's owned buffer". Two engines whose tables differ (another world size, stage or bucket size)
/// can still exchange state by intersecting fragments of the same parameter: that is how a
/// checkpoint loads on another world size, and how it is exported as whole tensors.

#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/zero/layout.hpp"

namespace zerotk::engine {

struct ShardParam {
  std::string name;
  std::vector<std::uint64_t> shape;  ///< the parameter's shape ({numel} if its type has none)
  std::uint64_t numel = 0;
  std::string dtype;                  ///< the parameter's own element type ("fp32", "fp16", "bf16")
  std::uint32_t group = 0;            ///< flat group index in EngineState::groups
  std::uint32_t optimizer_group = 0;
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

}  // namespace zerotk::engine
