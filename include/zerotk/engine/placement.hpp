#pragma once
/// \file zerotk/engine/placement.hpp
/// Where an engine's ranks sit, with the communicator's type forgotten: the data group's
/// communicator (and the grid's world when it has more than its data group) behind
/// comm::AnyCommunicator, the rank's place in the grid and the data group's topology. An engine is
/// built from a Placement (engine/comms.hpp), so its code does not depend on the communicator's
/// type; place_on() is the one template a trainer instantiates for its communicator (topology
/// detection asks the back end what it can tell, so it runs here, on the typed communicator).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/model_view.hpp"

namespace zerotk::engine {

/// A rank's place in the grid. A plain communicator is a grid of one data group.
struct GridPlace {
  int data_size = 1, tensor_size = 1, pipeline_size = 1;
  int data_index = 0, tensor_index = 0, pipeline_index = 0;
  /// The expert layout (comm::GridShape::expert): expert and expert-tensor sizes, the expert-data
  /// group's size and this rank's index in it and in the expert group. Without one, the
  /// expert-data group is the data group.
  int expert_size = 1, expert_tensor_size = 1, expert_data_size = 1;
  int expert_index = 0, expert_data_index = 0;
  /// The model declares expert parameters (ParamRegistry::has_experts): set by the engine before
  /// the checker's rows that read the place run.
  bool expert_params = false;

  /// Deprecated (0.2.0): engine::NormShare (engine/norm_share.hpp) says what a rank adds to the
  /// global sums (NormShare(place).whole() is this).
  [[deprecated("use engine::NormShare(place).whole() (engine/norm_share.hpp)")]] bool counts_replicated() const noexcept {
    return tensor_index == 0;
  }
  /// Only a data group: the boundary's reductions need no other communicator.
  bool data_only() const noexcept { return tensor_size == 1 && pipeline_size == 1; }
  /// The expert-data group differs from the data group (experts parallel, or split otherwise than
  /// the tensor group splits the dense layers): expert parameters reduce over a communicator of their own.
  bool experts_apart() const noexcept { return expert_size > 1 || expert_tensor_size != tensor_size; }
};

struct Placement {
  comm::AnyCommunicator data;                   ///< refers to the data group's communicator
  std::optional<comm::AnyCommunicator> world;   ///< the grid's world, when it has more than its data group
  GridPlace place;
  comm::Topology topology;                      ///< the data group's (flat unless `communication.topology` has levels)
  bool device_memory = false;                   ///< the communicators move device buffers (NCCL)
  std::optional<comm::AnyCommunicator> expert_data;  ///< the grid's expert-data group, when apart from the data group
};

/// A plain communicator: the data group is the whole of it, placed by `topology` (collective when
/// it has levels).
template <comm::Communicator C>
Placement place_on(C& comm, const comm::TopologyOptions& topology = {}) {
  Placement p{comm::AnyCommunicator(comm), std::nullopt, {}, {}, comm::uses_device_memory<C>, std::nullopt};
  p.topology = topology.levels > 1 ? comm::detect_topology(comm, topology) : comm::Topology();
  p.place.data_size = p.place.expert_data_size = comm.size();
  p.place.data_index = p.place.expert_data_index = comm.rank();
  return p;
}

/// A process grid (collective over its world): ZeRO over the data group, the boundary's reductions
/// over the world. The topology's maps index the world; the data group's placement is gathered
/// from it.
template <comm::Communicator C>
Placement place_on(comm::ProcessGrid<C>& grid, const comm::TopologyOptions& topology = {}) {
  Placement p{comm::AnyCommunicator(grid.data()), std::nullopt, {}, {}, comm::uses_device_memory<C>, std::nullopt};
  if (topology.levels <= 1) {
    p.topology = comm::Topology::flat(grid.data().size());
  } else if constexpr (comm::uses_device_memory<C>) {
    p.topology = comm::detect_topology(grid.data(), topology);  // refused by EngineComms, with the reason
  } else {
    const std::vector<int> mine = comm::locate(grid.world(), topology);
    p.topology = comm::gather_topology(grid.data(), mine);
  }
  p.place.data_size = grid.size(comm::GridDim::data);
  p.place.tensor_size = grid.size(comm::GridDim::tensor);
  p.place.pipeline_size = grid.size(comm::GridDim::pipeline);
  p.place.data_index = grid.data_index();
  p.place.tensor_index = grid.tensor_index();
  p.place.pipeline_index = grid.pipeline_index();
  p.place.expert_size = grid.expert_size();
  p.place.expert_tensor_size = grid.expert_tensor_size();
  p.place.expert_data_size = grid.expert_data_size();
  p.place.expert_index = grid.expert_index();
  p.place.expert_data_index = grid.expert_data_index();
  if (!p.place.data_only()) p.world.emplace(grid.world());
  if (p.place.experts_apart()) p.expert_data.emplace(grid.expert_data());
  return p;
}

/// What an Engine is built from, with the user's types forgotten: the model's view, and the
/// communicator (or grid) behind two functions made where its type is known: `place` (collective:
/// the topology is detected on the typed communicator, after the engine has checked its options)
/// and `make_ops` (the device's Ops, which Device<Cuda> makes from the communicator's stream).
template <class Ops>
struct EngineInputs {
  void* comm = nullptr;  ///< the user's communicator, or ProcessGrid
  Placement (*place)(void* comm, const comm::TopologyOptions& topology) = nullptr;
  Ops (*make_ops)(void* comm, void* stream) = nullptr;
  ModelView model;

  template <comm::Communicator C, Module M>
  static EngineInputs of(C& comm, M& model) {
    return {&comm, [](void* c, const comm::TopologyOptions& t) { return place_on(*static_cast<C*>(c), t); },
            [](void* c, void* stream) { return Ops::create(*static_cast<C*>(c), stream); }, view_model(model)};
  }
  template <comm::Communicator C, Module M>
  static EngineInputs of(comm::ProcessGrid<C>& grid, M& model) {
    return {&grid, [](void* g, const comm::TopologyOptions& t) { return place_on(*static_cast<comm::ProcessGrid<C>*>(g), t); },
            [](void* g, void* stream) { return Ops::create(static_cast<comm::ProcessGrid<C>*>(g)->data(), stream); },
            view_model(model)};
  }
};

}  // namespace zerotk::engine
