#pragma once
/// \file zerotk/any_engine.hpp
/// AnyEngine: an engine whose policies are chosen at run time, from a DeepSpeed config, among the
/// compiled engine set (zerotk/engines/set.hpp). It models TrainingEngine (engine/api.hpp) like a
/// typed Engine<...>, over the same compiled code: one virtual call per layer scope, per step and
/// per query, never per element. A trainer written over it includes this header, not engine.hpp,
/// and compiles none of the engine: it links zerotk::engines.
///
///   #include <zerotk/any_engine.hpp>
///   zerotk::AnyEngine engine = zerotk::make_engine(cfg, comm, model);  // cfg: config::load_file(...)
///   for (auto& l : model.layers) { auto s = engine.forward(l);  x = l.forward(x); }
///   for (auto& l : reversed)     { auto s = engine.backward(l); dx = l.backward(dx); }
///   zerotk::StepReport r = engine.step(loss);
///
/// make_engine picks the compiled engine whose structure fits the config (stage, precision,
/// optimizer, offload, compression) and builds it with the config's options, the trainer's
/// adjustments and the config's LR scheduler; when none fits it throws a config_error naming the
/// config's combination and the nearest compiled ones. A typed engine is erased with
/// AnyEngine::of<E>(comm, model, options) (any policies, compiled where that is called).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/engine/model_view.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/engine/scopes.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk {

namespace config {
struct Config;
}  // namespace config

namespace engine {

/// AnyEngine's interface (the engine behind it: ErasedEngineOf<E>).
class ErasedEngine {
 public:
  using TimePoint = zerotk::detail::Clock::time_point;
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

  // state
  virtual EngineState state() const = 0;
  virtual EngineState scalar_state() const = 0;
  virtual bool views_state() const = 0;
  virtual std::vector<EngineGroupView> state_views() const = 0;
  virtual void load_state(const EngineState& s) = 0;
  virtual ShardTable shard_table() const = 0;
};

/// ErasedEngine over a typed engine E (an Engine<Ps...>, or any type with its members): each call
/// forwards to E's. Its virtual functions are compiled where it is instantiated: once per engine
/// type in the compiled set's make_engine.cpp, or in the trainer's TU for AnyEngine::of<E>.
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

}  // namespace engine

class AnyEngine {
 public:
  using ForwardScope = engine::ForwardScope<AnyEngine>;
  using BackwardScope = engine::BackwardScope<AnyEngine>;
  using GatherScope = engine::GatherScope<AnyEngine>;

  explicit AnyEngine(std::unique_ptr<engine::ErasedEngine> impl) : impl_(std::move(impl)) {
    if (!impl_) throw usage_error("AnyEngine needs an engine", "AnyEngine");
  }
  AnyEngine(AnyEngine&&) noexcept = default;
  AnyEngine& operator=(AnyEngine&&) noexcept = default;

  /// A typed engine Engine<Ps...> (E), built here from `comm` (or a grid) and `model` and erased.
  /// E's members are compiled where this is called, unless E is in the compiled set and
  /// zerotk/engines.hpp was included before.
  template <class E, class CommOrGrid, Module M>
  static AnyEngine of(CommOrGrid& comm, M& model, EngineOptions options = {}) {
    return AnyEngine(std::make_unique<engine::ErasedEngineOf<E>>(comm, model, std::move(options)));
  }

  // ---- the training loop (zerotk/engine.hpp documents each) ---------------------------------------
  template <Module L>
  ForwardScope forward(L& layer) {
    return forward(engine::layer_ref(layer));
  }
  ForwardScope forward(const engine::LayerRef& layer) {
    engine::ErasedEngine::TimePoint t0;
    const engine::ModuleId id = impl_->open_forward(layer, t0);
    return ForwardScope(this, id, t0);
  }
  template <Module L>
  BackwardScope backward(L& layer) {
    return backward(engine::layer_ref(layer));
  }
  BackwardScope backward(const engine::LayerRef& layer) {
    const engine::ModuleId id = impl_->open_backward(layer);
    return BackwardScope(this, id);
  }
  template <Module M>
  GatherScope gather(M& module, std::optional<int> modifier_rank = std::nullopt) {
    return gather(engine::layer_ref(module), modifier_rank);
  }
  GatherScope gather(const engine::LayerRef& module, std::optional<int> modifier_rank = std::nullopt) {
    const engine::ModuleId id = impl_->open_gather(module, modifier_rank);
    return GatherScope(this, id, modifier_rank);
  }
  double loss_scale() const { return impl_->loss_scale(); }
  StepReport step(double loss = 0.0) { return impl_->step(loss); }
  void synchronize() { impl_->synchronize(); }
  void settle() { impl_->settle(); }
  bool at_boundary() const { return impl_->at_boundary(); }
  void broadcast_parameters(int root = 0) { impl_->broadcast_parameters(root); }
  void initialize_master() { impl_->initialize_master(); }
  void set_scheduler(LrScheduler scheduler) { impl_->set_scheduler(std::move(scheduler)); }

  // ---- what it is, where it runs ------------------------------------------------------------------
  int stage() const { return impl_->stage(); }
  DType storage_dtype() const { return impl_->storage_dtype(); }
  std::string_view optimizer_name() const { return impl_->optimizer_name(); }
  /// The engine type in words: "Stage<2>, Precision<bf16>, LossScaler<None>, Optimizer<AdamW>, ...".
  std::string description() const { return impl_->description(); }
  int rank() const { return impl_->rank(); }
  int world_size() const { return impl_->world_size(); }
  const engine::GridPlace& grid_place() const { return impl_->grid_place(); }
  const EngineOptions& options() const { return impl_->options(); }
  const MemoryLedger& memory() const { return impl_->memory(); }
  MemoryLedger& memory() { return impl_->memory(); }
  const comm::CommStats& comm_stats() const { return impl_->comm_stats(); }
  comm::AnyCommunicator& step_communicator() { return impl_->step_communicator(); }
  BatchShare batch_share() const { return impl_->batch_share(); }
  double lr(std::size_t group = 0) const { return impl_->lr(group); }
  std::int64_t global_steps() const { return impl_->global_steps(); }
  std::int64_t skipped_steps() const { return impl_->skipped_steps(); }
  std::size_t pending_gathers() const { return impl_->pending_gathers(); }
  std::size_t parameter_count() const { return impl_->parameter_count(); }
  std::size_t flat_numel() const { return impl_->flat_numel(); }
  std::size_t bucket_count() const { return impl_->bucket_count(); }
  std::vector<DType> stored_dtypes() const { return impl_->stored_dtypes(); }

  // ---- state ------------------------------------------------------------------------------------
  EngineState state() const { return impl_->state(); }
  EngineState scalar_state() const { return impl_->scalar_state(); }
  /// Whether state_views() can view the state in place (the state lives in host memory; not with
  /// Offload<Nvme>, whose state is in a file): checkpoint::save asks before it views.
  bool views_state() const { return impl_->views_state(); }
  std::vector<EngineGroupView> state_views() const { return impl_->state_views(); }
  void load_state(const EngineState& s) { impl_->load_state(s); }
  engine::ShardTable shard_table() const { return impl_->shard_table(); }

 private:
  friend ForwardScope;
  friend BackwardScope;
  friend GatherScope;
  void end_forward(engine::ModuleId id, engine::ErasedEngine::TimePoint t0) { impl_->end_forward(id, t0); }
  void end_backward(engine::ModuleId id, engine::ErasedEngine::TimePoint t0) { impl_->end_backward(id, t0); }
  void end_gather(engine::ModuleId id, std::optional<int> modifier_rank) { impl_->end_gather(id, modifier_rank); }

  std::unique_ptr<engine::ErasedEngine> impl_;
};

/// What a trainer adds to the options a config gives (its model's parameter groups, fp32-kept
/// parameters, tensor splits): called on the engine's options before it is built.
using EngineOptionsEdit = std::function<void(EngineOptions&)>;

namespace engine {
/// make_engine's inputs with the communicator's and the model's types forgotten.
struct ErasedInputs {
  void* comm = nullptr;
  Placement (*place)(void* comm, const comm::TopologyOptions& topology) = nullptr;
  ModelView model;
  int world_size = 1;  ///< every rank of the job (a grid's world), for the config's batch rules

  template <comm::Communicator C, Module M>
  static ErasedInputs of(C& comm, M& model) {
    static_assert(!comm::uses_device_memory<C>,
                  "make_engine: the compiled engine set runs on Device<Host> (a host-memory communicator: threads, "
                  "MPI); a Device<Cuda> engine is typed: zerotk::Engine<..., zerotk::Device<zerotk::Cuda>>");
    return {&comm, [](void* c, const comm::TopologyOptions& t) { return place_on(*static_cast<C*>(c), t); },
            view_model(model), comm.size()};
  }
  template <comm::Communicator C, Module M>
  static ErasedInputs of(comm::ProcessGrid<C>& grid, M& model) {
    static_assert(!comm::uses_device_memory<C>,
                  "make_engine: the compiled engine set runs on Device<Host> (a host-memory communicator: threads, MPI)");
    return {&grid,
            [](void* g, const comm::TopologyOptions& t) { return place_on(*static_cast<comm::ProcessGrid<C>*>(g), t); },
            view_model(model), grid.world().size()};
  }
};
}  // namespace engine

namespace detail {
/// Compiled in zerotk::engines (src/engines/make_engine.cpp, config_file.cpp).
AnyEngine make_any_engine(const config::Config& cfg, engine::ErasedInputs inputs, const EngineOptionsEdit& edit);
AnyEngine make_any_engine_from_file(const std::filesystem::path& ds_config, engine::ErasedInputs inputs,
                                    const EngineOptionsEdit& edit);
}  // namespace detail

/// The compiled engine whose structure fits `cfg`, built over `comm_or_grid` (a host-memory
/// communicator, or a comm::ProcessGrid of one: ZeRO over its data group) and `model`, with the
/// config's options (then `edit`'s) and its LR scheduler. Collective over the communicator.
/// Throws config_error naming the config's combination and the nearest compiled engines when none
/// fits, or what the config asks that the engine refuses. Needs zerotk::engines.
template <class CommOrGrid, Module M>
AnyEngine make_engine(const config::Config& cfg, CommOrGrid& comm_or_grid, M& model, const EngineOptionsEdit& edit = {}) {
  return detail::make_any_engine(cfg, engine::ErasedInputs::of(comm_or_grid, model), edit);
}

/// The same from a DeepSpeed JSON file, read and resolved in the compiled library (so the trainer
/// compiles no JSON reader) for the communicator's world. Its "auto" values need what only the
/// trainer knows (hidden size, micro batch): resolve such a file with config::load_file and
/// make_engine(cfg, ...). Needs zerotk::engines built with nlohmann-json (ZEROTK_HAS_JSON).
template <class CommOrGrid, Module M>
AnyEngine make_engine_from_file(const std::filesystem::path& ds_config, CommOrGrid& comm_or_grid, M& model,
                                const EngineOptionsEdit& edit = {}) {
  return detail::make_any_engine_from_file(ds_config, engine::ErasedInputs::of(comm_or_grid, model), edit);
}

}  // namespace zerotk
