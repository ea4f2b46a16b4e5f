#pragma once
/// \file zerotk/erased_engine.hpp
/// What stands behind AnyEngine (zerotk/any_engine.hpp): the interface engine::ErasedEngine, one
/// virtual function per member of the engine's face (engine/api.hpp), and ErasedEngineOf<E>, its
/// implementation over a typed engine E, each call forwarding to E's. The compiled set's
/// make_engine.cpp instantiates ErasedEngineOf once per engine type; a trainer includes this header
/// only to erase a typed engine of its own (AnyEngine::of<E>).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/any_engine.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/compress/quantized_collectives.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk::engine {

class ErasedEngine {
 public:
  using TimePoint = AnyEngine::TimePoint;
  virtual ~ErasedEngine() = default;

  // scopes: opened here, closed by AnyEngine's scope guards
  virtual ModuleId open_forward(const LayerRef& layer, TimePoint& t0) = 0;
  virtual void end_forward(ModuleId id, TimePoint t0) = 0;
  virtual ModuleId open_backward(const LayerRef& layer) = 0;
  virtual void end_backward(ModuleId id, TimePoint t0) = 0;
  virtual ModuleId open_gather(const LayerRef& module, std::optional<int> modifier_rank) = 0;
  virtual void end_gather(ModuleId id, std::optional<int> modifier_rank) = 0;

  // training
  virtual double loss_scale() const = 0;
  virtual StepReport step(double loss) = 0;
  virtual void synchronize() = 0;
  virtual void settle() = 0;
  virtual bool at_boundary() const = 0;
  virtual void broadcast_parameters(int root) = 0;
  virtual void initialize_master() = 0;
  virtual void set_scheduler(LrScheduler scheduler) = 0;

  // what it is, where it runs
  virtual int stage() const = 0;
  virtual DType storage_dtype() const = 0;
  virtual std::string_view optimizer_name() const = 0;
  virtual std::string description() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const GridPlace& grid_place() const = 0;
  virtual const EngineOptions& options() const = 0;
  virtual const MemoryLedger& memory() const = 0;
  virtual MemoryLedger& memory() = 0;
  virtual const comm::CommStats& comm_stats() const = 0;
  virtual comm::AnyCommunicator& step_communicator() = 0;
  virtual BatchShare batch_share() const = 0;
  virtual double lr(std::size_t group) const = 0;
  virtual std::int64_t global_steps() const = 0;
  virtual std::int64_t skipped_steps() const = 0;
  virtual std::size_t pending_gathers() const = 0;
  virtual std::size_t parameter_count() const = 0;
  virtual std::size_t flat_numel() const = 0;
  virtual std::size_t bucket_count() const = 0;
  virtual std::vector<DType> stored_dtypes() const = 0;
  virtual const comm::Topology& topology() const = 0;
  virtual const comm::LinkStats* link_stats() const = 0;
  virtual const comm::CommStats* group_comm_stats() const = 0;
  virtual const compress::QuantizedStats* quantized_weights_stats() const = 0;
  virtual const compress::QuantizedStats* quantized_gradients_stats() const = 0;
  virtual std::size_t param_bytes_in_cpu() const = 0;

  // state
  virtual EngineState state() const = 0;
  virtual EngineState scalar_state() const = 0;
  virtual bool views_state() const = 0;
  virtual std::vector<EngineGroupView> state_views() const = 0;
  virtual void load_state(const EngineState& s) = 0;
  virtual ShardTable shard_table() const = 0;
};

/// ErasedEngine over a typed engine E (an Engine<Ps...>): each call forwards to E's. E befriends it
/// (the scopes' engine side is private to E).
template <class E>
class ErasedEngineOf final : public ErasedEngine {
 public:
  template <class CommOrGrid, Module M>
  ErasedEngineOf(CommOrGrid& comm, M& model, EngineOptions options, std::string description = {})
      : e_(comm, model, std::move(options)), description_(std::move(description)) {}
  ErasedEngineOf(EngineInputs<typename E::ops_type> inputs, EngineOptions options, std::string description = {})
      : e_(std::move(inputs), std::move(options)), description_(std::move(description)) {}

  E& typed() noexcept { return e_; }

  ModuleId open_forward(const LayerRef& layer, TimePoint& t0) override { return e_.open_forward(layer, t0); }
  void end_forward(ModuleId id, TimePoint t0) override { e_.end_forward(id, t0); }
  ModuleId open_backward(const LayerRef& layer) override { return e_.open_backward(layer); }
  void end_backward(ModuleId id, TimePoint t0) override { e_.end_backward(id, t0); }
  ModuleId open_gather(const LayerRef& module, std::optional<int> modifier_rank) override {
    return e_.open_gather(module, modifier_rank);
  }
  void end_gather(ModuleId id, std::optional<int> modifier_rank) override { e_.end_gather(id, modifier_rank); }

  double loss_scale() const override { return e_.loss_scale(); }
  StepReport step(double loss) override { return e_.step(loss); }
  void synchronize() override { e_.synchronize(); }
  void settle() override { e_.settle(); }
  bool at_boundary() const override { return e_.at_boundary(); }
  void broadcast_parameters(int root) override { e_.broadcast_parameters(root); }
  void initialize_master() override { e_.initialize_master(); }
  void set_scheduler(LrScheduler scheduler) override { e_.set_scheduler(std::move(scheduler)); }

  int stage() const override { return e_.stage(); }
  DType storage_dtype() const override { return e_.storage_dtype(); }
  std::string_view optimizer_name() const override { return e_.optimizer_name(); }
  std::string description() const override {
    if (!description_.empty()) return description_;
    return "Stage<" + std::to_string(e_.stage()) + ">, Precision<" + std::string(to_string(e_.storage_dtype())) +
           ">, Optimizer<" + std::string(e_.optimizer_name()) + ">";
  }
  int rank() const override { return e_.rank(); }
  int world_size() const override { return e_.world_size(); }
  const GridPlace& grid_place() const override { return e_.grid_place(); }
  const EngineOptions& options() const override { return e_.options(); }
  const MemoryLedger& memory() const override { return e_.memory(); }
  MemoryLedger& memory() override { return e_.memory(); }
  const comm::CommStats& comm_stats() const override { return e_.comm_stats(); }
  comm::AnyCommunicator& step_communicator() override { return e_.step_communicator(); }
  BatchShare batch_share() const override { return e_.batch_share(); }
  double lr(std::size_t group) const override { return e_.lr(group); }
  std::int64_t global_steps() const override { return e_.global_steps(); }
  std::int64_t skipped_steps() const override { return e_.skipped_steps(); }
  std::size_t pending_gathers() const override { return e_.pending_gathers(); }
  std::size_t parameter_count() const override { return e_.parameter_count(); }
  std::size_t flat_numel() const override { return e_.flat_numel(); }
  std::size_t bucket_count() const override { return e_.bucket_count(); }
  std::vector<DType> stored_dtypes() const override { return e_.stored_dtypes(); }
  const comm::Topology& topology() const override { return e_.topology(); }
  const comm::LinkStats* link_stats() const override { return e_.link_stats(); }
  const comm::CommStats* group_comm_stats() const override { return e_.group_comm_stats(); }
  const compress::QuantizedStats* quantized_weights_stats() const override { return e_.quantized_weights_stats(); }
  const compress::QuantizedStats* quantized_gradients_stats() const override { return e_.quantized_gradients_stats(); }
  std::size_t param_bytes_in_cpu() const override {
    if constexpr (requires(const E& e) { e.param_bytes_in_cpu(); }) {
      return e_.param_bytes_in_cpu();
    } else {
      return 0;
    }
  }

  EngineState state() const override { return e_.state(); }
  EngineState scalar_state() const override { return e_.scalar_state(); }
  bool views_state() const override { return requires(const E& e) { e.state_views(); }; }
  std::vector<EngineGroupView> state_views() const override {
    if constexpr (requires(const E& e) { e.state_views(); }) {
      return e_.state_views();
    } else {
      throw usage_error("this engine keeps its optimizer state out of host memory (Offload<Nvme>): take state() instead",
                        "AnyEngine::state_views", description());
    }
  }
  void load_state(const EngineState& s) override { e_.load_state(s); }
  ShardTable shard_table() const override { return e_.shard_table(); }

 private:
  E e_;
  std::string description_;
};

}  // namespace zerotk::engine

namespace zerotk {

template <class E, class CommOrGrid, Module M>
AnyEngine AnyEngine::of(CommOrGrid& comm, M& model, EngineOptions options) {
  return AnyEngine(std::make_unique<engine::ErasedEngineOf<E>>(comm, model, std::move(options)));
}

}  // namespace zerotk
