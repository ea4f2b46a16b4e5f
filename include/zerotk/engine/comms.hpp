#pragma once
/// \file zerotk/engine/comms.hpp
/// EngineComms: the communicators an engine talks over, by role, and where its rank sits in the
/// process grid.
///
///   data()    ZeRO's gradient and parameter paths: partitions, reductions, gathers (the data
///             group of a grid; the whole communicator otherwise). With a hierarchical
///             `communication.topology` its reduce-scatters, all-gathers and all-reduces run
///             through the topology's levels (comm/hierarchical.hpp): selected here, once, so
///             that every stage's paths use it without knowing
///   hpz()     stage 3's hpZ groups: `zero_hpz_partition_size` consecutive ranks of the data group
///   expert_data()  expert parameters' paths (moe/): the grid's expert-data group, whose avg divides
///             by the data size (an expert's gradient already sums its expert group's tokens); the
///             data group itself when the grid has no expert layout apart from it
///   norm()    the boundary's global reductions: the gradient norm, the overflow agreement and the
///             loss, over every rank the parameters span (the grid's world; the data group when the
///             engine was given a plain communicator, which is then the world)
///
/// With a grid, every rank holds the parameters of its pipeline stage, and a parameter that is not
/// split across the tensor group (all of them until tensor-parallel layers declare splits) is held
/// whole by every tensor rank: its squares and the loss are counted on tensor rank 0 only, so the
/// norm and loss over a tensor 2 x data 2 grid are those of the data group alone, bit for bit.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/compress/quantized_collectives.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/engine/norm_share.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/zero/collectives.hpp"

namespace zerotk::engine {

template <class Ops>
class EngineComms {
 public:
  using Comm = device::OrderedCommunicator<Ops>;

  /// Built from where the engine's ranks sit (engine/placement.hpp: place_on(comm or grid)).
  EngineComms(Placement p, Ops& ops, const comm::TopologyOptions& topology = {})
      : data_(data_group(std::move(p.data), std::move(p.topology), p.device_memory, topology, ops)), place_(p.place) {
    if (p.world) world_.emplace(std::move(*p.world), ops);
    if (p.expert_data) {
      expert_.emplace(std::move(*p.expert_data), ops);
      expert_->mean_over(place_.data_size);
    }
  }

  Comm& data() noexcept { return data_; }
  /// The data group's topology (flat unless `communication.topology` asked for levels).
  const comm::Topology& topology() const noexcept { return topology_; }
  /// What the data group's hierarchical collectives sent per link level; null when flat.
  const comm::LinkStats* link_stats() const noexcept { return links_; }
  const Comm& data() const noexcept { return data_; }
  Comm* hpz() noexcept { return hpz_ ? &*hpz_ : nullptr; }
  const Comm* hpz() const noexcept { return hpz_ ? &*hpz_ : nullptr; }
  Comm& norm() noexcept { return world_ ? *world_ : data_; }
  Comm& expert_data() noexcept { return expert_ ? *expert_ : data_; }
  const Comm& expert_data() const noexcept { return expert_ ? *expert_ : data_; }
  /// Expert parameters reduce over a group of their own (GridPlace::experts_apart).
  bool experts_apart() const noexcept { return expert_.has_value(); }
  const GridPlace& place() const noexcept { return place_; }
  /// The model declares expert parameters (GridPlace::expert_params): the engine says so once its
  /// registry is built, before the checker reads the place.
  void set_expert_params(bool experts) noexcept { place_.expert_params = experts; }

  /// hpZ: splits the data group into groups of g consecutive ranks (collective over it). g must
  /// divide the data group's size.
  void make_hpz(int g) {
    const int w = data_.size();
    if (g <= 1) return;
    if (w % g != 0) {
      // On a plain communicator the data group is the world: name it as the config reader does.
      throw config_error(std::string(place_.data_only() ? "must divide the world size (" : "must divide the data-parallel size (") +
                             std::to_string(w) + "): hpZ keeps its secondary shard within groups of that many consecutive ranks",
                         "zero_optimization.zero_hpz_partition_size", std::to_string(g));
    }
    hpz_.emplace(data_.split(data_.rank() / g, data_.rank()));
  }

  /// ZeRO++ qwZ / qgZ (stage 3): the int8 gathers count into weight_gather()'s stats; the int4
  /// reduce-scatter gets one communicator per level of the data group's topology (collective over
  /// the data group). Host memory only (NCCL's buffers would need the CUDA kernels wired in): the
  /// checker's zeropp_host_only row refuses Device<Cuda> first (engine/checks.hpp).
  void make_quantized(bool weights, bool gradients) {
    if (!weights && !gradients) return;
    if (weights) qwz_.emplace();
    if (gradients) qgz_.emplace(data_, topology_.size() == data_.size() ? topology_ : comm::Topology::flat(data_.size()));
  }
  /// The paths' collective strategies (zero/collectives.hpp): qgZ's / qwZ's when made, else plain.
  zero::GradientReduceScatter<Comm> gradient_reduce_scatter() noexcept {
    return qgz_ ? zero::GradientReduceScatter<Comm>::quantized_by(*qgz_) : zero::GradientReduceScatter<Comm>{};
  }
  zero::WeightGather weight_gather() noexcept { return qwz_ ? zero::WeightGather::quantized_into(*qwz_) : zero::WeightGather{}; }
  const compress::QuantizedStats* quantized_grads_stats() const noexcept { return qgz_ ? &qgz_->stats() : nullptr; }
  const compress::QuantizedStats* quantized_weights_stats() const noexcept { return qwz_ ? &*qwz_ : nullptr; }

  /// Bytes this rank sent over all of its communicators (ring convention), since construction.
  std::uint64_t wire_bytes() const noexcept {
    return data_.stats().total_wire_bytes() + (hpz_ ? hpz_->stats().total_wire_bytes() : 0) +
           (world_ ? world_->stats().total_wire_bytes() : 0) + (expert_ ? expert_->stats().total_wire_bytes() : 0) +
           (qgz_ ? qgz_->stats().wire_bytes() : 0);
  }

  /// What this rank adds to the boundary's global sums (engine/norm_share.hpp).
  NormShare norm_share() const noexcept { return NormShare(place_); }
  /// The number of gradient elements the global norm adds up over every rank, agreed by all (one
  /// all-reduce over the world with a grid; none otherwise): `counted`, the elements this rank's
  /// model shard counts (NormShare) in the groups over the data group, `expert_counted` in the
  /// expert group; each added once per model shard.
  std::uint64_t agree_norm_count(std::uint64_t counted, std::uint64_t expert_counted = 0) {
    if (!world_ && !expert_) return counted + expert_counted;
    const NormShare share = norm_share();
    double n = static_cast<double>(share.count_addend(counted) + share.expert_count_addend(expert_counted));
    norm().all_reduce_host(&n, &n, 1, comm::ReduceOp::sum);
    return static_cast<std::uint64_t>(n);
  }

 private:
  /// The data group's communicator: `comm` itself, or a hierarchical one over it when the topology
  /// has more than one level with more than one member.
  Comm data_group(comm::AnyCommunicator comm, comm::Topology topology, bool device_memory,
                  const comm::TopologyOptions& options, Ops& ops) {
    topology_ = topology;
    if (!topology.hierarchical()) return Comm(std::move(comm), ops);
    if (device_memory) {
      throw config_error("hierarchical collectives need a host-memory communicator (threads, MPI); NCCL runs its "
                         "own rings and trees across nodes: use topology 1 with it",
                         std::string(comm::TopologyOptions::kKey), std::to_string(options.levels));
    }
    auto h = comm::HierarchicalCommunicator<comm::AnyCommunicator>::owning(std::move(comm), std::move(topology));
    links_ = &h.link_stats();  // in the shared state the AnyCommunicator keeps alive
    return Comm(comm::AnyCommunicator(std::move(h)), ops);
  }

  comm::Topology topology_;
  const comm::LinkStats* links_ = nullptr;
  Comm data_;
  std::optional<Comm> hpz_;    // stage 3 with hpZ
  std::optional<Comm> world_;  // a grid with more than its data group
  std::optional<Comm> expert_;  // a grid whose expert-data group is apart from its data group
  std::optional<compress::QuantizedStats> qwz_;                // qwZ: the int8 gathers' counters
  std::optional<compress::QuantizedReduceScatter<Comm>> qgz_;  // qgZ: its level communicators
  GridPlace place_;
};

}  // namespace zerotk::engine
