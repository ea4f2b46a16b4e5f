#pragma once
/// \file zerotk/comm/topology.hpp
/// Where a communicator's ranks sit: a hierarchy of 1 to 3 link levels, innermost first.
///
///   levels 1   flat: every link alike
///   levels 2   node -> world: ranks share a node (shared memory, NVLink), nodes share the network
///   levels 3   socket (or NUMA domain) -> node -> world
///
/// A topology is declared (`TopologyOptions`: ranks per node, or an explicit rank -> node map for
/// tests and odd placements) or detected through the back end: MPI with MPI_Comm_split_type (shared
/// memory for nodes; Open MPI's OMPI_COMM_TYPE_SOCKET / OMPI_COMM_TYPE_NUMA for the inner level),
/// NCCL by host name, the threads back end from ThreadsOptions::ranks_per_node (its simulated
/// nodes). The hierarchical collectives (comm/hierarchical.hpp) run over the result.
///
///   auto topo = zerotk::comm::detect_topology(world, {.levels = 2, .ranks_per_node = 4});
///   topo.fanout(0);   // 4 ranks per node
///   topo.fanout(1);   // nodes
///
/// Coordinates. Rank r has one coordinate per level: c_0 its index among the ranks of its innermost
/// group (ordered by rank), c_l (l >= 1) the index of its level-(l-1) group among those inside its
/// level-l group (ordered by their lowest rank); the top level's group is the world. Every group of
/// a level must have the same fanout (Horovod's and NCCL's hierarchical algorithms need it too): an
/// uneven placement is a config_error naming the key and each group's size.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/runtime.hpp"

namespace zerotk::comm {

/// The most link levels a topology has (socket -> node -> world).
inline constexpr int kMaxTopologyLevels = 3;

/// What the inner of three levels groups ranks by.
enum class InnerDomain : std::uint8_t { socket, numa };

constexpr std::string_view to_string(InnerDomain d) noexcept { return d == InnerDomain::socket ? "socket" : "numa"; }

/// The topology a user declares (config: `communication.topology`, docs/config.md). Unset counts
/// and empty maps are detected through the communicator.
struct TopologyOptions {
  /// 1: flat (no hierarchy); 2: node -> world; 3: socket (or NUMA domain) -> node -> world.
  int levels = 1;
  /// Consecutive ranks per node (rank r on node r / ranks_per_node); 0: detected.
  int ranks_per_node = 0;
  /// levels 3: consecutive ranks of a node per socket (by their index within the node); 0: detected.
  int ranks_per_socket = 0;
  /// levels 3 detected on MPI: Open MPI's socket or NUMA split type.
  InnerDomain inner = InnerDomain::socket;
  /// The node of every rank of the world (overrides ranks_per_node): any ints >= 0, equal for ranks
  /// of one node. For tests that simulate nodes, and placements that are not consecutive.
  std::vector<int> node_of_rank;
  /// levels 3: the socket of every rank, numbered within its node (overrides ranks_per_socket).
  std::vector<int> socket_of_rank;

  /// The config key of each field, for errors.
  static constexpr std::string_view kKey = "communication.topology";

  friend bool operator==(const TopologyOptions&, const TopologyOptions&) = default;

  /// The values that are wrong whatever the world (the rest is checked against the world where the
  /// topology is resolved).
  ZEROTK_RUNTIME_INLINE void check(std::vector<config_error>& out) const;
};

/// A resolved topology over the ranks of one communicator (every rank holds the same one).
class Topology {
 public:
  /// One rank, flat.
  Topology() : coord_(1, {0, 0, 0}) {}

  /// One level: every link alike.
  ZEROTK_RUNTIME_INLINE static Topology flat(int world);

  /// From every rank's group at each inner level: `groups[l][r]` is the id of rank r's level-l
  /// group (l = 0 innermost; one vector per inner level, so levels = groups.size() + 1). An inner
  /// level's ids are read within the enclosing group (socket 0 of node 0 and socket 0 of node 1
  /// differ). Throws config_error at `key` when the vectors differ in length or a level's groups
  /// differ in size.
  ZEROTK_RUNTIME_INLINE static Topology from_groups(const std::vector<std::vector<int>>& groups,
                                                    std::string_view key = TopologyOptions::kKey);

  /// Link levels, the top (world) one included: 1..3.
  int levels() const noexcept { return levels_; }
  /// Ranks.
  int size() const noexcept { return world_; }
  /// Members of each group at `level`: level 0 ranks per innermost group, the top level the number
  /// of its groups (nodes, with 2 levels). Their product is size().
  int fanout(int level) const noexcept { return fanout_[static_cast<std::size_t>(level)]; }
  /// Rank's coordinate at `level` (see the file comment).
  int coordinate(int rank, int level) const noexcept {
    return coord_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(level)];
  }
  /// The color of rank's group at `level` (the ranks that differ from it in that coordinate only):
  /// its other coordinates, mixed radix. Split a communicator with (color, coordinate(rank, level)).
  int level_color(int rank, int level) const noexcept {
    int color = 0;
    for (int j = 0; j < levels_; ++j) {
      if (j != level) color = color * fanout(j) + coordinate(rank, j);
    }
    return color;
  }
  /// Whether there is more than one level with more than one member (else the hierarchy is flat).
  bool hierarchical() const noexcept {
    int wide = 0;
    for (int l = 0; l < levels_; ++l) wide += fanout(l) > 1 ? 1 : 0;
    return wide > 1;
  }

  /// Rank's place in the packed order: coordinates read lexicographically with c_0 slowest. A
  /// hierarchical reduce-scatter reads its send blocks in this order (comm/hierarchical.hpp).
  std::size_t packed_index(int rank) const noexcept {
    std::size_t p = 0;
    for (int l = 0; l < levels_; ++l) p = p * static_cast<std::size_t>(fanout(l)) + static_cast<std::size_t>(coordinate(rank, l));
    return p;
  }

  /// The level of the link between ranks a and b: the lowest level whose group holds both
  /// (0: the same innermost group); -1 when a == b.
  int link_level(int a, int b) const noexcept {
    if (a == b) return -1;
    for (int l = levels_ - 1; l >= 0; --l) {
      if (coordinate(a, l) != coordinate(b, l)) return l;
    }
    return 0;
  }

  /// Name of the links at `level`: "intra-node" / "inter-node" (2 levels), "intra-socket" /
  /// "inter-socket" / "inter-node" (3), "world" (1).
  std::string_view link_name(int level) const noexcept {
    if (levels_ == 1) return "world";
    if (levels_ == 2) return level == 0 ? "intra-node" : "inter-node";
    return level == 0 ? "intra-socket" : level == 1 ? "inter-socket" : "inter-node";
  }

  /// "2 nodes x 4 ranks", "2 nodes x 2 sockets x 2 ranks", "8 ranks (flat)".
  ZEROTK_RUNTIME_INLINE std::string describe() const;

  friend bool operator==(const Topology&, const Topology&) = default;

 private:
  /// Level l's groups differ in size (never the top level: it has one group).
  ZEROTK_RUNTIME_INLINE static config_error uneven(std::string_view key, int level, int levels,
                                                   const std::map<int, std::vector<int>>& members);

  int world_ = 1;
  int levels_ = 1;
  std::array<int, kMaxTopologyLevels> fanout_{1, 1, 1};
  std::vector<std::array<int, kMaxTopologyLevels>> coord_;  // [rank][level]
};

// ---- resolution over a communicator --------------------------------------------------------------

/// A communicator that can split itself by node (MPI_COMM_TYPE_SHARED, NCCL's host names, or the
/// threads back end's simulated nodes).
template <class C>
concept NodeAwareCommunicator = Communicator<C> && requires(C& c) {
  { c.split_node_local() } -> std::same_as<C>;
};

/// A communicator that tells every rank's node at once (NCCL: by host name; its buffers are device
/// memory, so the host-memory gathers below are not available to it).
template <class C>
concept NodeMapCommunicator = Communicator<C> && requires(C& c) {
  { c.node_of_ranks() } -> std::same_as<std::vector<int>>;
};

/// A communicator that can split itself by socket or NUMA domain (Open MPI's split types).
template <class C>
concept DomainAwareCommunicator = Communicator<C> && requires(C& c, InnerDomain d) {
  { c.split_domain_local(d) } -> std::same_as<C>;
};

namespace detail {

/// Every rank's value of `mine` (an all-gather of one int32).
template <Communicator C>
std::vector<int> gather_ints(C& comm, int mine) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(comm.size()));
  const std::int32_t v = mine;
  comm.all_gather(&v, all.data(), 1, DType::int32).wait();
  return {all.begin(), all.end()};
}

/// The lowest rank (of `comm`) in this rank's part of `part`, a communicator split from `comm`.
template <Communicator C>
int part_id(C& comm, C& part) {
  std::int32_t id = comm.rank();
  part.broadcast(&id, 1, DType::int32, 0).wait();
  return id;
}

ZEROTK_RUNTIME_INLINE void check_map(const std::vector<int>& map, int world, std::string_view name);

ZEROTK_RUNTIME_INLINE void check_divides(int per, int of, std::string_view name, std::string_view what);

/// Every rank's node id from the options alone (the map, or consecutive blocks); empty when the
/// node level must be detected.
ZEROTK_RUNTIME_INLINE std::vector<int> declared_nodes(const TopologyOptions& o, int w);

/// Every rank's socket id within its node from the options alone; empty when it must be detected.
ZEROTK_RUNTIME_INLINE std::vector<int> declared_sockets(const TopologyOptions& o, const std::vector<int>& nodes);

/// Every rank's node id over `comm`: declared, or the back end's node split.
template <Communicator C>
std::vector<int> node_ids(C& comm, const TopologyOptions& o) {
  if (std::vector<int> ids = declared_nodes(o, comm.size()); !ids.empty()) return ids;
  if constexpr (NodeMapCommunicator<C>) {
    return comm.node_of_ranks();
  } else if constexpr (NodeAwareCommunicator<C>) {
    C local = comm.split_node_local();
    return gather_ints(comm, part_id(comm, local));
  } else {
    throw config_error("this communicator cannot detect nodes; give ranks_per_node or node_of_rank",
                       std::string(TopologyOptions::kKey), std::to_string(o.levels));
  }
}

/// Every rank's socket id within its node: declared, or the back end's socket / NUMA split.
template <Communicator C>
std::vector<int> socket_ids(C& comm, const TopologyOptions& o, const std::vector<int>& nodes) {
  if (std::vector<int> ids = declared_sockets(o, nodes); !ids.empty()) return ids;
  if constexpr (DomainAwareCommunicator<C>) {
    C domain = comm.split_domain_local(o.inner);
    return gather_ints(comm, part_id(comm, domain));  // ids unique in the world, so unique in the node
  } else {
    throw config_error(std::string("this communicator cannot detect ") + std::string(to_string(o.inner)) +
                           "s (Open MPI and the threads back end can); give ranks_per_socket or socket_of_rank",
                       std::string(TopologyOptions::kKey), std::to_string(o.levels));
  }
}

/// The checks of the options alone and against the world size.
ZEROTK_RUNTIME_INLINE void check_options(const TopologyOptions& o, int world);

/// Every rank's group id at each inner level (innermost first: socket, then node), from `o`.
/// Collective over `comm`, whose ranks the maps index. Empty for a flat topology.
template <Communicator C>
std::vector<std::vector<int>> inner_ids(C& comm, const TopologyOptions& o) {
  check_options(o, comm.size());
  if (o.levels == 1) return {};
  std::vector<int> nodes = node_ids(comm, o);
  if (o.levels == 2) return {std::move(nodes)};
  std::vector<int> sockets = socket_ids(comm, o, nodes);
  return {std::move(sockets), std::move(nodes)};
}

}  // namespace detail

/// The topology of `comm`'s ranks from `o`: the explicit maps, the ranks-per counts, or detection
/// through the back end (a node-map communicator such as NCCL names its nodes by host; a socket
/// level must be declared there). Collective over `comm`; config_error naming the key when the
/// options or the placement do not fit.
template <Communicator C>
Topology detect_topology(C& comm, const TopologyOptions& o) {
  const std::vector<std::vector<int>> ids = detail::inner_ids(comm, o);
  return ids.empty() ? Topology::flat(comm.size()) : Topology::from_groups(ids);
}

/// The topology `o` declares for `world` ranks, without a communicator (what zerotk-config checks),
/// or nullopt when a level is left to detection. Throws config_error as detect_topology() does.
ZEROTK_RUNTIME_INLINE std::optional<Topology> declared_topology(const TopologyOptions& o, int world);

/// This rank's group ids at each inner level (innermost first), for gather_topology() over a
/// communicator split from `comm` (a grid's data group, with the maps indexing the world).
template <Communicator C>
std::vector<int> locate(C& comm, const TopologyOptions& o) {
  std::vector<int> mine;
  for (const auto& level : detail::inner_ids(comm, o)) mine.push_back(level[static_cast<std::size_t>(comm.rank())]);
  return mine;
}

/// The topology of `comm`'s ranks from each rank's `mine` (what locate() gave it on the larger
/// communicator). Collective over `comm` (host memory).
template <Communicator C>
Topology gather_topology(C& comm, std::span<const int> mine) {
  if (mine.empty()) return Topology::flat(comm.size());
  std::vector<std::vector<int>> groups;
  for (int id : mine) groups.push_back(detail::gather_ints(comm, id));
  return Topology::from_groups(groups);
}

}  // namespace zerotk::comm

#if !ZEROTK_COMPILED_RUNTIME
#include "zerotk/comm/topology_impl.hpp"
#endif
