#pragma once
/// \file zerotk/engine/communication.hpp
/// CommunicationOptions (EngineOptions::communication; config: the `communication` block, zerotk's
/// own keys, docs/config.md): where the data group's ranks sit, which selects hierarchical
/// collectives for ZeRO's reductions and gathers at every stage (engine/comms.hpp), and the
/// slow-rank detector (monitor/slow_ranks.hpp, engine/slow_rank_monitor.hpp).

#include <vector>

#include "zerotk/comm/topology.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/monitor/slow_ranks.hpp"

namespace zerotk {

struct CommunicationOptions {
  /// `communication.topology`: levels 1 (flat, the default), 2 (node -> world), 3 (socket -> node
  /// -> world), declared or detected (comm/topology.hpp).
  comm::TopologyOptions topology;
  /// `communication.slow_node_*`: the slow-rank detector and what it does (monitor/slow_ranks.hpp).
  SlowRankOptions slow_ranks;

  void check(std::vector<config_error>& out) const {
    topology.check(out);
    slow_ranks.check(out);
  }
};

}  // namespace zerotk
