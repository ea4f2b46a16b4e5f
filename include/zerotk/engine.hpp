#pragma once
/// \file zerotk/engine.hpp
/// Engine<Policies...>: data-parallel training with ZeRO stages 0, 1, 2 and 3 over the user's own model.
///
///   using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                                 zerotk::Precision<zerotk::fp16>>;        // any order; others defaulted
///   init_weights(model);                       // DeepSpeed's order: initialise, then wrap
///   Engine engine(comm, model, options);       // adopts the values, binds every parameter into engine storage
///   for (micro-step) {
///     for (auto& l : layers)          { auto s = engine.forward(l);  x = l.forward(x); }
///     // seed backward with engine.loss_scale()
///     for (auto& l : reverse(layers)) { auto s = engine.backward(l); dx = l.backward(dx); }
///     auto report = engine.step(loss);       // every micro-step; optimizer runs at the GAS boundary
///   }
///
/// This file only wires parts together; each part is a file of its own (docs/architecture.md walks
/// one step through them):
///   engine/registry.hpp         parameters and layers, identified once
///   zero/partitioner.hpp        the stage as types: a gradient path (zero/grads/) and a parameter
///                               path (zero/params/) per stage and reduction schedule
///   engine/group.hpp            one flat buffer family: layout + paths + state store (offload/)
///   zero/float_view.hpp         float Params over 16-bit storage (emulated 16-bit; stage 3:
///                               zero/fetched_float_view.hpp, float copies of gathered buckets only)
///   device/                     Ops<Device>: buffers and kernels by memory space; OrderedCommunicator
///   engine/fetch_*.hpp          what a scope does for its layer's values: wait (stages 0-2), or
///                               gather, prefetch by the recorded order and release (stage 3)
///   engine/boundary.hpp         the exact global norm; engine/state.hpp, engine/report.hpp
///
/// Determinism: with the threads communicator, stages 0, 1, 2 and 3 produce bitwise-identical
/// parameters when they reduce in the same schedule (stages 0 and 1 with when::every_micro_step, or no
/// gradient accumulation): every element sees the same reduction and the same per-element update, and the
/// global norm is exact on a grid (engine/boundary.hpp), whatever the partitioning.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/param.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/engine/boundary.hpp"
#include "zerotk/engine/fetch_resident.hpp"
#include "zerotk/engine/fetch_sharded.hpp"
#include "zerotk/engine/group.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/bindings.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/resolve.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/engine/report.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/offload/nvme_layout.hpp"
#include "zerotk/optim/clip.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/version.hpp"
#include "zerotk/zero/partitioner.hpp"

#if defined(__CUDACC__)
#include "zerotk/device/cuda_ops.cuh"
#endif

namespace zerotk {


template <class... Ps>
class Engine {
  using R = engine::Resolved<Ps...>;
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
  using reduce_when = typename partitioner::when;
  /// Where the engine's buffers live and which kernels touch them (device/).
  using ops_type = ::zerotk::device::Ops<device_tag>;
  template <class T>
  using Buffer = typename ops_type::template Buffer<T>;
  /// Whether the state store keeps the master and the moments addressable in host memory (in-place
  /// views for master() and state_views(); Offload<Nvme> keeps them in a file).
  static constexpr bool kStateInHostMemory = ::zerotk::offload::StoreOf<typename R::store_tag>::template type<
      optimizer_policy, ops_type>::kStateInHostMemory;

  // ---- scopes ----------------------------------------------------------------------------------
  class [[nodiscard]] ForwardScope {
   public:
    ~ForwardScope() noexcept(false) {
      e_->close_scope(m_, engine::Phase::forward);
      e_->timings_.forward_ms += detail::ms_since(t0_);
    }
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

   private:
    friend class Engine;
    ForwardScope(Engine* e, engine::ModuleId m, detail::Clock::time_point t0) : e_(e), m_(m), t0_(t0) {}
    Engine* e_;
    engine::ModuleId m_;
    detail::Clock::time_point t0_;
  };

  /// Engine::gather's scope: the module's parameters hold their full values until it closes.
  class [[nodiscard]] GatherScope {
   public:
    ~GatherScope() noexcept(false) { e_->end_gather(m_, modifier_rank_); }
    GatherScope(const GatherScope&) = delete;
    GatherScope& operator=(const GatherScope&) = delete;

   private:
    friend class Engine;
    GatherScope(Engine* e, engine::ModuleId m, std::optional<int> modifier_rank)
        : e_(e), m_(m), modifier_rank_(modifier_rank) {}
    Engine* e_;
    engine::ModuleId m_;
    std::optional<int> modifier_rank_;
  };

  class [[nodiscard]] BackwardScope {
   public:
    ~BackwardScope() noexcept(false) {
      e_->timings_.backward_inner_ms += detail::ms_since(t0_);
      if (std::uncaught_exceptions() == 0) e_->bindings_->end_backward(e_->registry_.module_entry(m_).own);
      e_->close_scope(m_, engine::Phase::backward);
      e_->timings_.backward_ms += detail::ms_since(t0_);
    }
    BackwardScope(const BackwardScope&) = delete;
    BackwardScope& operator=(const BackwardScope&) = delete;

   private:
    friend class Engine;
    BackwardScope(Engine* e, engine::ModuleId m) : e_(e), m_(m), t0_(detail::Clock::now()) {}
    Engine* e_;
    engine::ModuleId m_;
    detail::Clock::time_point t0_;
  };

  // ---- construction ----------------------------------------------------------------------------

  /// Registers every parameter of `model`, adopts the values they hold (EngineOptions::
  /// adopt_initial_values) and binds them into engine-owned storage; the fp32 master starts from
  /// those values. `comm` and `model` must outlive the engine. Device<Cuda>: `comm` is a
  /// device-memory communicator with a stream (NcclCommunicator), the calling thread's current CUDA
  /// device is the communicator's, and the model computes on `options.stream`.
  template <comm::Communicator C, Module M>
  Engine(C& comm, M& model, EngineOptions options = {})
      : options_(checked(std::move(options))),
        ops_(ops_type::create(comm, options_.stream)),
        comm_(comm, ops_),
        scaler_(options_.loss_scaler),
        registry_(model, registry_rules()) {
    static_assert(::zerotk::comm::uses_device_memory<C> == device::is_cuda,
                  "Engine: Device<Host> needs a host-memory communicator (threads, MPI) and Device<Cuda> a "
                  "device-memory one (NcclCommunicator)");
    build();
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() {
    for_each_group([](auto& g) { g.drain_quietly(); });
  }

  // ---- the training loop -------------------------------------------------------------------------

  /// Brackets a layer's forward. Stages 0-2 keep every parameter gathered; with
  /// `overlap_param_gather` this waits for the all-gather of the buckets holding the layer's
  /// parameters (and its external_parameters) if it is still in flight.
  /// Stage 3: gathers the buckets holding the layer's parameters (and its external_parameters),
  /// and prefetches the next layers' by the order recorded in the previous micro-step; the scope's
  /// end releases them (engine/fetch_sharded.hpp).
  template <Module L>
  ForwardScope forward(L& layer) {
    const auto t0 = detail::Clock::now();  // waiting for parameters counts as forward time
    const engine::ModuleId id = registry_.module(layer);
    fetch_->before(registry_.module_entry(id), engine::Phase::forward);
    return ForwardScope(this, id, t0);
  }

  /// Gives the parameters of `module` (any Module: a layer, or the whole model) their full values
  /// until the returned scope closes: for evaluation, export or initialisation (DeepSpeed's
  /// GatheredParameters). A collective: every rank opens and closes the same scopes. Stage 3 needs
  /// it to read parameters outside the layers' scopes; stages 0-2 only wait for gathers in flight.
  /// With `modifier_rank`, the values rank `modifier_rank` holds when the scope closes become every
  /// rank's (its writes are kept, other ranks' discarded); call initialize_master() after writing
  /// initial values, as at construction. Without it, writes are undefined (stage 3 drops them).
  template <Module M>
  GatherScope gather(M& module, std::optional<int> modifier_rank = std::nullopt) {
    if (modifier_rank && (*modifier_rank < 0 || *modifier_rank >= world_size())) {
      throw usage_error("modifier_rank must be a rank of the communicator", "Engine::gather",
                        std::to_string(*modifier_rank) + " of " + std::to_string(world_size()));
    }
    require_boundary("gather");
    synchronize();
    const engine::ModuleId id = registry_.module(module);
    fetch_->hold(registry_.module_entry(id));
    return GatherScope(this, id, modifier_rank);
  }

  /// Waits for every parameter all-gather still in flight (`overlap_param_gather`): after this every
  /// bound Param holds the current values. A no-op otherwise.
  void synchronize() {
    for_each_group([](auto& g) { g.params().synchronize(); });
  }

  /// Brackets a layer's backward: gradient storage for its parameters is ready (and zeroed when a new
  /// accumulation starts) when this returns; when the scope closes their gradients are complete and
  /// full buckets start reducing. Outside its scopes a parameter's gradient points at scratch memory.
  /// A layer may also name parameters it writes gradients into but another layer owns (a tied
  /// output head reusing the embedding): `external_parameters(visit)`. Their storage is made ready
  /// here too; they are reduced when their owner's scope closes, so the owner's backward must come
  /// later in the same micro-step.
  template <Module L>
  BackwardScope backward(L& layer) {
    const engine::ModuleId id = registry_.module(layer);
    const engine::ModuleEntry& m = registry_.module_entry(id);
    fetch_->before(m, engine::Phase::backward);
    bindings_->begin_backward(m.own, micro_in_accum_ == 0);
    bindings_->begin_backward(m.external, micro_in_accum_ == 0);
    return BackwardScope(this, id);
  }

  /// The factor the trainer multiplies the loss (or the seed gradient) by before backward.
  double loss_scale() const { return scaler_.scale(); }

  /// Ends a micro-step. At every `gradient_accumulation_steps`-th call this is the optimizer boundary:
  /// overflow check, scaler update, clipping, fused update, all-gather, scheduler. Every parameter
  /// must have been in a backward scope during the micro-step (usage_error naming those that were not).
  StepReport step(double loss = 0.0) {
    bindings_->check_every_parameter_had_backward(micro_steps_ + 1);
    const bool first = micro_in_accum_ == 0;
    const bool boundary = micro_in_accum_ + 1 == options_.gradient_accumulation_steps;
    const auto t0 = detail::Clock::now();
    try {
      fetch_->end_micro_step(micro_steps_ + 1);
      for_each_group([&](auto& g) { g.end_micro_step(boundary, first); });
    } catch (const comm_error& e) {
      fetch_->rethrow_with_order(e);
    }
    loss_sum_ += loss;
    ++micro_in_accum_;
    ++micro_steps_;
    bindings_->end_micro_step();
    timings_.backward_allreduce_ms += detail::ms_since(t0);

    StepReport r;
    r.micro_steps = micro_steps_;
    if (boundary) {
      const auto ts = detail::Clock::now();
      try {
        boundary_step(r);
      } catch (...) {  // an abandoned update (boundary_step put the state back): the next step starts afresh
        micro_in_accum_ = 0;
        loss_sum_ = 0;
        throw;
      }
      timings_.step_ms += detail::ms_since(ts);
      r.timings = std::exchange(timings_, StepTimings{});
      r.timings_measured = true;
      const std::uint64_t wire =
          comm_.stats().total_wire_bytes() + (group_comm_ ? group_comm_->stats().total_wire_bytes() : 0);
      std::uint64_t dense = wire;
      for_each_group([&](const auto& g) { dense += g.replaced_dense_bytes() - g.replacement_wire_bytes(); });
      r.comm_wire_bytes = wire - wire_mark_;
      r.comm_dense_bytes = dense - dense_mark_;
      wire_mark_ = wire;
      dense_mark_ = dense;
      micro_in_accum_ = 0;
      loss_sum_ = 0;
    }
    r.global_steps = global_steps_;
    r.skipped_steps = skipped_steps_;
    r.loss_scale = scaler_.scale();
    fetch_->ready_next();
    return r;
  }

  // ---- set-up helpers ----------------------------------------------------------------------------

  /// Makes every rank's parameters equal to rank `root`'s (after initialising values on one rank or
  /// with different seeds), then (re)initialises the fp32 master copy from them.
  void broadcast_parameters(int root = 0) {
    if constexpr (!kResident) {
      throw usage_error("ZeRO stage 3 keeps one sharded copy of the parameters, so there is no rank's copy to "
                        "broadcast: write initial values inside `auto g = engine.gather(model, root);` (rank root's "
                        "writes are kept) and call initialize_master()",
                        "Engine::broadcast_parameters", std::to_string(root));
    } else {
      synchronize();
      for_each_group([](auto& g) { g.supersede_update(); });
      bindings_->take_user_values();
      for_each_group([&](auto& g) {
        using T = typename std::remove_cvref_t<decltype(g)>::value_type;
        comm_.broadcast(g.params().params(), g.layout().flat_numel(), dtype_of_v<T>, root).wait();
        bindings_->on_group_replaced(g);
        g.init_master();
      });
    }
  }

  /// Copies the (bound, user-written) parameter values into the fp32 master copy, without
  /// communication (every rank must hold the same values).
  void initialize_master() {
    synchronize();
    for_each_group([](auto& g) { g.supersede_update(); });
    bindings_->take_user_values();
    for_each_group([](auto& g) { g.init_master(); });
  }

  /// Whether the last micro-step's step() ended an accumulation (or none has run): the point where
  /// state(), load_state(), gather() and settle() may be called.
  bool at_boundary() const noexcept { return micro_in_accum_ == 0; }

  /// With `delayed_param_update`: waits for the optimizer step running beside the trainer and
  /// publishes its values, so the parameters are the master's again (until the next boundary
  /// starts another). state(), state_views() and checkpoints need it, and the end of training: the
  /// last step's update is otherwise never published. Only at a boundary; a no-op when nothing is
  /// in flight (and always without the option).
  void settle() {
    require_boundary("settle");
    for_each_group([&](auto& g) { g.settle([this, &g](std::size_t k) { bindings_->on_bucket_published(g, k); }); });
  }

  /// Sets the learning-rate scheduler, stepped after every non-skipped update (DeepSpeed semantics).
  void set_scheduler(LrScheduler scheduler) {
    scheduler_ = std::move(scheduler);
    apply_schedule();
  }

  // ---- state -------------------------------------------------------------------------------------

  /// Everything training depends on (engine/state.hpp), taken at an optimizer boundary.
  EngineState state() const {
    EngineState s = scalar_state();
    for_each_group([&](const auto& g) {
      EngineGroupState gs;
      gs.master.resize(g.store().owned_numel());
      g.store().master_to_host(gs.master.data());
      gs.optimizer = g.store().optimizer_state();
      gs.rank_local = g.rank_local();
      s.groups.push_back(std::move(gs));
    });
    return s;
  }

  /// The counters, loss scaler and scheduler of state(), without the per-group buffers.
  EngineState scalar_state() const {
    require_boundary("state");
    require_settled("state");
    EngineState s;
    s.micro_steps = micro_steps_;
    s.global_steps = global_steps_;
    s.skipped_steps = skipped_steps_;
    s.scaler = scaler_.state();
    if (scheduler_) s.scheduler = scheduler_->state();
    return s;
  }

  /// The groups of state() viewed in place, without copies (host-accessible spaces): valid until the
  /// engine steps or loads. A synchronous checkpoint save writes from these.
  std::vector<EngineGroupView> state_views() const
    requires ops_type::Space::host_accessible && kStateInHostMemory
  {
    require_boundary("state_views");
    require_settled("state_views");
    std::vector<EngineGroupView> out;
    for_each_group([&](const auto& g) {
      const auto& st = g.store();
      EngineGroupView view{st.optimizer().step_count(), std::span<const float>(st.master(), st.owned_numel()),
                           st.exp_avg(), st.exp_avg_sq(), false, {}, {}, {}, {}, nullptr};
      if constexpr (requires { st.optimizer().fresh_variance(); }) {  // 1-bit LAMB: v_f and its scalars
        const auto& opt = st.optimizer();
        view.fresh = true;
        view.v_fresh = std::span<const float>(opt.fresh_variance(), opt.buffer_numel());
        view.tensor_scalars = opt.encoded_tensor_states();
      }
      view.own_rank_local(g.rank_local());  // gathered from several buffers: the one copy
      out.push_back(std::move(view));
    });
    return out;
  }

  /// Restores a state taken from an engine of the same structure on the same rank of the same world
  /// size, at a boundary; the parameters become the restored master, rounded and published.
  void load_state(const EngineState& s) {
    require_boundary("load_state");
    for_each_group([](auto& g) { g.supersede_update(); });
    std::size_t i = 0, groups = 0;
    for_each_group([&](const auto&) { ++groups; });
    if (s.groups.size() != groups) {
      throw usage_error("state has another number of parameter groups", "Engine::load_state",
                        std::to_string(s.groups.size()) + " for " + std::to_string(groups));
    }
    if (s.scheduler.has_value() != scheduler_.has_value()) {
      throw usage_error(s.scheduler ? "state has a scheduler's state, and this engine has no scheduler (set_scheduler first)"
                                    : "state has no scheduler's state, and this engine has a scheduler",
                        "Engine::load_state");
    }
    for_each_group([&](auto& g) {
      const EngineGroupState& gs = s.groups[i++];
      if (gs.master.size() != g.store().owned_numel()) {
        throw usage_error("state is for a partition of another size (another model, world size or stage?)",
                          "Engine::load_state", std::to_string(gs.master.size()) + " for " +
                                                    std::to_string(g.store().owned_numel()) + " elements");
      }
      optim::check_state(gs.optimizer, g.store().owned_numel(), "Engine::load_state");
      optim::check_extra(g.store().optimizer(), gs.optimizer, "Engine::load_state");
      if (!gs.rank_local.empty() && size_of(gs.rank_local) != g.rank_local_size()) {
        const RankLocalSize want = g.rank_local_size(), got = size_of(gs.rank_local);
        throw usage_error("state's rank-local part (error feedback) is of another size: another world size, layout or "
                          "compression? (clear it to start it from zero)",
                          "Engine::load_state",
                          std::to_string(got.values) + " values + " + std::to_string(got.scalars) + " scalars for " +
                              std::to_string(want.values) + " + " + std::to_string(want.scalars));
      }
    });
    i = 0;
    for_each_group([&](auto& g) {
      const EngineGroupState& gs = s.groups[i++];
      g.store().load_optimizer_state(gs.optimizer);
      g.after_state_loaded(gs.rank_local);
      g.store().master_from_host(gs.master.data());
      g.restore_params_from_master([&](std::size_t k) { bindings_->on_bucket_published(g, k); });
    });
    scaler_.load_state(s.scaler);
    if (s.scheduler && scheduler_) scheduler_->load_state(*s.scheduler);
    apply_schedule();
    micro_steps_ = s.micro_steps;
    global_steps_ = s.global_steps;
    skipped_steps_ = s.skipped_steps;
    synchronize();
  }

  /// Where every parameter's master and optimizer state live on every rank (engine/shards.hpp):
  /// the same on every rank, computed from the layouts without communication.
  engine::ShardTable shard_table() const {
    engine::ShardTable t;
    std::uint32_t index[2] = {0, 0};  // flat group index of GroupKind::main, ::fp32
    for_each_group([&](const auto& g) {
      constexpr bool partitioned = std::remove_cvref_t<decltype(g)>::kPartitioned;
      index[std::is_same_v<typename std::remove_cvref_t<decltype(g)>::value_type, S> ? 0 : 1] =
          static_cast<std::uint32_t>(t.fragments.size());
      auto& per_rank = t.fragments.emplace_back();
      auto& owned = t.owned_numel.emplace_back();
      for (int r = 0; r < world_size(); ++r) {
        per_rank.push_back(g.layout().fragments(r, partitioned));
        for (zero::Fragment& f : per_rank.back()) f.param = g.member(f.param);
        owned.push_back(partitioned ? g.layout().partition_numel() : g.layout().flat_numel());
      }
    });
    for (const engine::ParamEntry& e : registry_.entries()) {
      engine::ShardParam p;
      p.name = e.name;
      p.shape.assign(e.shape.begin(), e.shape.end());
      p.numel = e.numel;
      p.dtype = std::string(to_string(e.value_dtype));
      p.group = index[e.group == engine::GroupKind::main ? 0 : 1];
      p.optimizer_group = e.optimizer_group;
      t.params.push_back(std::move(p));
    }
    return t;
  }

  // ---- introspection -----------------------------------------------------------------------------

  const MemoryLedger& memory() const noexcept { return ledger_; }
  /// The ledger, to record memory the trainer owns (its activations: activation::Meter).
  MemoryLedger& memory() noexcept { return ledger_; }
  const comm::CommStats& comm_stats() const { return comm_.stats(); }
  /// Stage 3 with hpZ (`Stage3Options::reshard_after_forward` = group(g), g > 1): the byte counters
  /// of this rank's group communicator, which carries the backward's gathers; null without hpZ.
  const comm::CommStats* group_comm_stats() const { return group_comm_ ? &group_comm_->stats() : nullptr; }
  /// OffloadParams<Nvme>: fetches whose block was read ahead, fetches that read it themselves and
  /// fetches served from the blocks kept in host memory (max_in_cpu), over both groups since
  /// construction (a high second count asks for a larger `offload_param.buffer_count`;
  /// docs/offload.md).
  zerotk::offload::ParamReadStats param_read_stats() const
    requires std::is_same_v<typename R::shard_tag, Nvme>
  {
    zerotk::offload::ParamReadStats s;
    if (main_) s += main_->params().home().stats();
    if (f32_) s += f32_->params().home().stats();
    return s;
  }
  /// OffloadParams<Nvme>: host bytes of the shard's blocks kept in memory instead of the file
  /// (max_in_cpu; two copies of each). Also in memory()'s pinned host params16.
  std::size_t param_bytes_in_cpu() const
    requires std::is_same_v<typename R::shard_tag, Nvme>
  {
    return (main_ ? main_->params().home().held_bytes() : 0) + (f32_ ? f32_->params().home().held_bytes() : 0);
  }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  std::int64_t global_steps() const noexcept { return global_steps_; }
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }
  const loss_scaler& scaler() const noexcept { return scaler_; }
  loss_scaler& scaler() noexcept { return scaler_; }
  const EngineOptions& options() const noexcept { return options_; }
  /// Parameter all-gathers (buckets) still in flight; non-zero only with overlap_param_gather.
  std::size_t pending_gathers() const noexcept {
    std::size_t n = 0;
    for_each_group([&](const auto& g) { n += g.pending_publications(); });
    return n;
  }
  /// Total parameter elements of the model (Psi), padding excluded.
  std::size_t parameter_count() const noexcept { return registry_.parameter_count(); }
  /// The element type the engine keeps each parameter in, in the model's visiting order: the
  /// training precision's storage type, or fp32 for parameters kept in fp32 (a float Param over
  /// 16-bit storage reports the 16-bit type).
  std::vector<DType> stored_dtypes() const {
    std::vector<DType> out;
    for (const engine::ParamEntry& e : registry_.entries()) {
      out.push_back(e.group == engine::GroupKind::main ? dtype_of_v<S> : DType::fp32);
    }
    return out;
  }
  /// Padded element counts of the flat buffers (main precision and the fp32-kept group).
  std::size_t flat_numel() const noexcept {
    std::size_t n = 0;
    for_each_group([&](const auto& g) { n += g.layout().flat_numel(); });
    return n;
  }
  std::size_t bucket_count() const noexcept {
    std::size_t n = 0;
    for_each_group([&](const auto& g) { n += g.layout().buckets().size(); });
    return n;
  }
  /// Learning rate of parameter group `g` for the next update.
  double lr(std::size_t g = 0) const { return options_.groups[g].options.lr; }
  /// The fp32 master copy this rank owns (stage 0: everything, flat layout; 1/2: its partition), of
  /// the working-precision group. Host memory only.
  std::span<const float> master() const noexcept
    requires ops_type::Space::host_accessible && kStateInHostMemory
  {
    return main_ ? std::span<const float>(main_->store().master(), main_->store().owned_numel()) : std::span<const float>();
  }
  /// Offload<Nvme>: how each group's swap file is read and written (its path, O_DIRECT or buffered,
  /// io_uring or the pread/pwrite pool), the working-precision group first.
  std::vector<::zerotk::io::SwapFileInfo> swap_files() const
    requires std::is_same_v<offload_tag, Nvme>
  {
    std::vector<::zerotk::io::SwapFileInfo> out;
    for_each_group([&](const auto& g) { out.push_back(g.store().swap_file().info()); });
    return out;
  }

 private:
  using S = storage_type;
  using Opt = optimizer_policy;
  using Part = partitioner;
  using MainGroup =
      engine::FlatGroup<S, Part, Opt, ops_type, typename R::store_tag, typename R::shard_tag, compression_tag>;
  using Fp32Group =
      engine::FlatGroup<float, Part, Opt, ops_type, typename R::store_tag, typename R::shard_tag, compression_tag>;
  using Bindings = engine::ParamBindings<MainGroup, Fp32Group, ops_type>;
  using Comm = ::zerotk::device::OrderedCommunicator<ops_type>;
  using FetchCtx = engine::FetchContext<Bindings, MainGroup, Fp32Group, Comm>;
  /// Whether parameters are always in place (stages 0-2) or fetched per layer (stage 3).
  static constexpr bool kResident = MainGroup::Params::kResident;
  using Fetch = std::conditional_t<kResident, engine::ResidentFetch<FetchCtx>, engine::ShardedFetch<FetchCtx>>;

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

  void end_gather(engine::ModuleId id, std::optional<int> modifier_rank) {
    const engine::ModuleEntry& m = registry_.module_entry(id);
    if (std::uncaught_exceptions() > 0) {
      try {
        fetch_->unhold(m);
      } catch (...) {
      }
      return;
    }
    if (modifier_rank) keep_writes(m, *modifier_rank);
    fetch_->unhold(m);
  }

  /// Rank `root`'s values of the buckets holding m's parameters become every rank's (stage 3: each
  /// rank's block goes back into its shard).
  void keep_writes(const engine::ModuleEntry& m, int root) {
    bindings_->take_user_values();
    for_each_group([&](auto& g) {
      using T = typename std::remove_cvref_t<decltype(g)>::value_type;
      std::vector<char> seen(g.layout().buckets().size(), 0);
      auto visit = [&](const std::vector<engine::ParamId>& ids) {
        for (engine::ParamId id : ids) {
          const engine::ParamEntry& e = registry_[id];
          if ((e.group == engine::GroupKind::main) != std::is_same_v<std::remove_cvref_t<decltype(g)>, MainGroup>) continue;
          const std::size_t k = g.layout().param(e.local).bucket;
          if (seen[k]) continue;
          seen[k] = 1;
          const zero::Bucket& b = g.layout().buckets()[k];
          T* values = g.params().values(k);
          comm_.broadcast(values, b.numel, dtype_of_v<T>, root).wait();
          if constexpr (!kResident) {
            g.params().write_owned(k, [&](T* block) { ops_.copy(values + static_cast<std::size_t>(rank()) * b.block, block, b.block); });
          }
          bindings_->on_bucket_published(g, k);
        }
      };
      visit(m.own);
      visit(m.external);
    });
  }

  /// `param_max_in_cpu`: what is left of `offload_param.max_in_cpu` for this group (one budget over
  /// both groups, below).
  ::zerotk::offload::StoreOptions store_options(const char* name, std::size_t param_max_in_cpu) const {
    ::zerotk::offload::StoreOptions s;
    s.sub_group_size = options_.sub_group_size;
    s.rank = comm_.rank();
    s.name = name;
    s.nvme = options_.nvme;
    s.param_nvme = options_.param_nvme;
    s.param_nvme.max_in_cpu = param_max_in_cpu;
    s.output_writer = std::is_same_v<typename R::shard_tag, Nvme>;
    return s;
  }

  static EngineOptions checked(EngineOptions o) {
    if (o.gradient_accumulation_steps < 1) {
      throw config_error("must be >= 1", "gradient_accumulation_steps", std::to_string(o.gradient_accumulation_steps));
    }
    if (!(o.gradient_clipping >= 0) || !std::isfinite(o.gradient_clipping)) {
      throw config_error("must be finite and >= 0", "gradient_clipping", to_text(o.gradient_clipping));
    }
    if (o.bucket_buffers < 1) throw config_error("must be >= 1", "bucket_buffers", std::to_string(o.bucket_buffers));
    if (o.sub_group_size < 1) throw config_error("must be >= 1", "zero_optimization.sub_group_size", "0");
    if (o.stage3.reshard_after_forward.group_size() < 0) {
      throw config_error("must be >= 1 (1: hpZ off)", "zero_optimization.zero_hpz_partition_size",
                         std::to_string(o.stage3.reshard_after_forward.group_size()));
    }
    if (o.delayed_param_update_start < 0) {
      throw config_error("must be >= 0 (optimizer steps taken immediately first)", "delayed_param_update_start",
                         std::to_string(o.delayed_param_update_start));
    }
    if (o.delayed_param_update) {
      if constexpr (!MainGroup::kCanDelayUpdate) {
        throw config_error(std::string("needs Offload<Cpu> (offload_optimizer.device cpu): the delayed update runs the "
                                       "host optimizer step beside the next forward and backward; this engine has "
                                       "Offload<") + (std::is_same_v<offload_tag, Nvme> ? "Nvme" : "None") + ">",
                           "delayed_param_update", "true");
      } else if constexpr (device::is_cuda) {
        throw config_error("with Device<Cuda> is not available yet (not yet run on a GPU); use Device<Host>",
                           "delayed_param_update", "true");
      } else if constexpr (std::is_same_v<typename R::shard_tag, Nvme>) {
        throw config_error("with OffloadParams<Nvme> is not available: the delayed update writes a step's values "
                           "into the shard file after its state has stepped, so a failed write could not be "
                           "undone; use OffloadParams<Cpu> or OffloadParams<None>",
                           "delayed_param_update", "true");
      }
    }
    if (o.groups.empty()) o.groups.push_back(ParamGroup{o.optimizer});
    if (o.grad_accum_dtype) {
      const DType a = *o.grad_accum_dtype, w = dtype_of_v<S>;
      if (a != DType::fp32 && a != w) {
        throw config_error("must be fp32 or the training precision (" + std::string(to_string(w)) + ")",
                           "data_types.grad_accum_dtype", std::string(to_string(a)));
      }
      if (a == DType::fp32 && w != DType::fp32 && std::is_same_v<reduce_when, when::at_boundary> &&
          o.gradient_accumulation_steps > 1) {
        throw config_error("fp32 accumulation of 16-bit gradients needs them reduced every micro-step: use "
                           "Partitioner<Stage<" + std::to_string(kStage) + ">, when::every_micro_step> (or stage 2)",
                           "data_types.grad_accum_dtype", "fp32");
      }
    }
    return o;
  }

  engine::ParamRegistry::Rules registry_rules() const {
    engine::ParamRegistry::Rules r;
    r.storage = dtype_of_v<S>;
    r.keep_fp32 = options_.keep_fp32;
    r.group_of = options_.group_of;
    r.optimizer_groups = options_.groups.size();
    r.fp32_module_types = options_.fp32_module_types;
    if constexpr (partitioner::partitions_parameters) {
      r.partitioned_module_types = options_.stage3.partitioned_module_types;
      r.replicated_module_types = options_.stage3.replicated_module_types;
    }
    return r;
  }

  zero::PathContext<ops_type> path_context(bool accumulate_fp32) {
    zero::PathContext<ops_type> c;
    c.ops = &ops_;
    c.comm = &comm_;
    c.group_comm = group_comm_ ? &*group_comm_ : nullptr;
    c.ledger = &ledger_;
    c.gradient_accumulation_steps = options_.gradient_accumulation_steps;
    c.overlap_comm = options_.overlap_comm;
    c.bucket_buffers = options_.bucket_buffers;
    c.accumulate_fp32 = accumulate_fp32;
    c.compression = &options_.compression;
    return c;
  }

  std::size_t bucket_numel(std::size_t elem_bytes) const {
    const std::size_t bytes = options_.bucket_bytes ? options_.bucket_bytes : bucketer::bytes;
    return std::max<std::size_t>(1, bytes / elem_bytes);
  }

  /// Groups, views, adoption of the initial values, bindings, master.
  void build() {
    if constexpr (partitioner::partitions_parameters) make_group_comm();
    engine::GroupMembers main, f32;
    std::size_t persistent_numel = 0;
    for (engine::ParamId i = 0; i < registry_.size(); ++i) {
      const engine::ParamEntry& e = registry_[i];
      auto& m = e.group == engine::GroupKind::main ? main : f32;
      m.ids.push_back(i);
      m.numels.push_back(e.numel);
      m.opt_groups.push_back(e.optimizer_group);
      if constexpr (partitioner::partitions_parameters) {
        // A bucket never spans two fetch units; persistent parameters form units of their own.
        // Parameters kept unpartitioned by module type are persistent outside the budget.
        const bool small = !e.replicated && e.numel <= options_.stage3.param_persistence_threshold &&
                           persistent_numel + e.numel <= options_.stage3.model_persistence_threshold;
        if (small) persistent_numel += e.numel;
        const bool persistent = small || e.replicated;
        m.units.push_back(2 * e.unit + (persistent ? 1 : 0));
        m.persistent.push_back(persistent ? 1 : 0);
      }
    }
    const bool acc32 = !options_.grad_accum_dtype || *options_.grad_accum_dtype == DType::fp32;
    if constexpr (std::is_same_v<optimizer_tag, OneBitLamb>) {
      // 1-bit LAMB's scaling coefficients average over the whole model, and it exchanges the whole
      // model's momentum at once: one flat group, one optimizer.
      if (!main.ids.empty() && !f32.ids.empty()) {
        throw config_error("Optimizer<OneBitLamb> steps the whole model as one flat vector; parameters kept in fp32 "
                           "(keep_fp32, fp32_module_types) would form a second one. Train them in the working "
                           "precision, or use another optimizer",
                           "EngineOptions.keep_fp32 / fp32_module_types",
                           std::to_string(f32.ids.size()) + " fp32-kept parameters");
      }
    }
    // offload_param.max_in_cpu is one budget of elements over both groups, the working-precision
    // group's leading blocks first and the fp32 group's from what is left (DeepSpeed counts its
    // parameter groups in order against one budget too). Only OffloadParams<Nvme> reads it.
    std::size_t in_cpu_left = options_.param_nvme.max_in_cpu;
    if (!main.ids.empty()) {
      main_ = std::make_unique<MainGroup>(path_context(acc32), std::move(main), bucket_numel(sizeof(S)), options_.groups,
                                          options_.overlap_param_gather, store_options("main", in_cpu_left),
                                          options_.onebit);
      in_cpu_left -= ::zerotk::offload::elements_in_cpu(main_->layout(), in_cpu_left);
    }
    if (!f32.ids.empty()) {
      f32_ = std::make_unique<Fp32Group>(path_context(true), std::move(f32), bucket_numel(sizeof(float)),
                                         options_.groups, options_.overlap_param_gather,
                                         store_options("fp32", in_cpu_left), options_.onebit);
    }
    bindings_.emplace(registry_, main_.get(), f32_.get(), ops_, &ledger_);
    bindings_->adopt_and_bind(options_.adopt_initial_values);
    for_each_group([](auto& g) { g.init_master(); });
    if constexpr (MainGroup::kCanDelayUpdate) {
      if (options_.delayed_param_update) for_each_group([](auto& g) { g.enable_delayed_update(); });
    }
    FetchCtx fc;
    fc.bindings = &*bindings_;
    fc.registry = &registry_;
    fc.main = main_.get();
    fc.f32 = f32_.get();
    fc.comm = &comm_;
    fc.options = options_.stage3;
    fetch_.emplace(fc);
  }

  /// hpZ: checks the group size against the world and splits the world into groups of g
  /// consecutive ranks (collective: every rank constructs its engine).
  void make_group_comm() {
    const int g = options_.stage3.reshard_after_forward.group_size(), w = comm_.size();
    if (g <= 1) return;
    if (w % g != 0) {
      throw config_error("must divide the world size (" + std::to_string(w) +
                             "): hpZ keeps its secondary shard within groups of that many consecutive ranks",
                         "zero_optimization.zero_hpz_partition_size", std::to_string(g));
    }
    group_comm_.emplace(comm_.split(comm_.rank() / g, comm_.rank()));
  }

  template <class F>
  void for_each_group(F&& f) {
    if (main_) f(*main_);
    if (f32_) f(*f32_);
  }
  template <class F>
  void for_each_group(F&& f) const {
    if (main_) f(std::as_const(*main_));
    if (f32_) f(std::as_const(*f32_));
  }

  // ---- the boundary ------------------------------------------------------------------------------

  void boundary_step(StepReport& r) {
    const double gas = options_.gradient_accumulation_steps;
    bool local = false;  // 1-bit Adam's compressed phase: each rank clips by its own gradients' norm
    for_each_group([&](const auto& g) { local = local || g.gradients_local(); });
    const engine::GlobalNorm norm =
        engine::global_norm(comm_, ops_, flat_numel(), loss_sum_ / gas, [&](auto&& f) { for_each_group(f); }, local);
    r.loss = norm.loss_sum / comm_.size();
    r.boundary = true;
    const double sumsq = norm.sum_squares / (gas * gas);  // of the scaled, GAS-averaged gradients
    const double scale = scaler_.scale();
    const LossScalerState scaler_before = scaler_.state();  // an abandoned update puts it back
    const bool skip = scaler_.update(norm.nonfinite);
    ++global_steps_;
    r.lr = lr(0);
    const bool delayed = options_.delayed_param_update && global_steps_ > options_.delayed_param_update_start;
    if (skip) {  // nothing is updated; only the (non-finite) accumulated gradients are dropped
      if (delayed) {
        delayed_boundary(std::nullopt);  // the previous update is still published
      } else {
        for_each_group([](auto& g) { g.skip(); });
      }
      ++skipped_steps_;
      r.skipped = true;
      r.grad_norm = -1;
      report_lrs(r);
      return;
    }
    const ClipResult clip = clip_factor(norm.nonfinite ? INFINITY : sumsq, scale, options_.gradient_clipping);
    r.grad_norm = clip.reported_norm;
    const float grad_scale = static_cast<float>(static_cast<double>(clip.grad_factor) / gas);
    // A store may fail its update (Offload<Nvme>, a shard on NVMe: an I/O error) and then leaves its
    // state as it was, every group's; the step is then not taken: the scaler and the step counter go
    // back, the gradients are dropped.
    try {
      if (delayed) {
        delayed_boundary(grad_scale);
      } else {
        // Every group prepares its step before any makes it current (engine/group.hpp), so a
        // failure in the fp32-kept group's leaves the working-precision group's untaken too.
        int prepared = 0;
        try {
          for_each_group([&](auto& g) {
            g.prepare_update(grad_scale);
            ++prepared;
          });
        } catch (...) {
          for_each_group([&](auto& g) {
            if (prepared-- > 0) g.abort_update();
          });
          throw;
        }
        for_each_group([&](auto& g) {
          g.commit_update();
          g.publish([this, &g](std::size_t k) { bindings_->on_bucket_published(g, k); });
        });
      }
    } catch (...) {
      for_each_group([](auto& g) { g.skip(); });
      scaler_.load_state(scaler_before);
      --global_steps_;
      throw;
    }
    if (scheduler_) {
      scheduler_->step();
      apply_schedule();
    }
    report_lrs(r);
  }

  /// The boundary with the delayed parameter update (offload/delayed_update.hpp): the previous
  /// boundary's update is waited for and published, this one's (unless skipped: no `grad_scale`)
  /// started on each group's worker. The schedule reaches the optimizer only between the two.
  void delayed_boundary(std::optional<float> grad_scale) {
    if constexpr (MainGroup::kCanDelayUpdate) {
      for_each_group([](auto& g) { g.finish_update(); });
      apply_schedule();
      for_each_group([&](auto& g) {
        g.update_delayed(grad_scale, [this, &g](std::size_t k) { bindings_->on_bucket_published(g, k); });
      });
    } else {
      (void)grad_scale;
    }
  }

  /// Throws unless every update has been published (state() and its views read the master).
  void require_settled(const char* what) const {
    bool pending = false;
    for_each_group([&](const auto& g) { pending = pending || g.update_pending(); });
    if (pending) {
      throw usage_error("a delayed parameter update is in flight; call settle() first (it publishes the update, so "
                        "the next forward sees it)",
                        std::string("Engine::") + what, "delayed_param_update");
    }
  }

  void report_lrs(StepReport& r) const {
    r.group_lr.clear();
    for (const ParamGroup& g : options_.groups) r.group_lr.push_back(static_cast<double>(g.options.lr));
  }

  void apply_schedule() {
    if (!scheduler_) return;
    const double lr_now = scheduler_->lr();
    const std::optional<Betas> betas = scheduler_->betas();  // OneCycle with cycle_momentum: (mom, 0.99)
    auto apply = [&](std::vector<ParamGroup>& groups) {
      for (auto& pg : groups) {
        pg.options.lr = lr_now;  // doubles: rounded to float only at the kernel boundary
        if (betas) {
          pg.options.beta1 = betas->beta1;
          pg.options.beta2 = betas->beta2;
        }
      }
    };
    apply(options_.groups);
    for_each_group([&](auto& g) {  // a running delayed update reads them: it gets them at the next boundary
      if (!g.update_running()) apply(g.store().optimizer().groups());
    });
  }

  void require_boundary(const char* what) const {
    if (micro_in_accum_ != 0) {
      throw usage_error("only at an optimizer boundary (after the last micro-step's step())",
                        std::string("Engine::") + what,
                        std::to_string(micro_in_accum_) + " of " + std::to_string(options_.gradient_accumulation_steps) +
                            " micro-steps done");
    }
  }

  // ---- members -----------------------------------------------------------------------------------
  EngineOptions options_;
  ops_type ops_;
  Comm comm_;
  std::optional<Comm> group_comm_;  // hpZ: this rank's group of zero_hpz_partition_size ranks
  loss_scaler scaler_;
  MemoryLedger ledger_;
  engine::ParamRegistry registry_;
  std::unique_ptr<MainGroup> main_;
  std::unique_ptr<Fp32Group> f32_;
  std::optional<Bindings> bindings_;
  std::optional<Fetch> fetch_;
  std::optional<LrScheduler> scheduler_;
  int micro_in_accum_ = 0;
  std::int64_t micro_steps_ = 0, global_steps_ = 0, skipped_steps_ = 0;
  double loss_sum_ = 0;
  StepTimings timings_;
  std::uint64_t wire_mark_ = 0, dense_mark_ = 0;
};

}  // namespace zerotk
