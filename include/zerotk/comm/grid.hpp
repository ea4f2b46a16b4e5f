#pragma once
/// \file zerotk/comm/grid.hpp
/// The process grid (data x pipeline x tensor parallel groups from one world communicator) and
/// node-local groups for hierarchical all-reduce, generic over any Communicator.
///
/// Rank order is Megatron-LM's: tensor-parallel ranks are adjacent (they exchange the most and
/// should share a node), then data, then pipeline:
///   world_rank = (pipeline_index * data_size + data_index) * tensor_size + tensor_index
///
///   zerotk::comm::ProcessGrid grid(world, {.pipeline = 2, .tensor = 2});   // data = W / 4
///   grid.data().reduce_scatter(...);                                      // ZeRO over the data group
///
/// Hierarchical all-reduce (reduce inside each node, all-reduce across node leaders, broadcast inside
/// each node) moves less data across nodes. It gives the flat all-reduce's result when sums are
/// exact; otherwise floating-point sums differ by rounding (the grouping differs). NCCL already
/// reduces hierarchically inside; NodeGroups serves host-memory communicators.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// A communicator that can split itself by node (MPI_COMM_TYPE_SHARED, or the threads back end's
/// simulated nodes).
template <class C>
concept NodeAwareCommunicator = Communicator<C> && requires(C& c) {
  { c.split_node_local() } -> std::same_as<C>;
};

/// Node-local groups of a communicator: `local()` holds the ranks of this rank's node (local rank 0
/// is the node's leader), `leaders()` the leaders of all nodes (meaningful on leaders only).
template <Communicator C>
class NodeGroups {
 public:
  /// Collective over `comm`: nodes as the communicator knows them.
  explicit NodeGroups(C& comm)
    requires NodeAwareCommunicator<C>
      : local_(comm.split_node_local()), leaders_(split_leaders(comm, local_)) {
    summarize(comm);
  }

  /// Collective over `comm`: ranks passing the same `node_color` (>= 0) form a node, ordered by
  /// rank. For tests that simulate several nodes on one machine, or for custom topologies.
  NodeGroups(C& comm, int node_color)
      : local_(comm.split(node_color, comm.rank())), leaders_(split_leaders(comm, local_)) {
    summarize(comm);
  }

  C& local() noexcept { return local_; }
  /// The communicator of the node leaders; only used on leaders (on other ranks it groups the
  /// non-leaders and must not be used).
  C& leaders() noexcept { return leaders_; }
  bool is_leader() const noexcept { return local_.rank() == 0; }
  int node_count() const noexcept { return node_count_; }
  /// Ranks of the communicator the groups were made from.
  int world_size() const noexcept { return world_size_; }

 private:
  static C split_leaders(C& comm, C& local) { return comm.split(local.rank() == 0 ? 0 : 1, comm.rank()); }

  void summarize(C& comm) {
    static_assert(!uses_device_memory<C>, "NodeGroups needs a host-memory communicator (NCCL is hierarchical inside)");
    node_count_ = all_reduce_value(comm, static_cast<std::int32_t>(is_leader() ? 1 : 0), ReduceOp::sum);
    world_size_ = comm.size();
  }

  C local_, leaders_;
  int node_count_ = 1;
  int world_size_ = 1;
};

/// All-reduce through the node hierarchy: reduce to the node leader, all-reduce across leaders,
/// broadcast inside the node. Returns the Work of the final broadcast (the first two stages are
/// complete on return). avg sums through both stages and the leader divides by the world size
/// once, so nodes may differ in size. Byte counters land on the local and leader communicators.
template <Communicator C>
Work hierarchical_all_reduce(NodeGroups<C>& g, const void* send, void* recv, std::size_t count, DType dt,
                             ReduceOp op) {
  detail::check_reduce(OpKind::all_reduce, dt, op, g.local().rank(), g.local().size());
  const ReduceOp stage_op = op == ReduceOp::avg ? ReduceOp::sum : op;
  g.local().reduce(send, recv, count, dt, stage_op, 0).wait();
  if (g.is_leader()) {
    g.leaders().all_reduce(recv, recv, count, dt, stage_op).wait();
    if (op == ReduceOp::avg) detail::divide_in_place(recv, count, dt, g.world_size());
  }
  return g.local().broadcast(recv, count, dt, 0);
}

/// Sizes of the grid's dimensions. `data` = 0 means world size / (pipeline * tensor).
struct GridShape {
  int data = 0;
  int pipeline = 1;
  int tensor = 1;
};

/// Data, pipeline and tensor parallel groups of one world (Megatron rank order, see the file
/// comment). Construction is collective over `world` (which must outlive the grid).
template <Communicator C>
class ProcessGrid {
 public:
  ProcessGrid(C& world, GridShape shape)
      : world_(&world),
        shape_(resolve(world.size(), shape)),
        tensor_index_(world.rank() % shape_.tensor),
        data_index_(world.rank() / shape_.tensor % shape_.data),
        pipeline_index_(world.rank() / (shape_.tensor * shape_.data)),
        tensor_(world.split(pipeline_index_ * shape_.data + data_index_, tensor_index_)),
        data_(world.split(pipeline_index_ * shape_.tensor + tensor_index_, data_index_)),
        pipeline_(world.split(data_index_ * shape_.tensor + tensor_index_, pipeline_index_)),
        model_(world.split(data_index_, pipeline_index_ * shape_.tensor + tensor_index_)) {}

  /// The world rank at grid coordinates (Megatron order).
  static constexpr int world_rank_of(const GridShape& s, int data_index, int pipeline_index, int tensor_index) noexcept {
    return (pipeline_index * s.data + data_index) * s.tensor + tensor_index;
  }

  const GridShape& shape() const noexcept { return shape_; }
  int data_index() const noexcept { return data_index_; }
  int pipeline_index() const noexcept { return pipeline_index_; }
  int tensor_index() const noexcept { return tensor_index_; }

  C& world() noexcept { return *world_; }
  /// Ranks holding the same model shard: ZeRO partitions and gradients reduce here.
  C& data() noexcept { return data_; }
  /// Ranks of one pipeline (same data and tensor index), ordered by stage.
  C& pipeline() noexcept { return pipeline_; }
  /// Ranks splitting each layer's tensors (same data and pipeline index).
  C& tensor() noexcept { return tensor_; }
  /// All ranks of one model replica (pipeline x tensor): global norms of a sharded model.
  C& model() noexcept { return model_; }

 private:
  static GridShape resolve(int world, GridShape s) {
    if (s.pipeline < 1 || s.tensor < 1 || s.data < 0) {
      throw config_error("grid sizes must be >= 1 (data 0: inferred)", "GridShape",
                         std::to_string(s.data) + " x " + std::to_string(s.pipeline) + " x " + std::to_string(s.tensor));
    }
    if (s.data == 0 && world % (s.pipeline * s.tensor) == 0) s.data = world / (s.pipeline * s.tensor);
    if (s.data * s.pipeline * s.tensor != world) {
      throw config_error("data x pipeline x tensor must equal the world size " + std::to_string(world), "GridShape",
                         std::to_string(s.data) + " x " + std::to_string(s.pipeline) + " x " + std::to_string(s.tensor));
    }
    return s;
  }

  C* world_;
  GridShape shape_;
  int tensor_index_, data_index_, pipeline_index_;
  C tensor_, data_, pipeline_, model_;
};

}  // namespace zerotk::comm
