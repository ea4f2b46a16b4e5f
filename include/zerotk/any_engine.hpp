#pragma once
/// \file zerotk/any_engine.hpp
/// AnyEngine: an engine whose policies are chosen at run time, from a DeepSpeed config, among the
/// compiled engine set (zerotk/engines/set.hpp). It models TrainingEngine (engine/api.hpp) like a
/// typed Engine<...>, over the same compiled code: one virtual call per layer scope, per step and
/// per query, never per element. A trainer written over it includes this header, not engine.hpp,
/// and compiles none of the engine: its members are compiled in zerotk::engines, which it links.
///
///   #include <zerotk/any_engine.hpp>
///   zerotk::AnyEngine engine = zerotk::make_engine_from_file("ds_config.json", comm, model);
///   for (auto& l : model.layers) { auto s = engine.forward(l);  x = l.forward(x); }
///   for (auto& l : reversed)     { auto s = engine.backward(l); dx = l.backward(dx); }
///   zerotk::StepReport r = engine.step(loss);
///
/// make_engine picks the compiled engine whose structure fits the config (stage, precision,
/// optimizer, offload, compression) and builds it with the config's options, the trainer's edit and
/// the config's LR scheduler; when none fits it throws a config_error naming the config's
/// combination and the nearest compiled ones. AnyEngine::of<E>(comm, model, options) erases a typed
/// engine of any policies (declared here, defined in engine/erased.hpp, which that needs).
///
/// This header stays light on purpose (bench/compile measures it): the value types that only some
/// trainers touch (EngineOptions, EngineState, ShardTable, LrScheduler, GridPlace, the communicator
/// types) are declared, not defined; include their own headers (engine/options.hpp,
/// engine/state.hpp, ...) where you use them.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/engine/model_view.hpp"
#include "zerotk/engine/report.hpp"

namespace zerotk {

struct EngineOptions;
struct EngineState;
struct EngineGroupView;
class MemoryLedger;
namespace optim {
class LrScheduler;
}  // namespace optim
using optim::LrScheduler;
namespace config {
struct Config;
}  // namespace config
namespace comm {
class AnyCommunicator;
struct CommStats;
struct LinkStats;
class Topology;
struct TopologyOptions;
}  // namespace comm
namespace compress {
struct QuantizedStats;
}  // namespace compress
namespace engine {
struct GridPlace;
struct ShardTable;
struct Placement;
class ErasedEngine;
}  // namespace engine

/// What a trainer adds to the options a config gives (its model's parameter groups, fp32-kept
/// parameters, tensor splits): called on the engine's options before it is built.
using EngineOptionsEdit = std::function<void(EngineOptions&)>;

class AnyEngine {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using ModuleId = std::uint32_t;

  /// Brackets a layer's forward (Engine::forward): closing it releases what the layer needed.
  class [[nodiscard]] ForwardScope {
   public:
    ~ForwardScope() noexcept(false) { e_->end_forward(id_, t0_); }
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

   private:
    friend AnyEngine;
    ForwardScope(AnyEngine* e, ModuleId id, TimePoint t0) : e_(e), id_(id), t0_(t0) {}
    AnyEngine* e_;
    ModuleId id_;
    TimePoint t0_;
  };
  /// Brackets a layer's backward (Engine::backward): closing it starts the reduction of full buckets.
  class [[nodiscard]] BackwardScope {
   public:
    ~BackwardScope() noexcept(false) { e_->end_backward(id_, t0_); }
    BackwardScope(const BackwardScope&) = delete;
    BackwardScope& operator=(const BackwardScope&) = delete;

   private:
    friend AnyEngine;
    BackwardScope(AnyEngine* e, ModuleId id) : e_(e), id_(id), t0_(std::chrono::steady_clock::now()) {}
    AnyEngine* e_;
    ModuleId id_;
    TimePoint t0_;
  };
  /// Engine::gather's scope: the module's parameters hold their full values until it closes.
  class [[nodiscard]] GatherScope {
   public:
    ~GatherScope() noexcept(false) { e_->end_gather(id_, modifier_rank_); }
    GatherScope(const GatherScope&) = delete;
    GatherScope& operator=(const GatherScope&) = delete;

   private:
    friend AnyEngine;
    GatherScope(AnyEngine* e, ModuleId id, std::optional<int> modifier_rank) : e_(e), id_(id), modifier_rank_(modifier_rank) {}
    AnyEngine* e_;
    ModuleId id_;
    std::optional<int> modifier_rank_;
  };

  explicit AnyEngine(std::unique_ptr<engine::ErasedEngine> impl);
  AnyEngine(AnyEngine&&) noexcept;
  AnyEngine& operator=(AnyEngine&&) noexcept;
  ~AnyEngine();

  /// A typed engine E (an Engine<Ps...>), built from `comm` (or a grid) and `model` and erased.
  /// Defined in engine/erased.hpp (include it to call this); E's members are compiled where it is
  /// called unless E is in the compiled set and zerotk/engines.hpp was included first.
  template <class E, class CommOrGrid, Module M>
  static AnyEngine of(CommOrGrid& comm, M& model, EngineOptions options);

  // ---- the training loop (zerotk/engine.hpp documents each) ---------------------------------------
  template <Module L>
  ForwardScope forward(L& layer) {
    return forward(engine::layer_ref(layer));
  }
  ForwardScope forward(const engine::LayerRef& layer) {
    TimePoint t0;
    const ModuleId id = open_forward(layer, t0);
    return ForwardScope(this, id, t0);
  }
  template <Module L>
  BackwardScope backward(L& layer) {
    return backward(engine::layer_ref(layer));
  }
  BackwardScope backward(const engine::LayerRef& layer) { return BackwardScope(this, open_backward(layer)); }
  template <Module M>
  GatherScope gather(M& module, std::optional<int> modifier_rank = std::nullopt) {
    return gather(engine::layer_ref(module), modifier_rank);
  }
  GatherScope gather(const engine::LayerRef& module, std::optional<int> modifier_rank = std::nullopt) {
    return GatherScope(this, open_gather(module, modifier_rank), modifier_rank);
  }
  double loss_scale() const;
  StepReport step(double loss = 0.0);
  void synchronize();
  void settle();
  bool at_boundary() const;
  void broadcast_parameters(int root = 0);
  void initialize_master();
  void set_scheduler(LrScheduler scheduler);

  // ---- what it is, where it runs ------------------------------------------------------------------
  int stage() const;
  DType storage_dtype() const;
  std::string_view optimizer_name() const;
  /// The engine type in words: "Stage<2>, Precision<bf16>, LossScaler<None>, Optimizer<AdamW>, ...".
  std::string description() const;
  int rank() const;
  int world_size() const;
  const engine::GridPlace& grid_place() const;
  const EngineOptions& options() const;
  const MemoryLedger& memory() const;
  MemoryLedger& memory();
  const comm::CommStats& comm_stats() const;
  comm::AnyCommunicator& step_communicator();
  BatchShare batch_share() const;
  double lr(std::size_t group = 0) const;
  std::int64_t global_steps() const;
  std::int64_t skipped_steps() const;
  std::size_t pending_gathers() const;
  std::size_t parameter_count() const;
  std::size_t flat_numel() const;
  std::size_t bucket_count() const;
  std::vector<DType> stored_dtypes() const;
  /// The data group's topology, and what its hierarchical collectives sent per link level (null
  /// when flat); with hpZ the group communicator's counters; ZeRO++ qwZ / qgZ's figures (null when
  /// off): zerotk/engine/introspection.hpp documents each.
  const comm::Topology& topology() const;
  const comm::LinkStats* link_stats() const;
  const comm::CommStats* group_comm_stats() const;
  const compress::QuantizedStats* quantized_weights_stats() const;
  const compress::QuantizedStats* quantized_gradients_stats() const;
  /// OffloadParams<Nvme>: host bytes of the shard's blocks kept in memory (max_in_cpu); 0 for an
  /// engine whose parameters are not offloaded to NVMe.
  std::size_t param_bytes_in_cpu() const;

  // ---- state ------------------------------------------------------------------------------------
  EngineState state() const;
  EngineState scalar_state() const;
  /// Whether state_views() can view the state in place (the state lives in host memory; not with
  /// Offload<Nvme>, whose state is in a file): checkpoint::save asks before it views.
  bool views_state() const;
  std::vector<EngineGroupView> state_views() const;
  void load_state(const EngineState& s);
  engine::ShardTable shard_table() const;

  /// The erased engine behind this one (engine/erased.hpp).
  engine::ErasedEngine& erased() noexcept { return *impl_; }

 private:
  ModuleId open_forward(const engine::LayerRef& layer, TimePoint& t0);
  ModuleId open_backward(const engine::LayerRef& layer);
  ModuleId open_gather(const engine::LayerRef& module, std::optional<int> modifier_rank);
  void end_forward(ModuleId id, TimePoint t0);
  void end_backward(ModuleId id, TimePoint t0);
  void end_gather(ModuleId id, std::optional<int> modifier_rank);

  std::unique_ptr<engine::ErasedEngine> impl_;
};

namespace engine {
/// make_engine's inputs with the communicator's and the model's types forgotten.
struct ErasedInputs {
  void* comm = nullptr;
  Placement (*place)(void* comm, const comm::TopologyOptions& topology) = nullptr;
  ModelView model;
  int world_size = 1;  ///< every rank of the job (a grid's world), for the config's batch rules
  int world_rank = 0;  ///< this rank in it (make_engine_from_file prints the config's notices on rank 0 only)
};
/// ErasedInputs over `comm_or_grid` (a host-memory communicator, or a comm::ProcessGrid of one):
/// the one function a trainer's TU instantiates for its communicator (engine/erased_inputs.hpp,
/// included below).
template <class CommOrGrid, Module M>
ErasedInputs erase_inputs(CommOrGrid& comm_or_grid, M& model);
}  // namespace engine

namespace detail {
/// Compiled in zerotk::engines (src/engines/make_engine.cpp, config_file.cpp).
AnyEngine make_any_engine(const config::Config& cfg, engine::ErasedInputs inputs, const EngineOptionsEdit& edit);
AnyEngine make_any_engine_from_file(const std::filesystem::path& ds_config, engine::ErasedInputs inputs,
                                    const EngineOptionsEdit& edit);
}  // namespace detail

/// The compiled engine make_engine builds for `cfg`, in words (its policies, as config::describe
/// names them). Throws make_engine's config_error, naming the config's combination and the nearest
/// compiled engines, when none fits: a trainer asks before it starts its ranks, so that a config
/// the binary cannot run fails once, in one place. Needs zerotk::engines.
std::string compiled_engine_for(const config::Config& cfg);

/// The compiled engine whose structure fits `cfg`, built over `comm_or_grid` (a host-memory
/// communicator, or a comm::ProcessGrid of one: ZeRO over its data group) and `model`, with the
/// config's options (then `edit`'s) and its LR scheduler. Collective over the communicator.
/// Throws config_error naming the config's combination and the nearest compiled engines when none
/// fits, or what the config asks that the engine refuses. Needs zerotk::engines.
template <class CommOrGrid, Module M>
AnyEngine make_engine(const config::Config& cfg, CommOrGrid& comm_or_grid, M& model, const EngineOptionsEdit& edit = {}) {
  return detail::make_any_engine(cfg, engine::erase_inputs(comm_or_grid, model), edit);
}

/// The same from a DeepSpeed JSON file, read and resolved in the compiled library (so the trainer
/// compiles no JSON reader) for the communicator's world. Its "auto" values need what only the
/// trainer knows (hidden size, micro batch): resolve such a file with config::load_file and
/// make_engine(cfg, ...). Needs zerotk::engines built with nlohmann-json.
template <class CommOrGrid, Module M>
AnyEngine make_engine_from_file(const std::filesystem::path& ds_config, CommOrGrid& comm_or_grid, M& model,
                                const EngineOptionsEdit& edit = {}) {
  return detail::make_any_engine_from_file(ds_config, engine::erase_inputs(comm_or_grid, model), edit);
}

}  // namespace zerotk

#include "zerotk/engine/erased_inputs.hpp"
