#pragma once
// zerotk/comm/detail/rank_names.hpp (internal)
// How the back ends' error messages name ranks: by rank in the group the call was on and, on a group
// that is not the world itself, with the world rank beside it ("rank 1 (world 3)"), so a message
// from a tensor, data or pipeline group names the process to look at.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace zerotk::comm::detail {

// Whether a group of these world ranks (group rank -> world rank) is the whole world of this size.
inline bool is_whole_world(const std::vector<int>& world_of, int world_size) {
  if (static_cast<int>(world_of.size()) != world_size) return false;
  for (std::size_t r = 0; r < world_of.size(); ++r) {
    if (world_of[r] != static_cast<int>(r)) return false;
  }
  return true;
}

// "rank 1", "ranks 0, 2" on the world; "rank 1 (world 3)", "ranks 0 (world 2), 1 (world 3)" elsewhere.
inline std::string rank_list(const std::vector<int>& ranks, const std::vector<int>& world_of, int world_size) {
  const bool whole = is_whole_world(world_of, world_size);
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
    const auto r = static_cast<std::size_t>(ranks[i]);
    if (!whole && ranks[i] >= 0 && r < world_of.size()) {
      s += " (world ";
      s += std::to_string(world_of[r]);
      s += ")";
    }
  }
  return s;
}

// The name of a group split off `parent`: "<parent>/<label>", or "<parent>/split(color N)" without
// a label (the threads and MPI back ends' split()).
inline std::string split_group_name(const std::string& parent, int color, std::string label) {
  return parent + "/" + (label.empty() ? "split(color " + std::to_string(color) + ")" : std::move(label));
}

}  // namespace zerotk::comm::detail
