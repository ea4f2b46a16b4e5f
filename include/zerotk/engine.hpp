#pragma once
/// \file zerotk/engine.hpp
/// Engine<Policies...>: data-parallel training with ZeRO stages 0, 1 and 2 over the user's own model.
///
///   using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                                 zerotk::Precision<zerotk::fp16>>;        // any order; others defaulted
///   Engine engine(comm, model, options);       // binds every parameter into engine-owned storage
///   for (micro-step) {
///     for (auto& l : layers)          { auto s = engine.forward(l);  x = l.forward(x); }
///     // seed backward with engine.loss_scale()
///     for (auto& l : reverse(layers)) { auto s = engine.backward(l); dx = l.backward(dx); }
///     auto report = engine.step(loss);       // every micro-step; optimizer runs at the GAS boundary
///   }
///
/// One step (stage 2, fp16): backward writes 16-bit gradients straight into a bucket buffer; when the
/// last parameter of a bucket is done the bucket is reduce-scattered (average over ranks) into this
/// rank's partition, asynchronously, while backward goes on. At the boundary: one fp64 all-reduce
/// gives the global sum of squares (a non-finite sum is the overflow flag, so ranks agree without a
/// second collective), the loss scaler decides, the clip factor folds into the unscale factor, the
/// fused optimizer updates the fp32 master partition and writes the 16-bit copy in place in the flat
/// buffer, and the 16-bit blocks are all-gathered bucket by bucket. See docs/engine.md.
///
/// Determinism: with the threads communicator, stages 0, 1 and 2 produce bitwise-identical parameters
/// (every element sees the same reduction, the same norm partials in the same order, the same
/// per-element update). Stage 1 with gradient accumulation reduces once per boundary (DeepSpeed's
/// schedule), which sums in another order; `stage1_reduce_every_micro_step` restores bitwise equality.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
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
#include "zerotk/engine/host_backend.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/clip.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/version.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/norms.hpp"
#include "zerotk/zero/partitioner.hpp"

#if defined(__CUDACC__)
#include "zerotk/engine/cuda_backend.cuh"
#endif

namespace zerotk {

/// Run-time settings. Numbers only: the structure (stage, precision, scaler, optimizer) is the
/// Engine's policies. Defaults follow DeepSpeed where it has one.
struct EngineOptions {
  /// Bucket capacity in bytes of the working precision; 0 takes the Bucketer policy's.
  std::size_t bucket_bytes = 0;
  int gradient_accumulation_steps = 1;
  /// Global L2 norm clip (DeepSpeed `gradient_clipping`); 0 disables clipping (the norm is still reported).
  double gradient_clipping = 0.0;
  /// Parameter groups; group 0 is the default. Empty: one group with `optimizer`.
  std::vector<ParamGroup> groups;
  OptimizerOptions optimizer;
  /// Which group a parameter belongs to (by name); unset: group 0.
  std::function<std::uint32_t(std::string_view name)> group_of;
  /// Parameters kept in fp32 even in fp16/bf16 training (e.g. LayerNorm weights). Their Param type
  /// must hold float.
  std::function<bool(std::string_view name)> keep_fp32;
  /// Module type names whose parameters stay fp32 (zerotk's JSON `fp16_override_modules`, e.g. "LayerNorm").
  std::vector<std::string> fp32_module_types;
  /// Dtype of the gradient accumulation (DeepSpeed `data_types.grad_accum_dtype`); empty: the training precision.
  std::optional<DType> grad_accum_dtype;
  LossScalerOptions loss_scaler;
  /// Device<Cuda>: the cudaStream_t the trainer's forward and backward run on (null: the legacy
  /// default stream). The engine orders its kernels and collectives after the work queued there.
  void* stream = nullptr;
  /// Reduce full buckets while backward goes on (false: each full bucket is reduced and waited for
  /// before backward continues, so step time is compute + communication).
  bool overlap_comm = true;
  /// Stages 1/2: do not wait in step() for the all-gather of the updated parameters; each layer's
  /// forward (or backward) scope waits for the buckets holding its own parameters, so the gather
  /// overlaps the next forward. Outside scopes, parameter values are valid after `synchronize()`.
  bool overlap_param_gather = false;
  /// Stage 2: bucket buffers in the pool (>= 2 double-buffers communication against backward). The
  /// pool grows when one layer's parameters span more buckets than it holds.
  int bucket_buffers = 2;
  /// Stage 1 reduces once per accumulation boundary (DeepSpeed); true reduces every micro-step.
  bool stage1_reduce_every_micro_step = false;
};

/// Milliseconds spent in each phase since the previous report (DeepSpeed's wall_clock_breakdown names).
struct StepTimings {
  double forward_ms = 0, backward_ms = 0, backward_inner_ms = 0, backward_allreduce_ms = 0, step_ms = 0;
};

/// What engine.step() tells the trainer.
struct StepReport {
  bool boundary = false;           ///< an optimizer boundary was reached in this call
  bool skipped = false;            ///< ... and the update was skipped (overflow)
  std::int64_t global_steps = 0;   ///< optimizer boundaries so far (skipped ones included)
  std::int64_t skipped_steps = 0;
  std::int64_t micro_steps = 0;
  double loss_scale = 1.0;         ///< the scale in force for the next micro-step
  double grad_norm = 0.0;          ///< of the unscaled gradients; -1 if non-finite
  double lr = 0.0;                 ///< group 0's learning rate used by this update
  double loss = 0.0;               ///< mean over micro-steps and ranks of the losses given to step()
  StepTimings timings;
  std::uint64_t comm_wire_bytes = 0;  ///< sent by this rank since the previous boundary (ring convention)
};

namespace detail {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace detail

template <class... Ps>
class Engine {
  static_assert(PolicyPackCheck<Ps...>::value);

 public:
  // ---- the policies, resolved ------------------------------------------------------------------
  using partitioner = find_policy_t<policy::partitioner, missing_policy, Ps...>;
  using optimizer_policy = find_policy_t<policy::optimizer, missing_policy, Ps...>;
  static_assert(!std::is_same_v<partitioner, missing_policy>,
                "Engine: a Partitioner policy is required, e.g. zerotk::Partitioner<zerotk::Stage<2>>");
  static_assert(!std::is_same_v<optimizer_policy, missing_policy>,
                "Engine: an Optimizer policy is required, e.g. zerotk::Optimizer<zerotk::AdamW>");
  using precision = find_policy_t<policy::precision, Precision<fp32>, Ps...>;
  using storage_type = typename precision::storage;
  using bucketer = find_policy_t<policy::bucketer, Bucketer<Bytes<std::size_t{500'000'000} * sizeof(storage_type)>>, Ps...>;
  using default_scaler = std::conditional_t<std::is_same_v<typename precision::tag, fp16>, LossScaler<Dynamic>, LossScaler<None>>;
  using loss_scaler = find_policy_t<policy::loss_scaler, default_scaler, Ps...>;
  using offload = find_policy_t<policy::offload, Offload<None>, Ps...>;
  using device = find_policy_t<policy::device, Device<Host>, Ps...>;

  static constexpr int kStage = partitioner::stage;
  using precision_tag = typename precision::tag;
  using loss_scaler_tag = policy_tag_t<loss_scaler>;
  using optimizer_tag = policy_tag_t<optimizer_policy>;
  using offload_tag = typename offload::tag;
  using device_tag = typename device::tag;

  static_assert(kStage <= 2, "Engine: ZeRO stage 3 is not available yet; use Stage<0>, Stage<1> or Stage<2>");
  static_assert(std::is_same_v<offload_tag, None>,
                "Engine: Offload<Cpu> and Offload<Nvme> are not available yet; use Offload<None>");
  /// Where the engine's buffers live and which kernels touch them (engine/host_backend.hpp,
  /// engine/cuda_backend.cuh).
  using backend = typename backends::select<device_tag>::type;
  template <class T>
  using Buffer = typename backend::template Buffer<T>;
  using optimizer_type = typename backend::template optimizer_type<optimizer_policy>;

  // ---- scopes ----------------------------------------------------------------------------------
  class [[nodiscard]] ForwardScope {
   public:
    ~ForwardScope() { e_->timings_.forward_ms += detail::ms_since(t0_); }
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

   private:
    friend class Engine;
    ForwardScope(Engine* e, detail::Clock::time_point t0) : e_(e), t0_(t0) {}
    Engine* e_;
    detail::Clock::time_point t0_;
  };

  class [[nodiscard]] BackwardScope {
   public:
    ~BackwardScope() noexcept(false) {
      const double inner = detail::ms_since(t0_);
      e_->timings_.backward_inner_ms += inner;
      if (std::uncaught_exceptions() == 0) e_->end_backward(params_);
      e_->timings_.backward_ms += detail::ms_since(t0_);
    }
    BackwardScope(const BackwardScope&) = delete;
    BackwardScope& operator=(const BackwardScope&) = delete;

   private:
    friend class Engine;
    BackwardScope(Engine* e, std::vector<std::uint32_t> params)
        : e_(e), params_(std::move(params)), t0_(detail::Clock::now()) {}
    Engine* e_;
    std::vector<std::uint32_t> params_;
    detail::Clock::time_point t0_;
  };

  // ---- construction ----------------------------------------------------------------------------

  /// Binds every parameter of `model` into engine-owned storage and initialises nothing else: the
  /// values are zero until the trainer writes initial values (through the bound Params) and calls
  /// `broadcast_parameters()` or `initialize_master()`. `comm` and `model` must outlive the engine.
  /// Device<Cuda>: `comm` is a device-memory communicator with a stream (NcclCommunicator), the
  /// calling thread's current CUDA device is the communicator's, and the model computes on
  /// `options.stream`.
  template <comm::Communicator C, Module M>
  Engine(C& comm, M& model, EngineOptions options = {})
      : comm_(comm), options_(std::move(options)), scaler_(options_.loss_scaler),
        backend_(backend::create(comm, options_.stream)) {
    static_assert(comm::uses_device_memory<C> == device::is_cuda,
                  "Engine: Device<Host> needs a host-memory communicator (threads, MPI) and Device<Cuda> a "
                  "device-memory one (NcclCommunicator)");
    if (options_.gradient_accumulation_steps < 1) {
      throw config_error("must be >= 1", "gradient_accumulation_steps", std::to_string(options_.gradient_accumulation_steps));
    }
    if (options_.gradient_clipping < 0) {
      throw config_error("must be >= 0", "gradient_clipping", to_text(options_.gradient_clipping));
    }
    if (options_.bucket_buffers < 1) {
      throw config_error("must be >= 1", "bucket_buffers", std::to_string(options_.bucket_buffers));
    }
    if (options_.groups.empty()) options_.groups.push_back(ParamGroup{options_.optimizer});
    register_parameters(model);
    build_groups();
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() { drain_quietly(); }

  // ---- the training loop -------------------------------------------------------------------------

  /// Brackets a layer's forward. Stages 0-2 keep every parameter gathered; with
  /// `overlap_param_gather` this waits for the all-gather of the buckets holding the layer's
  /// parameters (and its external_parameters) if it is still in flight.
  template <Module L>
  ForwardScope forward(L& layer) {
    const auto t0 = detail::Clock::now();  // waiting for parameters counts as forward time
    if (gathers_pending_ > 0) {
      layer.parameters([&](std::string_view name, auto& p) { finish_gather_of(lookup(&p, name)); });
      if constexpr (requires { layer.external_parameters(zerotk::detail::ParameterVisitorArchetype{}); }) {
        layer.external_parameters([&](std::string_view name, auto& p) { finish_gather_of(lookup(&p, name)); });
      }
    }
    return ForwardScope(this, t0);
  }

  /// Waits for every parameter all-gather still in flight (`overlap_param_gather`): after this every
  /// bound Param holds the current values. A no-op otherwise.
  void synchronize() {
    if (gathers_pending_ == 0) return;
    for_each_group([&](auto& g) {
      for (std::size_t k = g.layout.buckets().size(); k-- > 0;) finish_gather(g, k);
    });
  }

  /// Brackets a layer's backward: gradient storage for its parameters is ready (and zeroed when a new
  /// accumulation starts) when this returns; when the scope closes their gradients are complete and
  /// full buckets start reducing.
  /// A layer may also name parameters it writes gradients into but another layer owns (a tied
  /// output head reusing the embedding): `external_parameters(visit)`. Their storage is made ready
  /// here too; they are reduced when their owner's scope closes, so the owner's backward must come
  /// later in the same micro-step.
  template <Module L>
  BackwardScope backward(L& layer) {
    std::vector<std::uint32_t> ids;
    layer.parameters([&](std::string_view name, auto& p) { ids.push_back(lookup(&p, name)); });
    begin_backward(ids);
    if constexpr (requires { layer.external_parameters(zerotk::detail::ParameterVisitorArchetype{}); }) {
      std::vector<std::uint32_t> ext;
      layer.external_parameters([&](std::string_view name, auto& p) { ext.push_back(lookup(&p, name)); });
      begin_backward(ext);
    }
    return BackwardScope(this, std::move(ids));
  }

  /// The factor the trainer multiplies the loss (or the seed gradient) by before backward.
  double loss_scale() const { return scaler_.scale(); }

  /// Ends a micro-step. At every `gradient_accumulation_steps`-th call this is the optimizer boundary:
  /// overflow check, scaler update, clipping, fused update, all-gather, scheduler.
  StepReport step(double loss = 0.0) {
    loss_sum_ += loss;
    ++micro_in_accum_;
    ++micro_steps_;
    const bool boundary = micro_in_accum_ == options_.gradient_accumulation_steps;
    const auto t0 = detail::Clock::now();
    finish_micro_step(boundary);
    timings_.backward_allreduce_ms += detail::ms_since(t0);

    StepReport r;
    r.micro_steps = micro_steps_;
    if (boundary) {
      const auto ts = detail::Clock::now();
      boundary_step(r);
      timings_.step_ms += detail::ms_since(ts);
      r.timings = std::exchange(timings_, StepTimings{});
      const std::uint64_t wire = comm_.stats().total_wire_bytes();
      r.comm_wire_bytes = wire - wire_mark_;
      wire_mark_ = wire;
      micro_in_accum_ = 0;
      loss_sum_ = 0;
    }
    r.global_steps = global_steps_;
    r.skipped_steps = skipped_steps_;
    r.loss_scale = scaler_.scale();
    return r;
  }

  // ---- set-up helpers ----------------------------------------------------------------------------

  /// Makes every rank's parameters equal to rank `root`'s (call after initialising values on one
  /// rank or with different seeds), then (re)initialises the fp32 master copy from them.
  void broadcast_parameters(int root = 0) {
    synchronize();
    take_user_values();
    backend_.before_collective();
    for_each_group([&](auto& g) {
      if (g.params.size() == 0) return;
      using T = typename std::remove_cvref_t<decltype(g)>::value_type;
      comm_.broadcast(g.params.data(), g.params.size(), dtype_of_v<T>, root).wait();
    });
    if (emulated_) backend_.cast(main_.params.data(), compute_params_.data(), main_.layout.flat_numel());
    for_each_group([&](auto& g) { init_master(g); });
  }

  /// Copies the (bound, user-initialised) parameter values into the fp32 master copy, without
  /// communication (every rank must have initialised the same values).
  void initialize_master() {
    synchronize();
    take_user_values();
    for_each_group([&](auto& g) { init_master(g); });
  }

  /// Sets the learning-rate scheduler, stepped after every non-skipped update (DeepSpeed semantics).
  void set_scheduler(LrScheduler scheduler) {
    scheduler_ = std::move(scheduler);
    apply_schedule();
  }

  // ---- introspection -----------------------------------------------------------------------------

  const MemoryLedger& memory() const noexcept { return ledger_; }
  const comm::CommStats& comm_stats() const { return comm_.stats(); }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  std::int64_t global_steps() const noexcept { return global_steps_; }
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }
  const loss_scaler& scaler() const noexcept { return scaler_; }
  loss_scaler& scaler() noexcept { return scaler_; }
  const EngineOptions& options() const noexcept { return options_; }
  /// Parameter all-gathers (buckets) still in flight; non-zero only with overlap_param_gather.
  std::size_t pending_gathers() const noexcept { return gathers_pending_; }
  /// Total parameter elements of the model (Psi), padding excluded.
  std::size_t parameter_count() const noexcept { return psi_; }
  /// Padded element counts of the flat buffers (main precision and the fp32-kept group).
  std::size_t flat_numel() const noexcept { return main_.layout.flat_numel() + f32_.layout.flat_numel(); }
  std::size_t bucket_count() const noexcept { return main_.layout.buckets().size() + f32_.layout.buckets().size(); }
  /// Learning rate of group `g` for the next update.
  double lr(std::size_t g = 0) const { return main_.opt->groups()[g].options.lr; }
  /// The fp32 master copy this rank owns (stage 0: everything, flat layout; 1/2: its partition).
  std::span<const float> master() const noexcept { return {main_.master.data(), main_.master.size()}; }

 private:
  using S = storage_type;
  static constexpr bool kPartitionGrads = partitioner::partitions_gradients;
  static constexpr bool kPartitionState = partitioner::partitions_optimizer_state;

  struct ParamEntry {
    std::string name;
    std::size_t numel = 0;
    DType value_dtype = DType::fp32;
    bool fp32_group = false;     ///< lives in the fp32-kept group
    std::uint32_t local = 0;     ///< index within its group
    std::function<void(void*, void*)> bind;
    // per micro-step
    bool opened = false;  ///< gradient storage made ready (emulated: compute gradient zeroed)
    bool done = false;    ///< owner's backward scope closed
  };

  /// Everything one flat buffer needs, for element type T (the working precision, or float).
  template <class T>
  struct Group {
    using value_type = T;
    zero::FlatLayout layout;
    std::vector<std::uint32_t> members;  ///< global parameter ids, local order
    Buffer<T> params;                  ///< flat, full (stages 0-2 keep parameters gathered)
    Buffer<T> grads;                   ///< flat, full: stages 0 and 1
    Buffer<T> part_grads;              ///< reduced partition: stage 2 (stage 1 reduces in place in grads)
    Buffer<float> acc;                 ///< fp32 accumulator (GAS > 1, reduced every micro-step), owned-shaped
    Buffer<float> master;              ///< fp32 master, owned-shaped
    std::unique_ptr<optimizer_type> opt;
    std::vector<Segment> segments;       ///< owned pieces, in owned coordinates
    // per-bucket state
    std::vector<std::size_t> ready;      ///< elements whose gradient is complete this micro-step
    std::vector<char> opened, launched;
    std::vector<char> gathering;         ///< parameter all-gather in flight (overlap_param_gather)
    std::vector<comm::Work> inflight;
    std::vector<int> slot;               ///< stage 2: pool buffer held, or -1
    std::vector<Buffer<T>> pool;
    std::vector<int> free_slots;
    std::vector<std::size_t> launch_order;  ///< buckets in flight, oldest first
  };

  // ---- registration ------------------------------------------------------------------------------

  template <Module M>
  void register_parameters(M& model) {
    model.parameters([&](std::string_view name, auto& p) {
      using P = std::remove_cvref_t<decltype(p)>;
      using V = typename P::value_type;
      const void* key = &p;
      if (index_.count(key)) {
        throw usage_error("parameter visited twice by the model", std::string(name));
      }
      ParamEntry e;
      e.name = std::string(name);
      e.numel = static_cast<std::size_t>(p.numel());
      e.value_dtype = dtype_of_v<V>;
      e.fp32_group = !std::is_same_v<S, float> && options_.keep_fp32 && options_.keep_fp32(name);
      if (e.fp32_group && !std::is_same_v<V, float>) {
        throw usage_error("keep_fp32 parameters must hold float values", e.name, std::string(to_string(e.value_dtype)));
      }
      if (!e.fp32_group && !std::is_same_v<V, S> && !std::is_same_v<V, float>) {
        throw usage_error("parameter element type must be the engine precision's storage type or float",
                          e.name, std::string(to_string(e.value_dtype)));
      }
      if (!e.fp32_group && !std::is_same_v<V, S>) emulated_ = true;
      e.bind = [&p](void* d, void* g) { p.bind(static_cast<V*>(d), static_cast<V*>(g)); };
      index_.emplace(key, static_cast<std::uint32_t>(entries_.size()));
      psi_ += e.numel;
      entries_.push_back(std::move(e));
    });
    if (emulated_) {
      for (auto& e : entries_) {
        if (!e.fp32_group && e.value_dtype != dtype_of_v<float>) {
          throw usage_error("float and 16-bit Params cannot be mixed in one model's main group", e.name);
        }
      }
    }
  }

  std::uint32_t lookup(const void* key, std::string_view name) const {
    auto it = index_.find(key);
    if (it == index_.end()) {
      throw usage_error("parameter is not part of the model this engine was built with", std::string(name));
    }
    return it->second;
  }

  // ---- storage -----------------------------------------------------------------------------------

  std::size_t bucket_numel_for(std::size_t elem_bytes) const {
    const std::size_t bytes = options_.bucket_bytes ? options_.bucket_bytes : bucketer::bytes;
    return std::max<std::size_t>(1, bytes / elem_bytes);
  }

  void build_groups() {
    const int world = comm_.size();
    std::vector<std::size_t> numels[2];
    std::vector<std::uint32_t> groups[2];
    for (std::uint32_t i = 0; i < entries_.size(); ++i) {
      auto& e = entries_[i];
      const std::uint32_t grp = options_.group_of ? options_.group_of(e.name) : 0;
      if (grp >= options_.groups.size()) {
        throw config_error("group_of returned a group that does not exist", e.name, std::to_string(grp));
      }
      const int which = e.fp32_group ? 1 : 0;
      e.local = static_cast<std::uint32_t>(numels[which].size());
      numels[which].push_back(e.numel);
      groups[which].push_back(grp);
      if (which) f32_.members.push_back(i);
      else main_.members.push_back(i);
    }
    setup_group(main_, numels[0], groups[0], world);
    setup_group(f32_, numels[1], groups[1], world);
    if (emulated_) {
      compute_params_ = backend_.template allocate<float>(main_.layout.flat_numel(), MemoryCategory::other, &ledger_);
      compute_grads_ = backend_.template allocate<float>(main_.layout.flat_numel(), MemoryCategory::other, &ledger_);
    }
    bind_all();
  }

  template <class T>
  void setup_group(Group<T>& g, const std::vector<std::size_t>& numels, const std::vector<std::uint32_t>& groups,
                   int world) {
    g.layout = zero::FlatLayout(numels, groups, world, bucket_numel_for(sizeof(T)));
    if (numels.empty()) return;
    const int rank = comm_.rank();
    const std::size_t flat = g.layout.flat_numel();
    const std::size_t owned = kPartitionState ? g.layout.partition_numel() : flat;
    g.params = backend_.template allocate<T>(flat, MemoryCategory::params16, &ledger_);
    if constexpr (!kPartitionGrads) g.grads = backend_.template allocate<T>(flat, MemoryCategory::grads, &ledger_);
    if constexpr (kPartitionGrads) g.part_grads = backend_.template allocate<T>(owned, MemoryCategory::grads, &ledger_);
    if (grads_in_acc(g)) g.acc = backend_.template allocate<float>(owned, MemoryCategory::grads, &ledger_);
    g.master = backend_.template allocate<float>(owned, MemoryCategory::master32, &ledger_);
    g.opt = std::make_unique<optimizer_type>(options_.groups);
    backend_.init_optimizer(*g.opt, owned, &ledger_);
    g.opt->set_tensor_count(numels.size());  // LAMB: equal-length per-tensor sums on every rank
    if constexpr (kPartitionState) {
      // Master, m, v (and the fp32 accumulator) are partition-shaped. Stage 1 keeps no partition of
      // gradients: it reduces in place into its blocks of the flat gradient buffer, and the optimizer
      // reads them there and writes the new 16-bit values in place into the flat parameter buffer.
      for (std::size_t k = g.layout.buckets().size(); k-- > 0;) {
        const auto part = g.layout.block_segments(k, rank, true);
        const auto flat = g.layout.block_segments(k, rank, false);
        for (std::size_t i = 0; i < part.size(); ++i) {
          Segment seg{part[i].offset, part[i].numel, part[i].group, part[i].tensor};
          if constexpr (!kPartitionGrads) {
            if (!grads_in_acc(g)) seg.grad_offset = flat[i].offset;
            seg.out_offset = flat[i].offset;
          }
          g.segments.push_back(seg);
        }
      }
    } else {
      for (const auto& s : g.layout.flat_segments()) g.segments.push_back(Segment{s.offset, s.numel, s.group, s.tensor});
    }
    const std::size_t nb = g.layout.buckets().size();
    g.ready.assign(nb, 0);
    g.opened.assign(nb, 0);
    g.launched.assign(nb, 0);
    g.gathering.assign(nb, 0);
    g.inflight.resize(nb);
    g.slot.assign(nb, -1);
    if constexpr (kPartitionGrads) {
      std::size_t biggest = 0;
      for (const auto& b : g.layout.buckets()) biggest = std::max(biggest, b.numel);
      const int count = std::min<int>(options_.bucket_buffers, static_cast<int>(nb));
      for (int i = 0; i < count; ++i) {
        g.pool.push_back(backend_.template allocate<T>(biggest, MemoryCategory::comm_buffers, &ledger_));
        g.free_slots.push_back(count - 1 - i);
      }
    }
  }

  template <class F>
  void for_each_group(F&& f) {
    f(main_);
    if (f32_.layout.param_count()) f(f32_);
  }

  /// Points every Param at its storage. Stage 2 gradients are re-pointed into a bucket buffer when
  /// the bucket opens; until then they point at nothing (nullptr).
  void bind_all() {
    for (auto& e : entries_) {
      if (e.fp32_group) {
        bind_entry(f32_, e);
      } else {
        bind_entry(main_, e);
      }
    }
  }

  template <class T>
  void bind_entry(Group<T>& g, ParamEntry& e) {
    const auto& slot = g.layout.param(e.local);
    if (std::is_same_v<T, S> && emulated_ && !e.fp32_group) {
      e.bind(compute_params_.data() + slot.flat_offset, compute_grads_.data() + slot.flat_offset);
      return;
    }
    T* grad = nullptr;
    if constexpr (!kPartitionGrads) grad = g.grads.data() + slot.flat_offset;
    e.bind(g.params.data() + slot.flat_offset, grad);
  }

  // ---- backward --------------------------------------------------------------------------------

  void begin_backward(const std::vector<std::uint32_t>& ids) {
    for (std::uint32_t id : ids) {
      if (gathers_pending_ > 0) finish_gather_of(id);
      auto& e = entries_[id];
      if (e.fp32_group) {
        open_bucket_of(f32_, e);
      } else {
        open_bucket_of(main_, e);
      }
      if (emulated_ && !e.fp32_group && !e.opened) {
        const auto& slot = main_.layout.param(e.local);
        backend_.zero(compute_grads_.data() + slot.flat_offset, slot.numel);
      }
      e.opened = true;
    }
  }

  template <class T>
  void open_bucket_of(Group<T>& g, const ParamEntry& e) {
    const std::uint32_t k = g.layout.param(e.local).bucket;
    if (g.launched[k]) {
      throw usage_error("parameter's gradient bucket was already reduced in this micro-step (is the parameter "
                        "used by two layers? give every parameter to exactly one layer's backward scope)",
                        e.name);
    }
    if (!g.opened[k]) open_bucket(g, k);
  }

  /// First touch of bucket k in this micro-step: make its gradient storage ready and zeroed.
  template <class T>
  void open_bucket(Group<T>& g, std::size_t k) {
    const auto& b = g.layout.buckets()[k];
    g.opened[k] = 1;
    if constexpr (kPartitionGrads) {
      if (g.free_slots.empty()) {
        if (!g.launch_order.empty()) {
          complete_oldest(g);
        } else {
          // One layer's parameters span more buckets than the pool holds: grow it (once; the ledger
          // shows the extra buffer under comm_buffers).
          g.pool.push_back(backend_.template allocate<T>(g.pool.empty() ? 0 : g.pool.front().size(),
                                                         MemoryCategory::comm_buffers, &ledger_));
          g.free_slots.push_back(static_cast<int>(g.pool.size() - 1));
        }
      }
      const int s = g.free_slots.back();
      g.free_slots.pop_back();
      g.slot[k] = s;
      T* buf = g.pool[static_cast<std::size_t>(s)].data();
      backend_.zero(buf, b.numel);
      if (!(emulated_ && std::is_same_v<T, S>)) {
        for (std::uint32_t j : b.params) {
          auto& e = entries_[g.members[j]];
          e.bind(g.params.data() + g.layout.param(j).flat_offset, buf + (g.layout.param(j).flat_offset - b.flat_offset));
        }
      }
    } else {
      // Stages 0/1: the flat gradient buffer persists. It starts a new accumulation when the previous
      // one was consumed: every micro-step when reducing per micro-step, else after a boundary.
      if (reduces_every_micro_step() || micro_in_accum_ == 0) backend_.zero(g.grads.data() + b.flat_offset, b.numel);
    }
  }

  /// Where bucket k's gradients live while backward fills them.
  template <class T>
  T* bucket_grads(Group<T>& g, std::size_t k) {
    if constexpr (kPartitionGrads) {
      return g.pool[static_cast<std::size_t>(g.slot[k])].data();
    } else {
      return g.grads.data() + g.layout.buckets()[k].flat_offset;
    }
  }

  void end_backward(const std::vector<std::uint32_t>& ids) {
    for (std::uint32_t id : ids) {
      auto& e = entries_[id];
      if (e.done) {
        throw usage_error("parameter received a second backward in one micro-step", e.name);
      }
      e.done = true;
      if (e.fp32_group) {
        mark_ready(f32_, e);
      } else {
        mark_ready(main_, e);
      }
    }
  }

  template <class T>
  void mark_ready(Group<T>& g, const ParamEntry& e) {
    const auto& slot = g.layout.param(e.local);
    const std::size_t k = slot.bucket;
    if (emulated_ && std::is_same_v<T, S> && !e.fp32_group) {
      const auto& b = g.layout.buckets()[k];
      backend_.add_rounded(bucket_grads(g, k) + (slot.flat_offset - b.flat_offset),
                          compute_grads_.data() + slot.flat_offset, slot.numel);
    }
    g.ready[k] += slot.numel;
    if (g.ready[k] == g.layout.buckets()[k].used) {
      launch(g, k);
      // Without overlap the reduction runs to completion before backward goes on (compute + comm).
      if (!options_.overlap_comm) {
        while (!g.launch_order.empty()) complete_oldest(g);
      }
    }
  }

  bool reduces_every_micro_step() const {
    return kStage != 1 || options_.stage1_reduce_every_micro_step;
  }

  /// Starts bucket k's reduction (a no-op for stage 1 between boundaries).
  template <class T>
  void launch(Group<T>& g, std::size_t k) {
    if (g.launched[k]) return;
    g.launched[k] = 1;
    if (!reduces_every_micro_step()) return;  // stage 1: at the boundary
    finish_gather(g, k);  // stage 2: the reduction writes the partition that bucket's gather reads
    const auto& b = g.layout.buckets()[k];
    backend_.before_collective();
    constexpr DType dt = dtype_of_v<T>;
    if constexpr (kStage == 0) {
      T* buf = g.grads.data() + b.flat_offset;
      g.inflight[k] = comm_.all_reduce(buf, buf, b.numel, dt, comm::ReduceOp::avg);
    } else {
      g.inflight[k] = comm_.reduce_scatter(bucket_grads(g, k), reduced_block(g, k), b.block, dt,
                                           comm::ReduceOp::avg);
    }
    g.launch_order.push_back(k);
  }

  /// Waits for the oldest bucket in flight and folds its result in (accumulator, pool buffer back).
  template <class T>
  void complete_oldest(Group<T>& g) {
    const std::size_t k = g.launch_order.front();
    g.launch_order.erase(g.launch_order.begin());
    complete(g, k);
  }

  template <class T>
  void complete(Group<T>& g, std::size_t k) {
    g.inflight[k].wait();
    const auto& b = g.layout.buckets()[k];
    if (options_.gradient_accumulation_steps > 1 && reduces_every_micro_step()) {
      if constexpr (kStage == 0) {
        backend_.accumulate(g.acc.data() + b.flat_offset, g.grads.data() + b.flat_offset, b.numel);
      } else {
        backend_.accumulate(g.acc.data() + b.part_offset, reduced_block(g, k), b.block);
      }
    }
    if constexpr (kPartitionGrads) {
      g.free_slots.push_back(g.slot[k]);
      g.slot[k] = -1;
    }
  }

  /// End of a micro-step: reduce what is left (buckets nobody touched have zero gradients), wait for
  /// every reduction, reset the per-micro-step state. Stage 1 reduces here at the boundary.
  void finish_micro_step(bool boundary) {
    for_each_group([&](auto& g) {
      const std::size_t nb = g.layout.buckets().size();
      for (std::size_t k = nb; k-- > 0;) {
        if (!g.opened[k]) open_bucket(g, k);
        launch(g, k);
      }
      while (!g.launch_order.empty()) complete_oldest(g);
      if (!reduces_every_micro_step() && boundary) {
        using T = typename std::remove_cvref_t<decltype(g)>::value_type;
        for (std::size_t k = nb; k-- > 0;) finish_gather(g, k);
        backend_.before_collective();
        for (std::size_t k = nb; k-- > 0;) {
          const auto& b = g.layout.buckets()[k];
          g.inflight[k] = comm_.reduce_scatter(g.grads.data() + b.flat_offset, reduced_block(g, k),
                                               b.block, dtype_of_v<T>, comm::ReduceOp::avg);
        }
        for (std::size_t k = 0; k < nb; ++k) g.inflight[k].wait();
      }
      std::fill(g.ready.begin(), g.ready.end(), 0);
      std::fill(g.opened.begin(), g.opened.end(), 0);
      std::fill(g.launched.begin(), g.launched.end(), 0);
    });
    for (auto& e : entries_) e.done = e.opened = false;
  }

  // ---- the boundary --------------------------------------------------------------------------------

  /// The gradients the optimizer consumes, owned-shaped: fp32 accumulator, or the reduced buffer.
  template <class T>
  bool grads_in_acc(const Group<T>&) const {
    return options_.gradient_accumulation_steps > 1 && reduces_every_micro_step();
  }

  /// Where this rank's reduced gradients of bucket k land (stages 1/2): the partition (stage 2), or
  /// in place, this rank's block of the flat gradient buffer (stage 1).
  template <class T>
  T* reduced_block(Group<T>& g, std::size_t k) {
    if constexpr (kPartitionGrads) {
      return g.part_grads.data() + g.layout.buckets()[k].part_offset;
    } else {
      return g.grads.data() + g.layout.block_flat_offset(k, comm_.rank());
    }
  }

  /// Sums of squares of the gradient blocks the norm needs, in one backend call: this rank's blocks
  /// (stages 1, 2), or every rank's, rank-major (stage 0 computes each rank's partial itself, so the
  /// totals agree bitwise with the other stages'). Within a rank, buckets last to first.
  template <class T>
  std::vector<double> block_sums(Group<T>& g) {
    if (grads_in_acc(g)) return block_sums_of(g, static_cast<const float*>(g.acc.data()), kPartitionState);
    if constexpr (kPartitionGrads) {
      return block_sums_of(g, static_cast<const T*>(g.part_grads.data()), true);
    } else {
      return block_sums_of(g, static_cast<const T*>(g.grads.data()), false);
    }
  }

  /// `base` is partition-shaped (blocks at part_offset) or flat (blocks at block_flat_offset).
  template <class T, class E>
  std::vector<double> block_sums_of(Group<T>& g, const E* base, bool partition_shaped) {
    const auto buckets = g.layout.buckets();
    const int ranks = kPartitionState ? 1 : comm_.size();
    std::vector<kernels::TensorRef<const E>> blocks;
    blocks.reserve(buckets.size() * static_cast<std::size_t>(ranks));
    for (int q = 0; q < ranks; ++q) {
      const int r = kPartitionState ? comm_.rank() : q;
      for (std::size_t k = buckets.size(); k-- > 0;) {
        const auto& b = buckets[k];
        const std::size_t off = partition_shaped ? b.part_offset : g.layout.block_flat_offset(k, r);
        blocks.emplace_back(base + off, b.block);
      }
    }
    std::vector<double> sums(blocks.size());
    backend_.sum_squares(std::span<const kernels::TensorRef<const E>>(blocks), std::span<double>(sums));
    return sums;
  }

  void boundary_step(StepReport& r) {
    const int world = comm_.size();
    const int rank = comm_.rank();
    // Global sum of squares + loss, one fp64 all-reduce (rank-order sum in the threads back end).
    double local[2] = {0.0, loss_sum_ / options_.gradient_accumulation_steps};
    std::vector<std::vector<double>> sums;  // per group, [rank][bucket]
    for_each_group([&](auto& g) { sums.push_back(block_sums(g)); });
    // Rank q's partial: per group the blocks in order, then the groups in order.
    auto partial = [&](int q) {
      double p = 0;
      for (const auto& gs : sums) {
        const std::size_t per_rank = gs.size() / static_cast<std::size_t>(kPartitionState ? 1 : world);
        double s = 0;
        for (std::size_t j = 0; j < per_rank; ++j) s += gs[static_cast<std::size_t>(q) * per_rank + j];
        p += s;
      }
      return p;
    };
    if constexpr (kPartitionState) {
      local[0] = partial(0);
    } else {
      double total = 0;
      for (int q = 0; q < world; ++q) total = q == 0 ? partial(q) : total + partial(q);
      local[0] = rank == 0 ? total : 0.0;
    }
    double global[2];
    backend_.all_reduce_sum(comm_, local, global, 2);
    r.loss = global[1] / world;
    r.boundary = true;

    const double gas = options_.gradient_accumulation_steps;
    const double sumsq = global[0] / (gas * gas);  // of the scaled, GAS-averaged gradients
    const bool overflow = !std::isfinite(sumsq);
    const double scale = scaler_.scale();
    const bool skip = scaler_.update(overflow);
    ++global_steps_;
    r.lr = lr(0);
    if (skip) {
      // Nothing is updated; only the (non-finite) accumulated gradients are dropped.
      for_each_group([&](auto& g) {
        if (grads_in_acc(g)) backend_.zero(g.acc.data(), g.acc.size());
      });
      ++skipped_steps_;
      r.skipped = true;
      r.grad_norm = -1;
      return;
    }
    const ClipResult clip = clip_factor(sumsq, scale, options_.gradient_clipping);
    r.grad_norm = clip.reported_norm;
    const float grad_scale = static_cast<float>(static_cast<double>(clip.grad_factor) / gas);

    for_each_group([&](auto& g) { update_group(g, grad_scale); });
    // Emulated mode: the compute copy follows the 16-bit values (stages 1/2: bucket by bucket, as
    // each gather completes).
    if (!kPartitionState && emulated_) backend_.cast(main_.params.data(), compute_params_.data(), main_.layout.flat_numel());
    if (scheduler_) {
      scheduler_->step();
      apply_schedule();
    }
  }

  template <class T>
  void update_group(Group<T>& g, float grad_scale) {
    if (g.layout.param_count() == 0) return;
    // LAMB's per-tensor partial sums (host or device memory, as the backend keeps them).
    auto reduce_tensor_sums = [&](double* sums, std::size_t n) {
      if constexpr (kPartitionState) {
        if (n == 0) return;
        backend_.before_collective();
        comm_.all_reduce(sums, sums, n, DType::fp64, comm::ReduceOp::sum).wait();
      } else {
        (void)sums, (void)n;
      }
    };
    const std::span<const Segment> segs(g.segments);
    if constexpr (!kPartitionState) {
      // Stage 0: this rank owns everything, in flat coordinates; the 16-bit copy is written in place.
      if (grads_in_acc(g)) {
        backend_.step(*g.opt, segs, g.master.data(), g.acc.data(), g.params.data(), grad_scale, reduce_tensor_sums);
      } else {
        backend_.step(*g.opt, segs, g.master.data(), g.grads.data(), g.params.data(), grad_scale, reduce_tensor_sums);
      }
    } else {
      // Stages 1/2: owned elements are contiguous in the partition but one block per bucket in the
      // flat buffer. Stage 2: the optimizer writes the new 16-bit values into the partition gradient
      // buffer, element by element after reading each gradient (or, with an fp32 accumulator, into the
      // free partition buffer), and each block is all-gathered from there into the flat buffer.
      // Stage 1: it reads the gradients in place in the flat gradient buffer and writes the values in
      // place into this rank's blocks of the flat parameter buffer (the segments' grad/out offsets),
      // which are all-gathered in place.
      T* staging = kPartitionGrads ? g.part_grads.data() : g.params.data();
      const T* grads = kPartitionGrads ? g.part_grads.data() : g.grads.data();
      if (grads_in_acc(g)) {
        backend_.step(*g.opt, segs, g.master.data(), g.acc.data(), staging, grad_scale, reduce_tensor_sums);
      } else {
        backend_.step(*g.opt, segs, g.master.data(), grads, staging, grad_scale, reduce_tensor_sums);
      }
      // Gathered in forward order (the first layer's bucket, the last one, first), so that with
      // overlap_param_gather the next forward can start as soon as its first bucket arrives.
      const auto buckets = g.layout.buckets();
      backend_.before_collective();
      for (std::size_t k = buckets.size(); k-- > 0;) {
        const auto& b = buckets[k];
        const T* send = kPartitionGrads ? staging + b.part_offset : g.params.data() + g.layout.block_flat_offset(k, comm_.rank());
        g.inflight[k] = comm_.all_gather(send, g.params.data() + b.flat_offset, b.block, dtype_of_v<T>);
        g.gathering[k] = 1;
        ++gathers_pending_;
      }
      if (!options_.overlap_param_gather) {
        for (std::size_t k = buckets.size(); k-- > 0;) finish_gather(g, k);
      }
    }
    if (grads_in_acc(g)) backend_.zero(g.acc.data(), g.acc.size());
  }

  /// Waits for bucket k's parameter all-gather if it is in flight; in emulated mode refreshes that
  /// bucket's float compute copy.
  template <class T>
  void finish_gather(Group<T>& g, std::size_t k) {
    if (!g.gathering[k]) return;
    g.gathering[k] = 0;
    --gathers_pending_;
    g.inflight[k].wait();
    if constexpr (std::is_same_v<T, S> && !std::is_same_v<S, float>) {
      if (emulated_) {
        const auto& b = g.layout.buckets()[k];
        backend_.cast(g.params.data() + b.flat_offset, compute_params_.data() + b.flat_offset, b.numel);
      }
    }
  }

  void finish_gather_of(std::uint32_t id) {
    const auto& e = entries_[id];
    if (e.fp32_group) {
      finish_gather(f32_, f32_.layout.param(e.local).bucket);
    } else {
      finish_gather(main_, main_.layout.param(e.local).bucket);
    }
  }

  /// Emulated mode (float Params over 16-bit storage): round what the user wrote into the compute copy
  /// to the storage precision, and let the compute copy see the rounded values.
  void take_user_values() {
    if (!emulated_) return;
    backend_.cast(compute_params_.data(), main_.params.data(), main_.layout.flat_numel());
    backend_.cast(main_.params.data(), compute_params_.data(), main_.layout.flat_numel());
  }

  template <class T>
  void init_master(Group<T>& g) {
    if (g.layout.param_count() == 0) return;
    const int rank = comm_.rank();
    if constexpr (kPartitionState) {
      const auto buckets = g.layout.buckets();
      for (std::size_t k = 0; k < buckets.size(); ++k) {
        const auto& b = buckets[k];
        backend_.cast(g.params.data() + g.layout.block_flat_offset(k, rank), g.master.data() + b.part_offset, b.block);
      }
    } else {
      backend_.cast(g.params.data(), g.master.data(), g.layout.flat_numel());
    }
  }

  void apply_schedule() {
    if (!scheduler_) return;
    const double lr_now = scheduler_->lr();
    const std::optional<Betas> betas = scheduler_->betas();  // OneCycle with cycle_momentum: (mom, 0.99)
    for_each_group([&](auto& g) {
      for (auto& pg : g.opt->groups()) {
        pg.options.lr = lr_now;  // doubles: rounded to float only at the kernel boundary
        if (betas) {
          pg.options.beta1 = betas->beta1;
          pg.options.beta2 = betas->beta2;
        }
      }
    });
  }

  void drain_quietly() noexcept {
    try {
      for_each_group([&](auto& g) {
        for (auto& w : g.inflight) w.wait();
      });
    } catch (...) {
    }
  }

  // ---- members -----------------------------------------------------------------------------------
  comm::AnyCommunicator comm_;
  EngineOptions options_;
  loss_scaler scaler_;
  backend backend_;
  MemoryLedger ledger_;
  std::vector<ParamEntry> entries_;
  std::unordered_map<const void*, std::uint32_t> index_;
  Group<S> main_;
  Group<float> f32_;
  bool emulated_ = false;
  Buffer<float> compute_params_, compute_grads_;
  std::optional<LrScheduler> scheduler_;
  std::size_t psi_ = 0;
  std::size_t gathers_pending_ = 0;  ///< parameter all-gathers in flight (overlap_param_gather)
  int micro_in_accum_ = 0;
  std::int64_t micro_steps_ = 0, global_steps_ = 0, skipped_steps_ = 0;
  double loss_sum_ = 0;
  StepTimings timings_;
  std::uint64_t wire_mark_ = 0;
};

}  // namespace zerotk
