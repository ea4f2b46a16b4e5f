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
/// Where a layer has its own options struct, the config holds that struct and the reader fills it
/// directly (no mirrored fields): the `fp16` block is precision's LossScalerOptions, the optimizer's
/// hyper-parameters are optim's OptimizerOptions, each schedule's params are optim's options of
/// that schedule. Their members keep the layer's names where they differ from DeepSpeed's keys
/// (`loss_scale` -> `static_scale`, `betas` -> `beta1`/`beta2`, `max_coeff` -> `lamb_max_coeff`).

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

#include "zerotk/core/dtype.hpp"
#include "zerotk/optim/options.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/optim/zero_one_schedule.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk::config {

// ---- enumerations -------------------------------------------------------------------------------

/// How the loss is scaled: DeepSpeed's fp16 `loss_scale` 0 -> dynamic, > 0 -> static; bf16/fp32 -> none.
enum class ScalerKind : std::uint8_t { none, static_scale, dynamic };

/// Optimizers zerotk implements. JSON "Adam" maps to adamw unless `"adam_w_mode": false`.
enum class OptimizerKind : std::uint8_t { adam, adamw, lamb, onebit_adam, onebit_lamb, zero_one_adam };

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

/// The DeepSpeed spelling of the optimizer type ("Adam", "AdamW", "Lamb", "OneBitAdam", "OneBitLamb",
/// "ZeroOneAdam").
constexpr std::string_view to_string(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::adam: return "Adam";
    case OptimizerKind::adamw: return "AdamW";
    case OptimizerKind::lamb: return "Lamb";
    case OptimizerKind::onebit_adam: return "OneBitAdam";
    case OptimizerKind::onebit_lamb: return "OneBitLamb";
    case OptimizerKind::zero_one_adam: return "ZeroOneAdam";
  }
  return "unknown";
}

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

/// `zero_optimization.offload_optimizer` (stages 1-3; nvme swaps only with stage 3).
struct OffloadOptimizerOptions {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;            ///< required for nvme
  std::int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
};

/// `zero_optimization.offload_param` (stage 3 only).
struct OffloadParamOptions {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;            ///< required for nvme
  std::int64_t buffer_count = 5;
  std::int64_t buffer_size = 100'000'000;   ///< elements per swap buffer
  std::int64_t max_in_cpu = 1'000'000'000;  ///< elements kept in CPU memory with nvme
  bool pin_memory = true;
};

/// `zero_optimization` block (SEMANTICS.md sections 6-8). Sizes in elements.
struct ZeroOptions {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500'000'000;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;        ///< resolved: DeepSpeed's default is true for stage 3 only
  bool load_from_fp32_weights = true;
  OffloadOptimizerOptions offload_optimizer;
  OffloadParamOptions offload_param;
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  std::int64_t stage3_param_persistence_threshold = 100'000;
  std::int64_t stage3_model_persistence_threshold = std::numeric_limits<std::int64_t>::max();
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  /// ZeRO++ hpZ: ranks per group of the secondary parameter shard (1: off). Stage 3 only; divides the
  /// world size (EngineOptions: Stage3Options::reshard_after_forward = ReshardAfterForward::group(g)).
  std::int64_t zero_hpz_partition_size = 1;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
};

/// `aio` block: NVMe swapping I/O (SEMANTICS.md section 8).
struct AioOptions {
  std::int64_t block_size = 1 << 20;  ///< bytes per I/O request
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;  ///< old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
};

/// `optimizer` block: the type, the hyper-parameters in the optimizer layer's own struct (filled
/// from `params`: `lr`, `betas` -> beta1/beta2, `eps`, `weight_decay`, `bias_correction`,
/// `min_coeff`/`max_coeff` -> lamb_min_coeff/lamb_max_coeff), and the params zerotk's
/// OptimizerOptions has no home for yet. Only the fields of `kind` are meaningful; the rest keep
/// DeepSpeed's defaults.
struct OptimizerBlock {
  OptimizerKind kind = OptimizerKind::adamw;
  zerotk::OptimizerOptions params;  ///< what EngineOptions::optimizer receives
  bool adam_w_mode = true;          ///< decoupled weight decay (Adam/AdamW/1-bit Adam)
  std::int64_t freeze_step = 100'000;  ///< OneBitAdam, OneBitLamb: warm-up steps before compression
  optim::ZeroOneOptions zero_one;   ///< ZeroOneAdam: var_freeze_step, var_update_scaler, local_step_*
  bool cuda_aware = false;          ///< 1-bit: communication back end may use device buffers
  std::string comm_backend_name = "nccl";
  double coeff_beta = 0.9;          ///< 1-bit LAMB
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;
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

/// `data_types` block.
struct DataTypesOptions {
  /// The dtype micro-steps' gradients are accumulated in; empty: the training precision (DeepSpeed's default).
  std::optional<DType> grad_accum_dtype;
};

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
struct GradientCompressionConfig {
  std::optional<CompressionAlgorithm> algorithm;
  double topk_ratio = 0.01;     ///< fraction of entries top-k keeps, in (0, 1]
  bool huffman_coding = false;  ///< entropy-code the payload (lossless)
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

/// A fully resolved DeepSpeed config: no "auto" left, batch triad consistent with world_size.
struct Config {
  int world_size = 1;  ///< data-parallel ranks the batch triad was resolved for
  std::int64_t train_batch_size = 1;
  std::int64_t train_micro_batch_size_per_gpu = 1;
  std::int64_t gradient_accumulation_steps = 1;

  double gradient_clipping = 1.0;   ///< 0 disables clipping
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<DType> communication_data_type;  ///< empty: reduce in the gradient dtype
  DataTypesOptions data_types;
  /// Module type names whose parameters stay fp32 in fp16/bf16 training (e.g. "LayerNorm"). zerotk's own
  /// key: DeepSpeed 0.19 has no `fp16_override_modules`.
  std::vector<std::string> fp16_override_modules;
  /// zerotk's own top-level keys: stage 3 partitions only the parameters of modules of these types
  /// (empty: every module's), and never those of `zero_force_param_types`; the others stay gathered
  /// on every rank (EngineOptions::stage3, docs/stage3.md).
  std::vector<std::string> zero_allowed_param_types;
  std::vector<std::string> zero_force_param_types;

  Fp16Options fp16;
  Bf16Options bf16;
  ZeroOptions zero_optimization;
  AioOptions aio;
  std::optional<OptimizerBlock> optimizer;
  std::optional<SchedulerOptions> scheduler;
  CsvMonitorOptions csv_monitor;
  GradientCompressionConfig gradient_compression;
  ActivationCheckpointingOptions activation_checkpointing;

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
