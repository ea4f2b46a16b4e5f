#pragma once
/// \file zerotk/engine.hpp
/// Engine<Policies...>: data-parallel training with ZeRO stages 0, 1, 2 and 3 over the user's own
/// model, on a plain communicator or on the data group of a process grid.
///
///   using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                                 zerotk::Precision<zerotk::fp16>>;        // any order; others defaulted
///   init_weights(model);                       // DeepSpeed's order: initialise, then wrap
///   Engine engine(comm, model, options);       // or engine(grid, ...): ZeRO over grid.data()
///   for (micro-step) {
///     for (auto& l : layers)          { auto s = engine.forward(l);  x = l.forward(x); }
///     // seed backward with engine.loss_scale()
///     for (auto& l : reverse(layers)) { auto s = engine.backward(l); dx = l.backward(dx); }
///     auto report = engine.step(loss);       // every micro-step; optimizer runs at the GAS boundary
///   }
///
/// This file only wires parts together; each part is a file of its own (docs/architecture.md walks
/// one step through them):
///   engine/comms.hpp            the communicators by role: data group, hpZ groups, the norm's world
///   engine/registry.hpp         parameters and layers, identified once
///   zero/partitioner.hpp        the stage as types: gradient path, parameter path, ownership
///   engine/group.hpp, groups.hpp  one flat buffer family (layout + paths + state store), and both
///   engine/assemble.hpp         the groups built from the registry
///   engine/bindings.hpp         where each Param points (engine/values_resident.hpp, values_fetched.hpp)
///   engine/fetch_*.hpp          what a scope does for its layer's values: wait (stages 0-2), or
///                               gather, prefetch by the recorded order and release (stage 3)
///   engine/boundary_step.hpp    the boundary: exact global norm, scaler, clip, update, scheduler
///   engine/state_io.hpp, shards.hpp, checks.hpp   state, the shard table, the options' checks
///
/// Determinism: with the threads communicator, stages 0-3 give bitwise-identical parameters when they
/// reduce in the same schedule (every element sees the same reduction and update; the global norm is
/// exact, engine/boundary.hpp). On a grid whose tensor and pipeline groups hold the parameters whole,
/// the data group trains bit for bit as it would alone.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/device/concepts.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/engine/assemble.hpp"
#include "zerotk/engine/bindings.hpp"
#include "zerotk/engine/boundary_step.hpp"
#include "zerotk/engine/checks.hpp"
#include "zerotk/engine/comms.hpp"
#include "zerotk/engine/fetch_resident.hpp"
#include "zerotk/engine/fetch_sharded.hpp"
#include "zerotk/engine/group.hpp"
#include "zerotk/engine/groups.hpp"
#include "zerotk/engine/introspection.hpp"
#include "zerotk/engine/model_view.hpp"
#include "zerotk/engine/norm_share.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/engine/resolve.hpp"
#include "zerotk/engine/schedule.hpp"
#include "zerotk/engine/scopes.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/engine/slow_rank_monitor.hpp"
#include "zerotk/engine/sparsity.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/engine/state_api.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/version.hpp"

#if defined(__CUDACC__)
#include "zerotk/device/cuda_ops.cuh"
#endif

namespace zerotk {

template <class Pack>
class BasicEngine;

/// The engine type of a policy pack: the policies in any order, defaults spelled or not, name one
/// type, BasicEngine over the canonical pack (engine/resolve.hpp). An alias, so a function template
/// that wants any typed engine takes `BasicEngine<Pack>&` or a `TrainingEngine auto&`.
template <class... Ps>
using Engine = BasicEngine<engine::policies_t<Ps...>>;

template <class Pack>
class BasicEngine : public engine::Introspection<BasicEngine<Pack>>, public engine::StateAccess<BasicEngine<Pack>> {
  using R = engine::resolved_pack_t<Pack>;
  static_assert(R::compatible);

 public:
  // ---- the policies, resolved ------------------------------------------------------------------
  using partitioner = typename R::partitioner;
  using optimizer_policy = typename R::optimizer;
  using precision = typename R::precision;
  using storage_type = typename precision::storage;
  using bucketer = typename R::bucketer;
  using loss_scaler = typename R::loss_scaler;
  using offload = typename R::offload;
  using device = typename R::device;
  static constexpr int kStage = partitioner::stage;
  using precision_tag = typename precision::tag;
  using loss_scaler_tag = policy_tag_t<loss_scaler>;
  using optimizer_tag = policy_tag_t<optimizer_policy>;
  using offload_tag = typename offload::tag;
  using param_offload = typename R::param_offload;
  using param_offload_tag = typename param_offload::tag;
  using device_tag = typename device::tag;
  using gradient_compression = typename R::gradient_compression;
  /// None | TopK | TwoBit | Sign (config: gradient_compression.algorithm).
  using compression_tag = typename gradient_compression::tag;
  using sparsity = typename R::sparsity;
  /// None | NofM<N, M> (engine/sparsity.hpp).
  using sparsity_tag = typename sparsity::tag;
  using reduce_when = typename partitioner::when;
  /// Where the engine's buffers live and which kernels touch them (device/), checked against
  /// device::EngineOps where the Device tag selects it.
  using ops_type = ::zerotk::device::checked_ops_t<::zerotk::device::Ops<device_tag>>;
  template <class T>
  using Buffer = typename ops_type::template Buffer<T>;

 private:
  using S = storage_type;
  template <class T>
  using Group = engine::FlatGroup<T, partitioner, optimizer_policy, ops_type, typename R::store_tag,
                                  typename R::shard_tag, compression_tag>;
  using MainGroup = Group<S>;
  using Fp32Group = Group<float>;
  using GroupsT = engine::Groups<MainGroup, Fp32Group>;
  using Comms = engine::EngineComms<ops_type>;
  using Comm = typename Comms::Comm;
  using Bindings = engine::ParamBindings<GroupsT, ops_type>;
  using FetchCtx = engine::FetchContext<Bindings, GroupsT, Comm>;
  /// Parameters always in place (stages 0-2) or fetched per layer (stage 3): the stage selects the
  /// fetch schedule here, and nothing else in this file asks for it.
  using Fetch = std::conditional_t<MainGroup::Params::kResident, engine::ResidentFetch<FetchCtx>,
                                   engine::ShardedFetch<FetchCtx>>;
  using Sparse = engine::SparsityPart<sparsity_tag>;
  using Boundary = engine::BoundaryStep<GroupsT, loss_scaler, Comms, ops_type, Sparse>;
  using Store = typename MainGroup::Store;
  using Home = typename MainGroup::Params;

 public:
  /// Whether the state store keeps the master and the moments addressable in host memory (in-place
  /// views for master() and state_views(); Offload<Nvme> keeps them in a file).
  static constexpr bool kStateInHostMemory = Store::kStateInHostMemory;

  // ---- scopes (engine/scopes.hpp) -------------------------------------------------------------
  using ForwardScope = engine::ForwardScope<BasicEngine>;
  using BackwardScope = engine::BackwardScope<BasicEngine>;
  using GatherScope = engine::GatherScope<BasicEngine>;

  // ---- construction ----------------------------------------------------------------------------

  /// Registers every parameter of `model`, adopts the values they hold (EngineOptions::
  /// adopt_initial_values) and binds them into engine-owned storage; the fp32 master starts from
  /// those values. `comm` (the data-parallel group) and `model` must outlive the engine.
  /// Device<Cuda>: `comm` is a device-memory communicator with a stream (NcclCommunicator), the
  /// calling thread's current CUDA device is the communicator's, and the model computes on
  /// `options.stream`.
  template <comm::Communicator C, Module M>
  BasicEngine(C& comm, M& model, EngineOptions options = {})
      : BasicEngine(engine::EngineInputs<ops_type>::of(comm, model), std::move(options)) {
    static_assert_memory<C>();
  }

  /// The same over a process grid (comm/grid.hpp; collective over its world): ZeRO partitions,
  /// reduces and gathers over `grid.data()`; the gradient norm, the overflow agreement and the loss
  /// over every rank (engine/comms.hpp). `grid` must outlive the engine.
  template <comm::Communicator C, Module M>
  BasicEngine(comm::ProcessGrid<C>& grid, M& model, EngineOptions options = {})
      : BasicEngine(engine::EngineInputs<ops_type>::of(grid, model), std::move(options)) {
    static_assert_memory<C>();
  }

  /// The constructors' common part, over the model and the communicator with their types forgotten
  /// (engine/model_view.hpp, engine/placement.hpp): what a compiled engine (zerotk/engines.hpp,
  /// AnyEngine) is built from. Nothing in it depends on the user's types.
  BasicEngine(engine::EngineInputs<ops_type> inputs, EngineOptions options);

  BasicEngine(const BasicEngine&) = delete;
  BasicEngine& operator=(const BasicEngine&) = delete;
  ~BasicEngine();

  // ---- the training loop -------------------------------------------------------------------------

  /// Brackets a layer's forward. Stages 0-2 keep every parameter gathered; with
  /// `overlap_param_gather` this waits for the all-gather of the buckets holding the layer's
  /// parameters (and its external_parameters) if it is still in flight.
  /// Stage 3: gathers the buckets holding the layer's parameters (and its external_parameters),
  /// and prefetches the next layers' by the order recorded in the previous micro-step; the scope's
  /// end releases them (engine/fetch_sharded.hpp).
  template <Module L>
  ForwardScope forward(L& layer) {
    return forward(engine::layer_ref(layer));
  }
  ForwardScope forward(const engine::LayerRef& layer) {
    detail::Clock::time_point t0;
    const engine::ModuleId id = open_forward(layer, t0);
    return ForwardScope(this, id, t0);
  }

  /// Gives the parameters of `module` (any Module: a layer, or the whole model) their full values
  /// until the returned scope closes: for evaluation, export or initialisation (DeepSpeed's
  /// GatheredParameters). A collective: every rank opens and closes the same scopes. Stage 3 needs
  /// it to read parameters outside the layers' scopes; stages 0-2 only wait for gathers in flight.
  /// With `modifier_rank` (a rank of the data group), the values that rank holds when the scope
  /// closes become every rank's (its writes are kept, other ranks' discarded); call
  /// initialize_master() after writing initial values, as at construction. Without it, writes are
  /// undefined (stage 3 drops them).
  template <Module M>
  GatherScope gather(M& module, std::optional<int> modifier_rank = std::nullopt) {
    return gather(engine::layer_ref(module), modifier_rank);
  }
  GatherScope gather(const engine::LayerRef& module, std::optional<int> modifier_rank = std::nullopt) {
    const engine::ModuleId id = open_gather(module, modifier_rank);
    return GatherScope(this, id, modifier_rank);
  }

  /// Waits for every parameter all-gather still in flight (`overlap_param_gather`): after this every
  /// bound Param holds the current values. A no-op otherwise.
  void synchronize();

  /// Brackets a layer's backward: gradient storage for its parameters is ready (and zeroed when a new
  /// accumulation starts) when this returns; when the scope closes their gradients are complete and
  /// full buckets start reducing. Outside its scopes a parameter's gradient points at scratch memory.
  /// A layer may also name parameters it writes gradients into but another layer owns (a tied
  /// output head reusing the embedding): `external_parameters(visit)`. Their storage is made ready
  /// here too; they are reduced when their owner's scope closes, so the owner's backward must come
  /// later in the same micro-step.
  template <Module L>
  BackwardScope backward(L& layer) {
    return backward(engine::layer_ref(layer));
  }
  BackwardScope backward(const engine::LayerRef& layer) {
    const engine::ModuleId id = open_backward(layer);
    return BackwardScope(this, id);
  }

  /// The factor the trainer multiplies the loss (or the seed gradient) by before backward.
  double loss_scale() const { return scaler_.scale(); }

  /// What this engine is, at run time (the face's words for kStage, storage_type, optimizer_tag):
  /// what checkpoints record and compare, and what AnyEngine reports.
  static constexpr int stage() noexcept { return kStage; }
  static constexpr DType storage_dtype() noexcept { return dtype_of_v<storage_type>; }
  static constexpr std::string_view optimizer_name() noexcept { return optimizer_tag::name; }

  /// Ends a micro-step. At every `gradient_accumulation_steps`-th call this is the optimizer boundary:
  /// overflow check, scaler update, clipping, fused update, all-gather, scheduler
  /// (engine/boundary_step.hpp). Every parameter must have been in a backward scope during the
  /// micro-step (usage_error naming those that were not).
  StepReport step(double loss = 0.0);

  // ---- set-up helpers ----------------------------------------------------------------------------

  /// Makes every rank's parameters equal to rank `root`'s (a rank of the data group), after
  /// initialising values on one rank or with different seeds, then (re)initialises the fp32 master
  /// copy from them. Stage 3 refuses (it keeps one sharded copy: use gather(model, root)).
  void broadcast_parameters(int root = 0);

  /// Copies the (bound, user-written) parameter values into the fp32 master copy, without
  /// communication (every rank must hold the same values).
  void initialize_master();

  /// Whether the last micro-step's step() ended an accumulation (or none has run): the point where
  /// state(), load_state(), gather() and settle() may be called.
  bool at_boundary() const noexcept { return counters_.micro_in_accum == 0; }

  /// With `delayed_param_update`: waits for the optimizer step running beside the trainer and
  /// publishes its values, so the parameters are the master's again (until the next boundary
  /// starts another). state(), state_views() and checkpoints need it, and the end of training: the
  /// last step's update is otherwise never published. Only at a boundary; a no-op when nothing is
  /// in flight (and always without the option).
  void settle();

  /// Sets the learning-rate scheduler, stepped after every non-skipped update (DeepSpeed semantics).
  void set_scheduler(LrScheduler scheduler);

  /// Sparsity<NofM<N, M>>'s masks per group (engine/sparsity.hpp); Sparsity<None>: an empty part.
  const Sparse& sparsity_part() const noexcept { return sparse_; }

  /// What the run-time checker (engine/checks.hpp) reads of this engine type, derived from its
  /// members; engine::facts_of(combination, storage) gives the same without an engine type.
  static engine::EngineFacts facts() {
    constexpr bool shard_file =
        zero::FileWriter<std::remove_pointer_t<decltype(std::declval<Home&>().optimizer_out().base)>>;
    constexpr bool swapped = requires(const Store& st) { st.swap_file(); };
    return {dtype_of_v<S>, kStage, std::is_same_v<reduce_when, when::at_boundary>, MainGroup::kCanDelayUpdate,
            engine::on_device_v<device>(), shard_file, shard_file || swapped,
            engine::offload_policy_name<offload_tag>(), MainGroup::kCompressedExchange, Sparse::kOn};
  }

 private:
  template <class C>
  static constexpr void static_assert_memory() {
    static_assert(::zerotk::comm::uses_device_memory<C> == engine::on_device_v<device>(),
                  "Engine: Device<Host> needs a host-memory communicator (threads, MPI), Device<Cuda> a device one "
                  "(NcclCommunicator), Device<HostAsync> comm::StreamCommunicator");
  }

  engine::ParamRegistry::Rules registry_rules() const {
    engine::ParamRegistry::Rules r;
    r.storage = dtype_of_v<S>;
    r.keep_fp32 = options_.keep_fp32;
    r.group_of = options_.group_of;
    r.optimizer_groups = options_.groups.size();
    r.fp32_module_types = options_.fp32_module_types;
    r.tensor_split = options_.tensor_split;
    r.expert = options_.expert;
    Fetch::registry_rules(r, options_.stage3);
    return r;
  }

  /// Groups, views, adoption of the initial values, bindings, master, fetch schedule, boundary.
  void build();
  /// broadcast_parameters and gather's modifier_rank: a usage_error naming `where` when expert
  /// parameters live apart from the data group (engine/engine_members.hpp).
  void refuse_experts_apart(const char* where, int root) const;

  friend ForwardScope;
  friend BackwardScope;
  friend GatherScope;
  template <class>
  friend class engine::ErasedEngineOf;  // AnyEngine's model: opens scopes that AnyEngine's guards close

  // The scopes' engine side (engine/engine_members.hpp): open_* does what the scope's start does and
  // returns the layer's id; the guard's destructor calls end_*.
  engine::ModuleId open_forward(const engine::LayerRef& layer, detail::Clock::time_point& t0);
  engine::ModuleId open_backward(const engine::LayerRef& layer);
  engine::ModuleId open_gather(const engine::LayerRef& module, std::optional<int> modifier_rank);
  friend class engine::Introspection<BasicEngine>;
  friend class engine::StateAccess<BasicEngine>;

  void end_forward(engine::ModuleId id, detail::Clock::time_point t0);
  void end_backward(engine::ModuleId id, detail::Clock::time_point t0);

  void close_scope(engine::ModuleId id, engine::Phase phase) {
    if (std::uncaught_exceptions() == 0) {
      fetch_->after(registry_.module_entry(id), phase);
      return;
    }
    try {  // unwinding: give the buckets back, keep the first error
      fetch_->after(registry_.module_entry(id), phase);
    } catch (...) {
    }
  }

  void end_gather(engine::ModuleId id, std::optional<int> modifier_rank);

  /// Throws unless every update has been published (state() and its views read the master).
  void require_settled(const char* what) const {
    if (groups_.update_pending()) {
      throw usage_error("a delayed parameter update is in flight; call settle() first (it publishes the update, so "
                        "the next forward sees it)",
                        std::string("Engine::") + what, "delayed_param_update");
    }
  }

  void require_boundary(const char* what) const {
    if (counters_.micro_in_accum != 0) {
      throw usage_error("only at an optimizer boundary (after the last micro-step's step())",
                        std::string("Engine::") + what,
                        std::to_string(counters_.micro_in_accum) + " of " +
                            std::to_string(options_.gradient_accumulation_steps) + " micro-steps done");
    }
  }

  // ---- members -----------------------------------------------------------------------------------
  EngineOptions options_;
  ops_type ops_;
  Comms comms_;
  loss_scaler scaler_;
  MemoryLedger ledger_;
  engine::ParamRegistry registry_;
  engine::Schedule schedule_;
  GroupsT groups_;
  std::optional<Bindings> bindings_;
  std::optional<Fetch> fetch_;
  Sparse sparse_;
  std::optional<Boundary> boundary_;
  engine::StepCounters counters_;
  engine::SlowRankMonitor<Comm> slow_;
  StepTimings timings_;
  engine::TrafficMarks traffic_;
};

}  // namespace zerotk

// The members that carry the weight, defined out of class.
#include "zerotk/engine/engine_members.hpp"
