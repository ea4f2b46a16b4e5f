#pragma once
// zerotk/comm/topology_impl.hpp
// Topology's construction and the checks of TopologyOptions (topology.hpp declares them): included
// by topology.hpp in header-only mode, compiled once in zerotk::runtime with
// ZEROTK_COMPILED_RUNTIME=1 (zerotk/core/runtime.hpp).

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/comm/topology.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

ZEROTK_RUNTIME_INLINE void TopologyOptions::check(std::vector<config_error>& out) const {
  const std::string key(kKey);
  if (levels < 1 || levels > kMaxTopologyLevels) {
    out.emplace_back("must be 1 (flat), 2 (node -> world) or 3 (socket -> node -> world)", key,
                     std::to_string(levels));
  }
  if (ranks_per_node < 0) out.emplace_back("must be >= 0 (0: detected)", key + ".ranks_per_node", std::to_string(ranks_per_node));
  if (ranks_per_socket < 0) {
    out.emplace_back("must be >= 0 (0: detected)", key + ".ranks_per_socket", std::to_string(ranks_per_socket));
  }
  if ((ranks_per_socket > 0 || !socket_of_rank.empty()) && levels != 3) {
    out.emplace_back("a socket level needs levels 3", key + ".levels", std::to_string(levels));
  }
  auto ids = [&](const std::vector<int>& v, std::string_view name) {
    for (std::size_t r = 0; r < v.size(); ++r) {
      if (v[r] < 0) {
        out.emplace_back("ids must be >= 0", key + "." + std::string(name) + "[" + std::to_string(r) + "]",
                         std::to_string(v[r]));
        return;
      }
    }
  };
  ids(node_of_rank, "node_of_rank");
  ids(socket_of_rank, "socket_of_rank");
}

ZEROTK_RUNTIME_INLINE Topology Topology::flat(int world) {
  Topology t;
  t.world_ = world;
  t.levels_ = 1;
  t.fanout_ = {world, 1, 1};
  t.coord_.assign(static_cast<std::size_t>(world), {0, 0, 0});
  for (int r = 0; r < world; ++r) t.coord_[static_cast<std::size_t>(r)][0] = r;
  return t;
}

ZEROTK_RUNTIME_INLINE Topology Topology::from_groups(const std::vector<std::vector<int>>& groups, std::string_view key) {
  const int inner = static_cast<int>(groups.size());
  if (inner == 0) throw usage_error("from_groups needs at least one inner level (use flat())", "zerotk::comm::Topology");
  if (inner + 1 > kMaxTopologyLevels) {
    throw config_error("at most 2 inner levels (socket, node)", std::string(key), std::to_string(inner + 1) + " levels");
  }
  const std::size_t w = groups[0].size();
  for (const auto& g : groups) {
    if (g.size() != w) {
      throw config_error("every level must place every rank", std::string(key),
                         std::to_string(g.size()) + " vs " + std::to_string(w) + " ranks");
    }
  }
  Topology t;
  t.world_ = static_cast<int>(w);
  t.levels_ = inner + 1;
  t.coord_.assign(w, {0, 0, 0});
  t.fanout_ = {1, 1, 1};
  // The identity of rank r's level-l group: its ids from the outermost inner level down to l.
  auto path = [&](std::size_t r, int l) {
    std::vector<int> p;
    for (int j = inner - 1; j >= l; --j) p.push_back(groups[static_cast<std::size_t>(j)][r]);
    return p;
  };
  // index[l][r]: rank r's level-l group as an index 0.. in order of each group's lowest rank.
  std::vector<std::vector<int>> index(static_cast<std::size_t>(inner), std::vector<int>(w));
  for (int l = 0; l < inner; ++l) {
    std::map<std::vector<int>, int> seen;
    for (std::size_t r = 0; r < w; ++r) {
      auto [it, fresh] = seen.try_emplace(path(r, l), static_cast<int>(seen.size()));
      index[static_cast<std::size_t>(l)][r] = it->second;
    }
  }
  // c_l = position of (level l-1 group, or the rank at l = 0) among the members of its level-l
  // group; the top level's group is the world.
  for (int l = 0; l <= inner; ++l) {
    std::map<int, std::vector<int>> members;  // level-l group -> its distinct members, in order
    for (std::size_t r = 0; r < w; ++r) {
      const int group = l == inner ? 0 : index[static_cast<std::size_t>(l)][r];
      const int member = l == 0 ? static_cast<int>(r) : index[static_cast<std::size_t>(l - 1)][r];
      auto& m = members[group];
      auto at = std::find(m.begin(), m.end(), member);
      if (at == m.end()) at = m.insert(m.end(), member);
      t.coord_[r][static_cast<std::size_t>(l)] = static_cast<int>(at - m.begin());
    }
    const std::size_t first = members.begin()->second.size();
    for (const auto& [g, m] : members) {
      if (m.size() != first) throw uneven(key, l, t.levels_, members);
    }
    t.fanout_[static_cast<std::size_t>(l)] = static_cast<int>(first);
  }
  return t;
}

ZEROTK_RUNTIME_INLINE std::string Topology::describe() const {
  if (levels_ == 1) return std::to_string(world_) + " ranks (flat)";
  std::string s = std::to_string(fanout(levels_ - 1)) + " nodes";
  if (levels_ == 3) s += " x " + std::to_string(fanout(1)) + " sockets";
  return s + " x " + std::to_string(fanout(0)) + " ranks";
}

ZEROTK_RUNTIME_INLINE config_error Topology::uneven(std::string_view key, int level, int levels,
                                                    const std::map<int, std::vector<int>>& members) {
  auto group_name = [&](int l) { return std::string(levels == 3 && l == 0 ? "socket" : "node"); };
  std::string got;
  int shown = 0;
  for (const auto& [g, m] : members) {
    if (shown++ == 8) {
      got += ", ...";
      break;
    }
    if (!got.empty()) got += ", ";
    got += group_name(level) + " " + std::to_string(g) + ": " + std::to_string(m.size());
  }
  const std::string what = level == 0 ? "ranks" : group_name(level - 1) + "s";
  return config_error("hierarchical collectives need the same number of " + what + " in every " + group_name(level),
                      std::string(key), got);
}

namespace detail {

ZEROTK_RUNTIME_INLINE void check_map(const std::vector<int>& map, int world, std::string_view name) {
  if (!map.empty() && static_cast<int>(map.size()) != world) {
    throw config_error("must give one entry for each of the " + std::to_string(world) + " ranks",
                       std::string(TopologyOptions::kKey) + "." + std::string(name), std::to_string(map.size()) + " entries");
  }
}

ZEROTK_RUNTIME_INLINE void check_divides(int per, int of, std::string_view name, std::string_view what) {
  if (per > 0 && of % per != 0) {
    throw config_error("must divide the " + std::string(what) + " (" + std::to_string(of) + ")",
                       std::string(TopologyOptions::kKey) + "." + std::string(name), std::to_string(per));
  }
}

ZEROTK_RUNTIME_INLINE std::vector<int> declared_nodes(const TopologyOptions& o, int w) {
  if (!o.node_of_rank.empty()) return o.node_of_rank;
  if (o.ranks_per_node <= 0) return {};
  check_divides(o.ranks_per_node, w, "ranks_per_node", "world size");
  std::vector<int> ids(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r) ids[static_cast<std::size_t>(r)] = r / o.ranks_per_node;
  return ids;
}

ZEROTK_RUNTIME_INLINE std::vector<int> declared_sockets(const TopologyOptions& o, const std::vector<int>& nodes) {
  if (!o.socket_of_rank.empty()) return o.socket_of_rank;
  if (o.ranks_per_socket <= 0) return {};
  std::vector<int> ids(nodes.size());
  std::map<int, int> in_node;  // node -> ranks seen so far
  for (std::size_t r = 0; r < nodes.size(); ++r) ids[r] = in_node[nodes[r]]++ / o.ranks_per_socket;
  for (const auto& [node, n] : in_node) check_divides(o.ranks_per_socket, n, "ranks_per_socket", "ranks of each node");
  return ids;
}

ZEROTK_RUNTIME_INLINE void check_options(const TopologyOptions& o, int world) {
  std::vector<config_error> problems;
  o.check(problems);
  if (!problems.empty()) throw problems.front();
  if (o.levels == 1) return;
  check_map(o.node_of_rank, world, "node_of_rank");
  check_map(o.socket_of_rank, world, "socket_of_rank");
}

}  // namespace detail

ZEROTK_RUNTIME_INLINE std::optional<Topology> declared_topology(const TopologyOptions& o, int world) {
  detail::check_options(o, world);
  if (o.levels == 1) return Topology::flat(world);
  std::vector<int> nodes = detail::declared_nodes(o, world);
  if (nodes.empty()) return std::nullopt;
  if (o.levels == 2) return Topology::from_groups({std::move(nodes)});
  std::vector<int> sockets = detail::declared_sockets(o, nodes);
  if (sockets.empty()) return std::nullopt;
  return Topology::from_groups({std::move(sockets), std::move(nodes)});
}

}  // namespace zerotk::comm
