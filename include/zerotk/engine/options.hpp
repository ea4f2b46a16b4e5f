#pragma once
/// \file zerotk/engine/options.hpp
/// EngineOptions: the run-time numbers of an Engine. The structure (stage, reduction schedule,
/// precision, scaler, optimizer, device) is the Engine's policies; the per-layer options structs
/// (OptimizerOptions, LossScalerOptions) are held whole, as the config layer fills them.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/compress/gradient_options.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk {

/// Stage 3: where a layer's parameters go after its forward, FSDP2's `reshard_after_forward =
/// True | False | int g`. A bool converts to it, so `o.stage3.reshard_after_forward = false` reads
/// as before; `if (!r)` is true only for "keep gathered".
///
///   group_size()  0: keep gathered until the backward (false)
///                 1: back to the primary shards over all W ranks (true; hpZ off)
///                 g > 1: hpZ: also a secondary shard within each group of g consecutive ranks
///                        ([i g, (i+1) g)); the backward gathers inside the group. g must divide W;
///                        g = W is allowed and makes the secondary the primary's twin (same bytes as
///                        off, the gathers on a communicator of its own, S Psi_pad / W more memory).
class ReshardAfterForward {
 public:
  constexpr ReshardAfterForward(bool reshard = true) noexcept : group_size_(reshard ? 1 : 0) {}  // implicit: a bool converts
  /// hpZ with groups of g ranks (`zero_hpz_partition_size`); group(1) is plain `true`. The engine
  /// checks g >= 1 and that g divides the world size.
  static constexpr ReshardAfterForward group(int g) noexcept {
    ReshardAfterForward r;
    r.group_size_ = g;
    return r;
  }
  constexpr int group_size() const noexcept { return group_size_; }
  /// A secondary shard is kept (g > 1).
  constexpr bool hierarchical() const noexcept { return group_size_ > 1; }
  /// False only for "keep gathered until the backward".
  constexpr explicit operator bool() const noexcept { return group_size_ != 0; }
  friend constexpr bool operator==(ReshardAfterForward, ReshardAfterForward) noexcept = default;

 private:
  int group_size_ = 1;
};

/// ZeRO stage 3's run-time settings (DeepSpeed's `stage3_*` keys; sizes count elements). Ignored
/// below stage 3.
struct Stage3Options {
  /// Elements gathered ahead of use, following the order recorded in the previous micro-step
  /// (`stage3_prefetch_bucket_size`); 0 disables prefetching.
  std::size_t prefetch_bucket_size = 50'000'000;
  /// Parameters of at most this many elements stay gathered (`stage3_param_persistence_threshold`).
  std::size_t param_persistence_threshold = 100'000;
  /// At most this many elements in all are persistent, first come first served in visitation order
  /// (`stage3_model_persistence_threshold`).
  std::size_t model_persistence_threshold = static_cast<std::size_t>(-1);
  /// Gathered elements that prefetching and reuse may hold besides what open scopes need
  /// (`stage3_max_live_parameters`).
  std::size_t max_live_parameters = 1'000'000'000;
  /// A released bucket that the recorded order needs again within this many fetched elements stays
  /// gathered (`stage3_max_reuse_distance`); 0 releases at once.
  std::size_t max_reuse_distance = 1'000'000'000;
  /// What a layer's parameters go back to after its forward (FSDP2's `reshard_after_forward`):
  /// true (the default) their shards over all W ranks, 3 Psi of traffic per step; false: nothing,
  /// they stay gathered until the layer's backward (2 Psi, the gathered model's peak is the whole
  /// model); `ReshardAfterForward::group(g)`: ZeRO++ hpZ (`zero_hpz_partition_size`), a secondary
  /// shard within groups of g ranks from which the backward gathers (docs/stage3.md).
  ReshardAfterForward reshard_after_forward = true;
  /// Only the parameters of modules whose `module_type` is listed are partitioned (empty: every
  /// module's). Matched against the model and, recursively, the sub-modules it lists with
  /// `modules(visit)` (`zero_allowed_param_types`, zerotk's own key).
  std::vector<std::string> partitioned_module_types;
  /// The parameters of modules of these types are never partitioned (`zero_force_param_types`).
  /// Parameters left unpartitioned by either list stay gathered on every rank like persistent ones
  /// (they do not count against `model_persistence_threshold`); their gradients and optimizer
  /// state are partitioned as usual.
  std::vector<std::string> replicated_module_types;
};

/// The 1-bit optimizers' optimizer-wide keys: Optimizer<OneBitAdam> (optim/onebit_adam.hpp),
/// Optimizer<ZeroOneAdam> (optim/zero_one_adam.hpp) and Optimizer<OneBitLamb> (optim/onebit_lamb.hpp).
struct OneBitOptions {
  /// OneBitAdam, OneBitLamb: steps before the compressed phase (DeepSpeed `optimizer.params.freeze_step`); >= 0.
  std::int64_t freeze_step = 100'000;
  /// OneBitLamb: coeff_beta, factor_max, factor_min, factor_threshold.
  OneBitLambOptions lamb;
  /// ZeroOneAdam: var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper.
  optim::ZeroOneOptions zero_one;
};

/// Run-time settings. Defaults follow DeepSpeed where it has one.
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
  /// Module type names whose parameters are kept in fp32 (DeepSpeed-style `fp16_override_modules`):
  /// matched against `M::module_type` of the model and of the sub-modules it lists with
  /// `modules(visit)` (core/concepts.hpp). Adds to `keep_fp32`.
  std::vector<std::string> fp32_module_types;
  /// dtype in which gradients are accumulated over micro-steps (DeepSpeed `data_types.grad_accum_dtype`).
  /// Unset: schedules that reduce every micro-step add the reduced gradients in fp32; schedules that
  /// reduce at the boundary accumulate where backward writes (the working precision). Set to the
  /// working precision, reducing schedules add in it too (DeepSpeed's order, which a DeepSpeed config
  /// selects). fp32 with a 16-bit working precision needs a schedule that reduces every micro-step.
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
  /// Construction: take the values the parameters hold (their `data()` before binding) as the
  /// initial model, as DeepSpeed does (initialise, then wrap). Parameters whose `data()` is null
  /// start at zero; write them through the bound Params and call `initialize_master()` or
  /// `broadcast_parameters()`.
  bool adopt_initial_values = true;
  /// Offload<Cpu>: elements of the owned partition the optimizer steps at once (DeepSpeed
  /// `zero_optimization.sub_group_size`); bounds the pinned staging buffers. Must be >= 1.
  /// Offload<None> steps the partition in one piece and ignores it.
  std::size_t sub_group_size = 1'000'000'000;
  /// Offload<Cpu>: ZeRO-Offload's delayed parameter update (docs/offload.md). The host step of
  /// optimizer step t runs on a worker thread while the trainer goes on with the forward and backward
  /// of step t + 1, which still see the parameters from before step t's update: every update lands one
  /// step late (master_{t+1} = Adam(master_t, g(params_{t-1}))). Call Engine::settle() to publish the
  /// update in flight (state(), checkpoints and the end of training need it). Off by default.
  bool delayed_param_update = false;
  /// The number of optimizer steps taken immediately before the updates start to be delayed
  /// (ZeRO-Offload warms up this way; 0: from the first step).
  std::int64_t delayed_param_update_start = 0;
  /// Offload<Nvme>: where and how the optimizer state is swapped (offload/options.hpp; DeepSpeed's
  /// `offload_optimizer.nvme_path`, `buffer_count`, `pipeline_read`, `pipeline_write` and `aio`).
  offload::NvmeOptions nvme;
  /// OffloadParams<Nvme>: the directory of the parameter shard files, their read-ahead buffers and
  /// the part kept in host memory (DeepSpeed `offload_param.nvme_path`, `buffer_count`,
  /// `buffer_size`, `max_in_cpu`); one file per rank and group, read and written with nvme.aio.
  offload::ParamNvmeOptions param_nvme;
  /// Partitioner<Stage<3>>: fetching, prefetching, persistence (docs/stage3.md).
  Stage3Options stage3;
  /// Optimizer<OneBitAdam>: freeze_step; Optimizer<ZeroOneAdam>: zero_one (ignored by the others).
  OneBitOptions onebit;
  /// GradientCompression<TopK|TwoBit|Sign>: topk_ratio and huffman_coding (ignored without one).
  compress::GradientCompressionOptions compression;
};

}  // namespace zerotk
