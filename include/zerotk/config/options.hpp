#pragma once
/// \file zerotk/config/options.hpp
/// Typed training options, named and defaulted like DeepSpeed's JSON config (SEMANTICS.md), so a
/// trainer can hold what a ds_config.json says without depending on a JSON library. The reader
/// (config/reader.hpp) fills a Config from JSON, resolves "auto" and the batch triad; everything
/// here is plain data plus the few derived facts other layers need (precision, scaler kind,
/// structure).
///
/// Member names are the JSON keys, so `cfg.zero_optimization.stage3_prefetch_bucket_size` is
/// `/zero_optimization/stage3_prefetch_bucket_size`. Bucket and threshold sizes count ELEMENTS,
/// as in DeepSpeed, not bytes.
///
/// Where a part has its own options struct, the config holds that struct whole and the reader fills
/// it directly (no mirrored fields; engine_config.hpp composes EngineOptions from the parts, one
/// assignment each): the `fp16` block is precision's LossScalerOptions; the optimizer's
/// hyper-parameters optim's OptimizerOptions and the 1-bit keys its OneBitOptions; each schedule's
/// params optim's options of that schedule; `zero_optimization` is ZeRO's BucketOptions and
/// offload's OffloadOptions (with the `offload_*` blocks' swap keys and the `aio` block as
/// `nvme`, `param_nvme` and `nvme.aio`), and holds stage 3's Stage3Options (`stage3_*`,
/// `zero_hpz_partition_size`, and the top-level `zero_allowed_param_types` /
/// `zero_force_param_types`); the top level is the boundary's StepOptions (`gradient_clipping`,
/// `gradient_accumulation_steps`, `data_types.grad_accum_dtype`); `gradient_compression` is
/// compress's GradientCompressionOptions. Their members keep the part's names where they differ
/// from DeepSpeed's keys (`loss_scale` -> `static_scale`, `betas` -> `beta1`/`beta2`,
/// `max_coeff` -> `lamb_max_coeff`, `nvme_path` -> `path`); docs/config.md has the table.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "zerotk/compress/gradient_options.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/validation.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/io/aio_options.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/optim/onebit_options.hpp"
#include "zerotk/optim/options.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/optim/zero_one_schedule.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/zero/options.hpp"

namespace zerotk::config {

// ---- enumerations -------------------------------------------------------------------------------

/// How the loss is scaled: DeepSpeed's fp16 `loss_scale` 0 -> dynamic, > 0 -> static; bf16/fp32 -> none.
enum class ScalerKind : std::uint8_t { none, static_scale, dynamic };

/// What the config layer reads of an optimizer tag (policies.hpp): one row per tag, made from the
/// tags themselves (no table of its own).
struct OptimizerInfo {
  std::string_view name;  ///< DeepSpeed's "type"
  unsigned params;        ///< the `optimizer.params` keys it reads (optimizer_params flags)
  std::size_t moments;    ///< per-element moments beside the master (1 or 2)
  bool one_bit, whole_partition;
};
namespace detail {
template <class... Ts>
constexpr std::array<OptimizerInfo, sizeof...(Ts)> optimizer_infos(type_list<Ts...>) {
  return {{{Ts::name, Ts::params, Ts::moments, Ts::one_bit, Ts::whole_partition}...}};
}
template <class Tag, class... Ts>
constexpr std::uint8_t tag_index(type_list<Ts...>) {
  static_assert((std::is_same_v<Tag, Ts> || ...), "OptimizerKind::of<Tag>: Tag is not in zerotk::optimizer_tags");
  std::uint8_t i = 0, found = 0;
  ((std::is_same_v<Tag, Ts> ? (found = i, ++i) : ++i), ...);
  return found;
}
}  // namespace detail
inline constexpr auto kOptimizerInfos = detail::optimizer_infos(optimizer_tags{});

/// An optimizer zerotk implements: an index into zerotk::optimizer_tags (policies.hpp), whose tags
/// carry the DeepSpeed name and the traits. JSON "Adam" maps to adamw unless `"adam_w_mode": false`.
class OptimizerKind {
 public:
  static const OptimizerKind adam, adamw, lamb, onebit_adam, onebit_lamb, zero_one_adam;

  /// The kind of optimizer tag `Tag` (a compile error for a tag not in optimizer_tags).
  template <class Tag>
  static constexpr OptimizerKind of() {
    return OptimizerKind(detail::tag_index<Tag>(optimizer_tags{}));
  }
  /// Every kind, in optimizer_tags' order.
  static constexpr std::size_t count() noexcept { return kOptimizerInfos.size(); }
  static constexpr OptimizerKind at(std::size_t i) noexcept { return OptimizerKind(static_cast<std::uint8_t>(i)); }

  /// DeepSpeed's spelling of the type ("Adam", "AdamW", "Lamb", ...).
  constexpr std::string_view name() const noexcept { return kOptimizerInfos[i_].name; }
  /// It compresses exchanges of its own (the 1-bit optimizers), and its step needs the whole
  /// partition at once (LAMB): the traits of its tag.
  constexpr bool one_bit() const noexcept { return kOptimizerInfos[i_].one_bit; }
  constexpr bool whole_partition() const noexcept { return kOptimizerInfos[i_].whole_partition; }
  /// The `optimizer.params` keys it reads (zerotk::optimizer_params flags).
  constexpr unsigned params() const noexcept { return kOptimizerInfos[i_].params; }
  constexpr std::size_t moments() const noexcept { return kOptimizerInfos[i_].moments; }
  /// Whether it reads key group `flag` (an optimizer_params flag).
  constexpr bool reads(unsigned flag) const noexcept { return (params() & flag) != 0; }
  constexpr std::size_t index() const noexcept { return i_; }

  friend constexpr bool operator==(OptimizerKind, OptimizerKind) = default;

 private:
  constexpr explicit OptimizerKind(std::uint8_t i) noexcept : i_(i) {}
  std::uint8_t i_ = 0;
};
inline constexpr OptimizerKind OptimizerKind::adam = OptimizerKind::of<Adam>();
inline constexpr OptimizerKind OptimizerKind::adamw = OptimizerKind::of<AdamW>();
inline constexpr OptimizerKind OptimizerKind::lamb = OptimizerKind::of<Lamb>();
inline constexpr OptimizerKind OptimizerKind::onebit_adam = OptimizerKind::of<OneBitAdam>();
inline constexpr OptimizerKind OptimizerKind::onebit_lamb = OptimizerKind::of<OneBitLamb>();
inline constexpr OptimizerKind OptimizerKind::zero_one_adam = OptimizerKind::of<ZeroOneAdam>();

/// Where offloaded state lives (`offload_optimizer.device`, `offload_param.device`).
enum class OffloadDevice : std::uint8_t { none, cpu, nvme };

/// `gradient_compression.algorithm`: "topk", "2bit", "1bit" (GradientCompression<TopK|TwoBit|Sign>).
enum class CompressionAlgorithm : std::uint8_t { topk, two_bit, one_bit };

/// The schedules, in the order of optim::LrSchedulerOptions' alternatives.
enum class SchedulerKind : std::uint8_t { warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, lr_range_test };

constexpr std::string_view to_string(ScalerKind k) noexcept {
  switch (k) {
    case ScalerKind::none: return "none";
    case ScalerKind::static_scale: return "static";
    case ScalerKind::dynamic: return "dynamic";
  }
  return "unknown";
}

/// The DeepSpeed spelling of the optimizer type ("Adam", "AdamW", "Lamb", ...): its tag's name.
constexpr std::string_view to_string(OptimizerKind k) noexcept { return k.name(); }

constexpr std::string_view to_string(OffloadDevice d) noexcept {
  switch (d) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
  }
  return "unknown";
}

/// The config's spelling of the algorithm ("topk", "2bit", "1bit").
constexpr std::string_view to_string(CompressionAlgorithm a) noexcept {
  switch (a) {
    case CompressionAlgorithm::topk: return "topk";
    case CompressionAlgorithm::two_bit: return "2bit";
    case CompressionAlgorithm::one_bit: return "1bit";
  }
  return "unknown";
}

/// The DeepSpeed spelling of the scheduler type ("WarmupLR", ...).
constexpr std::string_view to_string(SchedulerKind k) noexcept {
  switch (k) {
    case SchedulerKind::warmup_lr: return "WarmupLR";
    case SchedulerKind::warmup_decay_lr: return "WarmupDecayLR";
    case SchedulerKind::warmup_cosine_lr: return "WarmupCosineLR";
    case SchedulerKind::one_cycle: return "OneCycle";
    case SchedulerKind::lr_range_test: return "LRRangeTest";
  }
  return "unknown";
}

// ---- blocks -------------------------------------------------------------------------------------

/// `fp16` block: mixed precision with loss scaling (SEMANTICS.md section 1). Its scaler keys fill
/// the loss scaler's own options: `loss_scale` is `static_scale` (0: dynamic scaling; > 0: this
/// fixed scale); `initial_scale_power`, `loss_scale_window`, `hysteresis`, `consecutive_hysteresis`
/// and `min_loss_scale` keep their names. (A base rather than a member, so `cfg.fp16.hysteresis`
/// reads like the JSON; the API-only `raise_error_at_min_scale` and `skip_on_overflow` keep their
/// defaults.)
struct Fp16Options : precision::LossScalerOptions {
  bool enabled = false;

  /// The scale of the first step: 2^initial_scale_power when dynamic, else the static scale.
  double initial_scale() const noexcept {
    return static_scale == 0 ? std::pow(2.0, initial_scale_power) : static_scale;  // as LossScaler<Dynamic>
  }
};

/// `bf16` block (old name `bfloat16`). No scaling; the inf/NaN check still skips steps.
struct Bf16Options {
  bool enabled = false;
};

/// `zero_optimization.offload_optimizer` (stages 1-3; nvme swaps only with stage 3): the device
/// (the Offload policy) and pin_memory. Its swap keys (nvme_path, buffer_count, pipeline_read,
/// pipeline_write) are offload's NvmeOptions: ZeroOptions::nvme.
struct OffloadOptimizerOptions {
  OffloadDevice device = OffloadDevice::none;
  bool pin_memory = true;
};

/// `zero_optimization.offload_param` (stage 3 only): the device (the OffloadParams policy) and
/// pin_memory. Its swap keys (nvme_path, buffer_count, buffer_size, max_in_cpu) are offload's
/// ParamNvmeOptions: ZeroOptions::param_nvme.
struct OffloadParamOptions {
  OffloadDevice device = OffloadDevice::none;
  bool pin_memory = true;
};

/// `aio` block: NVMe swapping I/O (SEMANTICS.md section 8), held as ZeroOptions::nvme.aio.
using AioOptions = io::AioOptions;

/// `zero_optimization` block (SEMANTICS.md sections 6-8), with DeepSpeed's defaults. Sizes in
/// elements. It is ZeRO's BucketOptions (`reduce_bucket_size`, `overlap_comm`) and offload's
/// OffloadOptions (`sub_group_size`; `nvme`: offload_optimizer's swap keys and the `aio` block;
/// `param_nvme`: offload_param's), and holds stage 3's options (`stage3`).
struct ZeroOptions : zero::BucketOptions, offload::OffloadOptions {
  ZeroOptions() {
    reduce_bucket_size = 500'000'000;  // DeepSpeed's default (BucketOptions' 0 is the Bucketer policy's)
    overlap_comm = false;              // resolved by the reader: DeepSpeed's default is true for stage 3 only
  }
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool load_from_fp32_weights = true;
  OffloadOptimizerOptions offload_optimizer;
  OffloadParamOptions offload_param;
  /// `stage3_prefetch_bucket_size`, `stage3_param_persistence_threshold`,
  /// `stage3_model_persistence_threshold`, `stage3_max_live_parameters`,
  /// `stage3_max_reuse_distance`, `zero_hpz_partition_size` (reshard_after_forward = group(g)), and
  /// the top-level `zero_allowed_param_types` / `zero_force_param_types` (partitioned_module_types,
  /// replicated_module_types).
  zero::Stage3Options stage3;
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
};

/// `optimizer` block: the type, the hyper-parameters in the optimizer layer's own struct (filled
/// from `params`: `lr`, `betas` -> beta1/beta2, `eps`, `weight_decay`, `bias_correction`,
/// `min_coeff`/`max_coeff` -> lamb_min_coeff/lamb_max_coeff), and the params zerotk's
/// OptimizerOptions has no home for yet. Only the fields of `kind` are meaningful; the rest keep
/// DeepSpeed's defaults.
///
/// It is the 1-bit optimizers' OneBitOptions (what EngineOptions::onebit receives): `freeze_step`
/// (OneBitAdam, OneBitLamb), `zero_one` (ZeroOneAdam's var_freeze_step, var_update_scaler,
/// local_step_*), `lamb` (OneBitLamb's coeff_beta, factor_max, factor_min, factor_threshold).
struct OptimizerBlock : OneBitOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  zerotk::OptimizerOptions params;  ///< what EngineOptions::optimizer receives
  bool adam_w_mode = true;          ///< decoupled weight decay (Adam/AdamW/1-bit Adam)
  bool cuda_aware = false;          ///< 1-bit: communication back end may use device buffers
  std::string comm_backend_name = "nccl";
};

/// The key under `/optimizer/params` that fills OptimizerOptions member `field`.
constexpr std::string_view optimizer_param_key(std::string_view field) noexcept {
  if (field == "beta1" || field == "beta2") return "betas";
  if (field == "lamb_min_coeff") return "min_coeff";
  if (field == "lamb_max_coeff") return "max_coeff";
  return field;
}

/// `scheduler` block: the schedule's own options (optim/schedulers.hpp; the alternative is the type),
/// resolved by the reader: every optional a schedule derives from another value is set
/// (WarmupLR's warmup_max_lr, OneCycle's second step size and stair count).
struct SchedulerOptions {
  optim::LrSchedulerOptions params;
  std::int64_t last_batch_iteration = -1;  ///< `params.last_batch_iteration`: -1 before the first step
  SchedulerKind kind() const noexcept { return static_cast<SchedulerKind>(params.index()); }
};
static_assert(std::variant_size_v<optim::LrSchedulerOptions> == 5 &&
              std::is_same_v<std::variant_alternative_t<static_cast<std::size_t>(SchedulerKind::one_cycle),
                                                        optim::LrSchedulerOptions>,
                             optim::OneCycleOptions>,
              "SchedulerKind follows the order of optim::LrSchedulerOptions");


/// `csv_monitor` block (SEMANTICS.md section 11): files in output_path/job_name on rank 0.
struct CsvMonitorOptions {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

/// `gradient_compression` block (SEMANTICS.md section 9b): stage 0's gradient all-reduce sends a
/// compressed payload with error feedback. No algorithm (block or key absent): no compression.
/// `topk_ratio` is used by "topk" only and `huffman_coding` by every algorithm; both are accepted
/// without an algorithm (published configs carry them) and then do nothing.
/// It is compress's GradientCompressionOptions (topk_ratio, huffman_coding), plus the algorithm
/// (the GradientCompression policy).
struct GradientCompressionConfig : compress::GradientCompressionOptions {
  std::optional<CompressionAlgorithm> algorithm;
};

/// `activation_checkpointing` block.
struct ActivationCheckpointingOptions {
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;
  bool cpu_checkpointing = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

/// What happens when ranks pass different checkpoint tags (DeepSpeed's `checkpoint.tag_validation`;
/// checkpoint::SaveOptions / LoadOptions take it, as checkpoint::TagValidation).
using TagValidation = ValidationMode;

/// `checkpoint` block. Only tag_validation acts (hand it to checkpoint::SaveOptions / LoadOptions);
/// the other keys are read so that the reader can say why each one has no effect here.
struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::warn;
  bool load_universal = false;                 ///< every zerotk checkpoint loads resharded: no effect
  bool use_node_local_storage = false;         ///< not supported: ranks read rank 0's manifest
  bool parallel_write_pipeline_stage = false;  ///< every rank writes its own file already: no effect
};

/// How DeepSpeed's `pipeline.partition` assigns layers to stages (pipeline::partition_uniform /
/// partition_balanced over parameter counts).
enum class PipelinePartition : std::uint8_t { parameters, uniform };

/// Pipeline parallelism: zerotk's `pipeline_parallelism` block (the seeds' `num_stages`, and
/// `schedule`) and DeepSpeed's `pipeline` block where it means something here.
struct PipelineConfig {
  int stages = 1;                     ///< pipeline_parallelism.num_stages, or pipeline.stages
  std::string schedule = "1f1b";      ///< gpipe, 1f1b, interleaved:V, zbh1 (pipeline::ScheduleSpec)
  PipelinePartition partition = PipelinePartition::parameters;  ///< pipeline.partition ("best" is parameters)
  std::int64_t activation_checkpoint_interval = 0;  ///< pipeline.activation_checkpoint_interval (the trainer's)
};

/// What a config asks of the compiled Engine: the parts chosen at compile time by policies.
struct Structure {
  int stage = 0;
  DType precision = DType::fp32;
  ScalerKind scaler = ScalerKind::none;
  std::optional<OptimizerKind> optimizer;  ///< empty: no optimizer block (the engine's own is used)
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;
  std::optional<CompressionAlgorithm> compression;  ///< empty: GradientCompression<None>

  friend bool operator==(const Structure&, const Structure&) = default;
};

/// A fully resolved DeepSpeed config: no "auto" left, batch triad consistent with world_size. The
/// top level is the boundary's StepOptions: `gradient_accumulation_steps` (the batch triad's),
/// `gradient_clipping`, and `grad_accum_dtype` (the `data_types` block's key; the reader resolves
/// an absent one to the training precision, DeepSpeed's default).
struct Config : StepOptions {
  Config() { gradient_clipping = 1.0; }  // DeepSpeed 0.19's default (StepOptions' 0 is no clipping)

  /// Every rank of the job (ResolveContext::world_size): tensor x pipeline x data_parallel_size.
  int world_size = 1;
  /// Ranks a layer's matrices are split across (zerotk's `tensor_model_parallel_size`, DeepSpeed's
  /// `tensor_parallel.autotp_size`); 1 when neither is given. The model must be written tensor
  /// parallel (zerotk::parallel) and declare its splits: nothing is split automatically.
  int tensor_parallel_size = 1;
  /// Ranks ZeRO partitions over: world_size / (tensor x pipeline), context ranks included.
  int data_parallel_size = 1;
  /// Context parallelism (DeepSpeed's `sequence_parallel_size`, Megatron's context size): each
  /// replica's sequences split over this many of its data ranks (zerotk::grid_shape's context;
  /// docs/context.md). The batch triad counts replicas, data_parallel_size / sequence_parallel_size,
  /// as DeepSpeed's does; ZeRO still partitions over all data_parallel_size ranks. 1: none.
  int sequence_parallel_size = 1;
  /// The replicas the batch triad counts: data_parallel_size / sequence_parallel_size.
  int replica_count() const noexcept { return data_parallel_size / sequence_parallel_size; }
  /// Expert parallelism (DeepSpeed's `expert_parallel` block: `autoep_size` when `enabled`): the
  /// expert size of the grid the engine is built on (zerotk::grid_shape(cfg); docs/moe.md). The
  /// experts are the parameters the model declares (Param::expert(), EngineOptions::expert); 1: none
  /// apart from the data group.
  int expert_parallel_size = 1;
  /// DeepSpeed's `sparse_attention` block (config/sparse_attention.hpp, docs/context.md): the layout
  /// config of a block-sparse attention (context::make_layout), its `heads` the model's to fill;
  /// empty when the block is absent. The engine does not read it: the model's attention does.
  std::optional<context::SparsityConfig> sparse_attention;
  /// Stages the layers are split across and the schedule that runs them (pipeline.stages 1: none).
  PipelineConfig pipeline;
  std::int64_t train_batch_size = 1;
  std::int64_t train_micro_batch_size_per_gpu = 1;

  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<DType> communication_data_type;  ///< empty: reduce in the gradient dtype
  /// Module type names whose parameters stay fp32 in fp16/bf16 training (e.g. "LayerNorm"). zerotk's own
  /// key: DeepSpeed 0.19 has no `fp16_override_modules` (EngineOptions::fp32_module_types).
  std::vector<std::string> fp16_override_modules;

  Fp16Options fp16;
  Bf16Options bf16;
  ZeroOptions zero_optimization;  ///< with the `aio` block as zero_optimization.nvme.aio
  std::optional<OptimizerBlock> optimizer;
  std::optional<SchedulerOptions> scheduler;
  CsvMonitorOptions csv_monitor;
  GradientCompressionConfig gradient_compression;
  ActivationCheckpointingOptions activation_checkpointing;
  CheckpointConfig checkpoint;
  /// `communication` block (zerotk's keys, config/communication.hpp): the data group's topology and
  /// the slow-rank detector, what EngineOptions::communication receives.
  CommunicationOptions communication;

  /// Compute precision: fp16 or bf16 when that block is enabled, else fp32.
  DType precision() const noexcept {
    return fp16.enabled ? DType::fp16 : (bf16.enabled ? DType::bf16 : DType::fp32);
  }
  /// fp16 with loss_scale 0 -> dynamic, fp16 with loss_scale > 0 -> static, else none.
  ScalerKind scaler() const noexcept {
    if (!fp16.enabled) return ScalerKind::none;
    return fp16.static_scale == 0 ? ScalerKind::dynamic : ScalerKind::static_scale;
  }
  Structure structure() const {
    Structure s;
    s.stage = zero_optimization.stage;
    s.precision = precision();
    s.scaler = scaler();
    if (optimizer) s.optimizer = optimizer->kind;
    s.offload_optimizer = zero_optimization.offload_optimizer.device;
    s.offload_param = zero_optimization.offload_param.device;
    s.compression = gradient_compression.algorithm;
    return s;
  }
};

}  // namespace zerotk::config
