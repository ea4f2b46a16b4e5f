#pragma once
/// \file zerotk/comm/grid.hpp
/// The process grid (tensor, data and pipeline groups from one world communicator, the context and
/// expert layouts folded over them) and node-local groups for hierarchical all-reduce, generic over
/// any Communicator.
///
/// Rank order is Megatron-LM's by default ("tp-dp-pp"): tensor-parallel ranks are adjacent (they
/// exchange the most and should share a node), then data, then pipeline:
///   world_rank = (pipeline_index * data_size + data_index) * tensor_size + tensor_index
/// GridShape::order picks another. Context parallelism (GridShape::context) splits the data
/// dimension, context fastest: data_index = replica_index * context_size + context_index, which in
/// the default order is Megatron's "tp-cp-dp-pp".
///
///   zerotk::comm::ProcessGrid grid(world, {.pipeline = 2, .tensor = 2});   // data = W / 4
///   grid.data().reduce_scatter(...);                                      // ZeRO over the data group
///
/// Hierarchical all-reduce (reduce inside each node, all-reduce across node leaders, broadcast inside
/// each node) moves less data across nodes. It gives the flat all-reduce's result when sums are
/// exact; otherwise floating-point sums differ by rounding (the grouping differs). NCCL already
/// reduces hierarchically inside; HierarchicalCommunicator (comm/hierarchical.hpp) serves host-memory
/// communicators (NodeGroups and hierarchical_all_reduce below are its deprecated forerunners).

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/checks.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// Node-local groups of a communicator: `local()` holds the ranks of this rank's node (local rank 0
/// is the node's leader), `leaders()` the leaders of all nodes (meaningful on leaders only).
/// Deprecated since 0.2.0, removed in 0.3.0: comm::HierarchicalCommunicator (comm/hierarchical.hpp)
/// does the same reduction as a communicator, for every collective, over any number of levels.
template <Communicator C>
class [[deprecated("use comm::HierarchicalCommunicator (zerotk/comm/hierarchical.hpp)")]] NodeGroups {
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
/// Deprecated since 0.2.0 with NodeGroups: HierarchicalCommunicator::all_reduce.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
template <Communicator C>
[[deprecated("use comm::HierarchicalCommunicator::all_reduce (zerotk/comm/hierarchical.hpp)")]]
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
#pragma GCC diagnostic pop

/// comm.split(color, key), the new group named `label` in error messages where the communicator
/// takes a name (threads, MPI: "world/tensor[data 1, pipeline 0]"); a plain split elsewhere.
template <Communicator C>
C split_named(C& comm, int color, int key, std::string label) {
  if constexpr (requires { comm.split(color, key, std::move(label)); }) {
    return comm.split(color, key, std::move(label));
  } else {
    return comm.split(color, key);
  }
}

/// The grid's named dimensions (their product is the world). The context layout is folded inside
/// data (GridShape::context), the expert layout over tensor x data (GridShape::expert).
enum class GridDim : std::uint8_t { tensor, data, pipeline };
inline constexpr int kGridDims = 3;

constexpr std::string_view to_string(GridDim d) noexcept {
  switch (d) {
    case GridDim::tensor: return "tensor";
    case GridDim::data: return "data";
    case GridDim::pipeline: return "pipeline";
  }
  return "unknown";
}

/// Sizes of the grid's dimensions and the order ranks are laid out in. `data` = 0 means world size /
/// (pipeline * tensor). `order` names the dimensions fastest-varying first, Megatron's way:
/// "tp-dp-pp" (its default, and this one's) puts the ranks of one tensor group next to each other
/// (they exchange every layer: keep them on one node), then data, then pipeline. Any permutation of
/// tp, dp and pp is accepted.
struct GridShape {
  int data = 0;
  int pipeline = 1;
  int tensor = 1;
  std::string_view order = "tp-dp-pp";
  /// The expert layout, folded Megatron's way over the same ranks: each pipeline stage's
  /// tensor x data ranks (in world-rank order within the stage) are laid out again as
  /// expert_tensor x expert x expert_data, fastest first, so expert_data = tensor * data /
  /// (expert_tensor * expert). Expert parameters reduce over the expert-data group.
  int expert = 1;
  int expert_tensor = 1;
  /// Context parallelism, folded inside the data dimension: its `data` ranks are `context` ranks
  /// (fastest) x data / context replicas. A context group (same tensor, pipeline and replica index)
  /// splits each sequence into chunks (context/ulysses.hpp, context/ring.hpp); every rank of a
  /// replica reads the same samples. The data group stays what the engine reduces over and ZeRO
  /// partitions over (data x context in Megatron's words), so the engine learns nothing new.
  int context = 1;

  int size(GridDim d) const noexcept {
    return d == GridDim::tensor ? tensor : d == GridDim::data ? data : pipeline;
  }
};

namespace detail {
/// The dimensions of `order`, fastest first; a config_error naming the order when it is not a
/// permutation of tp, dp and pp.
inline std::array<GridDim, kGridDims> parse_grid_order(std::string_view order) {
  std::array<GridDim, kGridDims> out{};
  bool seen[kGridDims] = {false, false, false};
  std::size_t n = 0, at = 0;
  while (at <= order.size()) {
    const std::size_t end = std::min(order.find('-', at), order.size());
    const std::string_view name = order.substr(at, end - at);
    const int d = name == "tp" ? 0 : name == "dp" ? 1 : name == "pp" ? 2 : -1;
    if (d < 0 || n == kGridDims || seen[d]) { n = kGridDims + 1; break; }
    seen[d] = true;
    out[n++] = static_cast<GridDim>(d);
    at = end + 1;
  }
  if (n != kGridDims) {
    throw config_error("must name tp, dp and pp once each, fastest-varying first (Megatron's default \"tp-dp-pp\")",
                       "GridShape::order", std::string(order));
  }
  return out;
}
}  // namespace detail

/// The groups of one world as a grid: tensor, data and pipeline groups, and the model group
/// (tensor x pipeline: the ranks holding one replica of the model between them). Construction is
/// collective over `world`, which must outlive the grid; every group is split from it (threads,
/// MPI_Comm_split, ncclCommSplit), each rank's group ordered by its coordinate.
///
///   zerotk::comm::ProcessGrid grid(world, {.pipeline = 2, .tensor = 2});   // data = W / 4
///   zerotk::Engine<...> engine(grid, model, options);                     // ZeRO over grid.data()
template <Communicator C>
class ProcessGrid {
 public:
  ProcessGrid(C& world, GridShape shape)
      : world_(&world),
        shape_(resolve(world.size(), shape)),
        order_(detail::parse_grid_order(shape_.order)),
        index_(coordinates(world.rank())),
        tensor_(split_along(GridDim::tensor)),
        data_(split_along(GridDim::data)),
        pipeline_(split_along(GridDim::pipeline)),
        model_(split_named(world, index_[1], world.rank(), "model[data " + std::to_string(index_[1]) + "]")),
        context_(split_context()),
        expert_index_(expert_coordinates()),
        expert_tensor_(split_expert(0)),
        expert_(split_expert(1)),
        expert_data_(split_expert(2)) {}

  /// The world rank at grid coordinates, in `s.order` (Megatron's "tp-dp-pp" by default).
  static int world_rank_of(const GridShape& s, int data_index, int pipeline_index, int tensor_index) {
    const std::array<GridDim, kGridDims> order = detail::parse_grid_order(s.order);
    const int index[kGridDims] = {tensor_index, data_index, pipeline_index};
    int rank = 0, stride = 1;
    for (GridDim d : order) {
      rank += index[static_cast<int>(d)] * stride;
      stride *= s.size(d);
    }
    return rank;
  }

  const GridShape& shape() const noexcept { return shape_; }
  int size(GridDim d) const noexcept { return shape_.size(d); }
  int index(GridDim d) const noexcept { return index_[static_cast<int>(d)]; }
  int data_index() const noexcept { return index(GridDim::data); }
  int pipeline_index() const noexcept { return index(GridDim::pipeline); }
  int tensor_index() const noexcept { return index(GridDim::tensor); }

  C& world() noexcept { return *world_; }
  /// The ranks along dimension `d` (every other coordinate equal), ordered by their coordinate.
  C& group(GridDim d) noexcept { return d == GridDim::tensor ? tensor_ : d == GridDim::data ? data_ : pipeline_; }
  /// Ranks holding the same model shard: ZeRO partitions and gradients reduce here.
  C& data() noexcept { return data_; }
  /// Ranks of one pipeline (same data and tensor index), ordered by stage.
  C& pipeline() noexcept { return pipeline_; }
  /// Ranks splitting each layer's tensors (same data and pipeline index).
  C& tensor() noexcept { return tensor_; }
  /// All ranks of one model replica (pipeline x tensor, same data index): global norms of a sharded model.
  C& model() noexcept { return model_; }

  /// The context layout (GridShape::context): this rank's index in its context group (its chunk of
  /// each sequence), and the replica its data index belongs to: ranks of one replica read the same
  /// samples (a sampler shards by replica_index() over replica_count()).
  int context_size() const noexcept { return shape_.context; }
  int context_index() const noexcept { return data_index() % shape_.context; }
  int replica_count() const noexcept { return shape_.data / shape_.context; }
  int replica_index() const noexcept { return data_index() / shape_.context; }
  /// Same tensor, pipeline and replica index, ordered by context index: Ulysses' all-to-all and the
  /// ring's passes run here.
  C& context() noexcept { return context_; }

  /// The expert layout (GridShape::expert): ranks of one pipeline stage holding the same experts'
  /// shards differ in their expert-data index; those splitting one expert's tensors in their
  /// expert-tensor index; the expert group holds one copy of every expert (expert parallelism:
  /// moe::Dispatcher's all-to-all runs there).
  int expert_size() const noexcept { return shape_.expert; }
  int expert_tensor_size() const noexcept { return shape_.expert_tensor; }
  int expert_data_size() const noexcept { return shape_.tensor * shape_.data / (shape_.expert * shape_.expert_tensor); }
  int expert_index() const noexcept { return expert_index_[1]; }
  int expert_tensor_index() const noexcept { return expert_index_[0]; }
  int expert_data_index() const noexcept { return expert_index_[2]; }
  /// Same expert-tensor, expert-data and pipeline index, ordered by expert index.
  C& expert() noexcept { return expert_; }
  /// Same expert-tensor, expert and pipeline index, ordered by expert-data index: expert parameters'
  /// gradients reduce and their ZeRO shards spread here.
  C& expert_data() noexcept { return expert_data_; }
  /// Same expert, expert-data and pipeline index, ordered by expert-tensor index.
  C& expert_tensor() noexcept { return expert_tensor_; }

 private:
  static GridShape resolve(int world, GridShape s) {
    const std::string sizes = std::to_string(s.data) + " x " + std::to_string(s.pipeline) + " x " + std::to_string(s.tensor);
    if (s.pipeline < 1 || s.tensor < 1 || s.data < 0) {
      throw config_error("grid sizes must be >= 1 (data 0: inferred)", "GridShape (data x pipeline x tensor)", sizes);
    }
    if (s.data == 0 && world % (s.pipeline * s.tensor) == 0) s.data = world / (s.pipeline * s.tensor);
    if (s.data * s.pipeline * s.tensor != world) {
      throw config_error("data x pipeline x tensor must equal the world size " + std::to_string(world),
                         "GridShape (data x pipeline x tensor)", sizes);
    }
    if (s.context < 1 || s.data % s.context != 0) {
      throw config_error("must divide the data ranks (" + std::to_string(s.data) +
                             "): a context group splits one replica's sequences",
                         "GridShape::context", std::to_string(s.context));
    }
    if (s.expert < 1 || s.expert_tensor < 1 || (s.tensor * s.data) % (s.expert * s.expert_tensor) != 0) {
      throw config_error("expert x expert_tensor must divide tensor x data (" + std::to_string(s.tensor * s.data) +
                             " ranks per pipeline stage)",
                         "GridShape (expert x expert_tensor)",
                         std::to_string(s.expert) + " x " + std::to_string(s.expert_tensor));
    }
    return s;
  }

  /// This rank's coordinates [tensor, data, pipeline] from its world rank.
  std::array<int, kGridDims> coordinates(int rank) const {
    std::array<int, kGridDims> out{};
    for (GridDim d : order_) {
      out[static_cast<int>(d)] = rank % shape_.size(d);
      rank /= shape_.size(d);
    }
    return out;
  }

  /// The group along `d`: color = the other coordinates (mixed radix), key = the coordinate on d.
  C split_along(GridDim along) {
    int color = 0;
    // The group's name by role, with this rank's other coordinates: "tensor[data 1, pipeline 0]".
    std::string label = std::string(to_string(along)) + "[";
    bool first = true;
    for (GridDim d : order_) {
      if (d == along) continue;
      color = color * shape_.size(d) + index_[static_cast<int>(d)];
      label += (first ? "" : ", ") + std::string(to_string(d)) + " " + std::to_string(index_[static_cast<int>(d)]);
      first = false;
    }
    return split_named(*world_, color, index_[static_cast<int>(along)], label + "]");
  }

  /// The context group: color = (pipeline, tensor, replica), key = the context index.
  C split_context() {
    const int color = (pipeline_index() * shape_.tensor + tensor_index()) * replica_count() + replica_index();
    return split_named(*world_, color, context_index(),
                       "context[tensor " + std::to_string(tensor_index()) + ", replica " + std::to_string(replica_index()) +
                           ", pipeline " + std::to_string(pipeline_index()) + "]");
  }

  /// [expert_tensor, expert, expert_data] of this rank: its index among its pipeline stage's ranks
  /// (tensor x data, in world-rank order, whatever GridShape::order says), read fastest first.
  std::array<int, 3> expert_coordinates() const {
    int q = 0;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (*it != GridDim::pipeline) q = q * shape_.size(*it) + index_[static_cast<int>(*it)];
    }
    const int et = shape_.expert_tensor, ep = shape_.expert;
    return {q % et, (q / et) % ep, q / (et * ep)};
  }

  /// The expert layout's group along `along` (0 expert_tensor, 1 expert, 2 expert_data).
  C split_expert(int along) {
    static constexpr const char* names[3] = {"expert_tensor", "expert", "expert_data"};
    const int sizes[3] = {shape_.expert_tensor, shape_.expert, expert_data_size()};
    int color = pipeline_index();
    std::string label = std::string(names[along]) + "[";
    for (int d = 2; d >= 0; --d) {
      if (d == along) continue;
      color = color * sizes[d] + expert_index_[static_cast<std::size_t>(d)];
      label += std::string(names[d]) + " " + std::to_string(expert_index_[static_cast<std::size_t>(d)]) + ", ";
    }
    label += "pipeline " + std::to_string(pipeline_index()) + "]";
    return split_named(*world_, color, expert_index_[static_cast<std::size_t>(along)], label);
  }

  C* world_;
  GridShape shape_;
  std::array<GridDim, kGridDims> order_;
  std::array<int, kGridDims> index_;  // [tensor, data, pipeline]
  C tensor_, data_, pipeline_, model_, context_;
  std::array<int, 3> expert_index_;  // [expert_tensor, expert, expert_data]
  C expert_tensor_, expert_, expert_data_;
};

}  // namespace zerotk::comm
