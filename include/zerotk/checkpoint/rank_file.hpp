#pragma once
/// \file zerotk/checkpoint/rank_file.hpp
/// One rank's data file <-> that rank's part of an EngineState. Per flat group g (the working-
/// precision group, then the fp32-kept group), four sections over the rank's owned elements:
///   group<g>.step         int64[1]        the optimizer's step count
///   group<g>.master       fp32[owned]     the fp32 master partition (padding included, as owned)
///   group<g>.exp_avg      fp32[owned]     Adam's m
///   group<g>.exp_avg_sq   fp32[owned]     Adam's v
/// Counters, scaler and scheduler are the same on every rank and live in the manifest.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/signature.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/state.hpp"

namespace zerotk::checkpoint {

inline constexpr std::size_t kSectionsPerGroup = 4;

inline std::string section_name(std::size_t group, std::string_view what) {
  return "group" + std::to_string(group) + "." + std::string(what);
}

inline std::vector<std::byte> encode_rank_file(const EngineState& s, int rank, int world_size) {
  DataFileWriter w(rank, world_size);
  const std::vector<std::string>& states = optimizer_state_names();
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const EngineGroupState& gs = s.groups[g];
    w.add(section_name(g, "step"), std::span<const std::int64_t>(&gs.optimizer.step, 1));
    w.add(section_name(g, "master"), std::span<const float>(gs.master));
    w.add(section_name(g, states[0]), std::span<const float>(gs.optimizer.m));
    w.add(section_name(g, states[1]), std::span<const float>(gs.optimizer.v));
  }
  return std::move(w).finish();
}

/// The groups of rank `rank` from its file's bytes (already checked against the manifest's size and
/// checksum), shaped as the manifest says; io_error naming the file on any inconsistency.
inline std::vector<EngineGroupState> decode_rank_file(std::span<const std::byte> bytes, const std::string& path,
                                                      const Manifest& m, int rank) {
  const DataFileView f = parse_data_file(bytes, path);
  if (f.rank != static_cast<std::uint32_t>(rank) || f.world_size != static_cast<std::uint32_t>(m.world_size)) {
    throw io_error("the file was written by another rank or world size", path,
                   "rank " + std::to_string(f.rank) + " of " + std::to_string(f.world_size) + ", expected rank " +
                       std::to_string(rank) + " of " + std::to_string(m.world_size));
  }
  const std::size_t group_count = m.shards.owned_numel.size();
  if (f.sections.size() != kSectionsPerGroup * group_count) {
    throw io_error("unexpected number of sections", path,
                   std::to_string(f.sections.size()) + ", expected " + std::to_string(kSectionsPerGroup * group_count));
  }
  const std::vector<std::string>& states = optimizer_state_names();
  std::vector<EngineGroupState> groups(group_count);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::uint64_t n = m.shards.owned_numel[g][static_cast<std::size_t>(rank)];
    EngineGroupState& gs = groups[g];
    gs.optimizer.step = f.read<std::int64_t>(section_name(g, "step"), ElementType::int64, 1)[0];
    if (gs.optimizer.step != m.optimizer_steps[g]) {
      throw io_error("optimizer step count differs from the manifest's", path,
                     std::to_string(gs.optimizer.step) + ", manifest says " + std::to_string(m.optimizer_steps[g]));
    }
    gs.master = f.read<float>(section_name(g, "master"), ElementType::fp32, n);
    gs.optimizer.m = f.read<float>(section_name(g, states[0]), ElementType::fp32, n);
    gs.optimizer.v = f.read<float>(section_name(g, states[1]), ElementType::fp32, n);
  }
  return groups;
}

}  // namespace zerotk::checkpoint
