#pragma once
/// \file zerotk/engine/options.hpp
/// EngineOptions: the run-time numbers of an Engine, composed of each part's options. The
/// structure (stage, reduction schedule, precision, scaler, optimizer, device) is the Engine's
/// policies; engine/checks.hpp checks the numbers against it.

#include <algorithm>
#include <cmath>
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
#include "zerotk/core/error.hpp"
#include "zerotk/engine/communication.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/optim/onebit_options.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/parallel/split.hpp"
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/sparsity/options.hpp"
#include "zerotk/zero/options.hpp"

namespace zerotk {

/// The options of stage 3 and hpZ, by their former names (zero/options.hpp).
using Stage3Options = zero::Stage3Options;
using ReshardAfterForward = zero::ReshardAfterForward;

/// The boundary's options (engine/boundary_step.hpp): accumulation and clipping.
struct StepOptions {
  /// Micro-steps per optimizer step (DeepSpeed `gradient_accumulation_steps`; a config's batch
  /// triad resolves it).
  int gradient_accumulation_steps = 1;
  /// Global L2 norm clip (DeepSpeed `gradient_clipping`); 0 disables clipping (the norm is still reported).
  double gradient_clipping = 0.0;
  /// dtype in which gradients are accumulated over micro-steps (DeepSpeed `data_types.grad_accum_dtype`).
  /// Unset: schedules that reduce every micro-step add the reduced gradients in fp32; schedules that
  /// reduce at the boundary accumulate where backward writes (the working precision). Set to the
  /// working precision, reducing schedules add in it too (DeepSpeed's order, which a DeepSpeed config
  /// selects). fp32 with a 16-bit working precision needs a schedule that reduces every micro-step.
  std::optional<DType> grad_accum_dtype;

  void check(std::vector<config_error>& out) const {
    if (gradient_accumulation_steps < 1) {
      out.emplace_back("must be >= 1", "gradient_accumulation_steps", std::to_string(gradient_accumulation_steps));
    }
    if (!(gradient_clipping >= 0) || !std::isfinite(gradient_clipping)) {
      out.emplace_back("must be finite and >= 0", "gradient_clipping", to_text(gradient_clipping));
    }
  }
};

/// How the model's parameters are taken in (engine/registry.hpp): optimizer groups, the fp32-kept
/// ones, the initial values.
struct ModelOptions {
  /// Which group a parameter belongs to (by name); unset: group 0.
  std::function<std::uint32_t(std::string_view name)> group_of;
  /// Parameters kept in fp32 even in fp16/bf16 training (e.g. LayerNorm weights). Their Param type
  /// must hold float.
  std::function<bool(std::string_view name)> keep_fp32;
  /// Module type names whose parameters are kept in fp32 (DeepSpeed-style `fp16_override_modules`):
  /// matched against `M::module_type` of the model and of the sub-modules it lists with
  /// `modules(visit)` (core/concepts.hpp). Adds to `keep_fp32`.
  std::vector<std::string> fp32_module_types;
  /// Construction: take the values the parameters hold (their `data()` before binding) as the
  /// initial model, as DeepSpeed does (initialise, then wrap). Parameters whose `data()` is null
  /// start at zero; write them through the bound Params and call `initialize_master()` or
  /// `broadcast_parameters()`.
  bool adopt_initial_values = true;
  /// Tensor parallelism: how a parameter is split across the grid's tensor group (parallel/split.hpp).
  /// A parameter declares it itself with a `tensor_split()` member (parallel::SplitParam, made by
  /// parallel::ColumnParallelLinear::weight_param() and the like); this rule, by name, overrides the
  /// declaration where it answers a split, and leaves it where it answers replicated(). Neither:
  /// every tensor rank holds the parameter whole. A split parameter's Param holds this rank's shard. The global norm adds a split parameter's squares on
  /// every tensor rank and a replicated one's on one tensor rank; ZeRO partitions both over the
  /// data group. Every rank must declare the same splits (checked at construction).
  std::function<parallel::TensorSplit(std::string_view name)> tensor_split;
  /// Expert parallelism (moe/, docs/moe.md): parameters that belong to an expert, by name, besides
  /// those whose Param declares it with an `expert()` member answering true. ZeRO reduces and shards
  /// them over the grid's expert-data group, averaging over the data size (each expert's gradient
  /// already sums the tokens its expert group dispatched to it); dense parameters over the data
  /// group. On a plain communicator, or a grid without an expert layout, the two groups are the same.
  std::function<bool(std::string_view name)> expert;
  /// The model-parallel sizes a DeepSpeed config asked for (tensor_model_parallel_size, the pipeline
  /// stages), set by engine_options(cfg); empty when the options are not a config's. The engine
  /// refuses to be built on a communicator or grid whose tensor or pipeline size differs (the
  /// checker's rows config_tensor_size and config_pipeline_size, engine/checks.hpp): a trainer that
  /// builds no grid would otherwise train plain data parallel on a config that asks for tensor or
  /// pipeline parallelism (issue 57 item 15).
  struct ConfigGrid {
    int tensor = 1, pipeline = 1;
    int expert = 1;  ///< expert_parallel.autoep_size (the checker's row config_expert_size)
  };
  std::optional<ConfigGrid> config_grid;
};

/// Run-time settings, composed of each part's own options struct (each with its own check; the
/// config reader fills them directly): the boundary's (StepOptions), the model's (ModelOptions),
/// ZeRO's buckets (zero::BucketOptions), offload (offload::OffloadOptions) as bases, so their members
/// read as EngineOptions' own (`o.overlap_comm`, `o.sub_group_size`); the scaler's, stage 3's, the
/// 1-bit optimizers' and compression's as members. Defaults follow DeepSpeed where it has one.
struct EngineOptions : StepOptions, ModelOptions, zero::BucketOptions, offload::OffloadOptions {
  // Out of line and out of -Wdeprecated-declarations' sight, so that only a use of bucket_bytes warns.
  EngineOptions();
  EngineOptions(const EngineOptions&);
  EngineOptions(EngineOptions&&) noexcept;
  EngineOptions& operator=(const EngineOptions&);
  EngineOptions& operator=(EngineOptions&&) noexcept;
  ~EngineOptions();

  /// Deprecated: the bucket size in bytes of the working precision, which gave the fp32-kept group
  /// half the elements under fp16/bf16. Use reduce_bucket_size (elements, both groups); a non-zero
  /// value here is taken as bucket_bytes / sizeof(working precision) elements.
  [[deprecated("use reduce_bucket_size (elements, as DeepSpeed counts it)")]] std::size_t bucket_bytes = 0;
  /// Parameter groups; group 0 is the default. Empty: one group with `optimizer`.
  std::vector<ParamGroup> groups;
  OptimizerOptions optimizer;
  LossScalerOptions loss_scaler;
  /// Device<Cuda>: the cudaStream_t the trainer's forward and backward run on (null: the legacy
  /// default stream). The engine orders its kernels and collectives after the work queued there.
  void* stream = nullptr;
  /// Partitioner<Stage<3>>: fetching, prefetching, persistence (docs/stage3.md).
  Stage3Options stage3;
  /// Optimizer<OneBitAdam>: freeze_step; Optimizer<ZeroOneAdam>: zero_one (ignored by the others).
  OneBitOptions onebit;
  /// GradientCompression<TopK|TwoBit|Sign>: topk_ratio and huffman_coding (ignored without one).
  compress::GradientCompressionOptions compression;
  /// The data group's topology and the slow-rank detector (config: the `communication` block).
  CommunicationOptions communication;
  /// Sparsity<NofM<N, M>>: which parameters, and after how many dense steps the masks are chosen
  /// (ignored without the policy).
  sparsity::SparsityOptions sparsity;

  /// Every part's values out of range, each naming the DeepSpeed key and the value (empty: none).
  /// `swaps`: the engine reads or writes a swap file (the aio block then matters).
  std::vector<config_error> problems(bool swaps = true) const {
    std::vector<config_error> out;
    StepOptions::check(out);
    BucketOptions::check(out);
    OffloadOptions::check(out, swaps);
    stage3.check(out);
    onebit.check(out);
    compression.check(out);
    communication.check(out);
    sparsity.check(out);
    return out;
  }

  /// Elements per bucket: reduce_bucket_size, else the deprecated bucket_bytes, else the Bucketer
  /// policy's `policy_bytes`, over the working precision's `element_bytes`.
  std::size_t bucket_numel(std::size_t policy_bytes, std::size_t element_bytes) const {
    if (reduce_bucket_size) return reduce_bucket_size;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    const std::size_t bytes = bucket_bytes ? bucket_bytes : policy_bytes;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    return std::max<std::size_t>(1, bytes / element_bytes);
  }
};

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
inline EngineOptions::EngineOptions() = default;
inline EngineOptions::EngineOptions(const EngineOptions&) = default;
inline EngineOptions::EngineOptions(EngineOptions&&) noexcept = default;
inline EngineOptions& EngineOptions::operator=(const EngineOptions&) = default;
inline EngineOptions& EngineOptions::operator=(EngineOptions&&) noexcept = default;
inline EngineOptions::~EngineOptions() = default;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

}  // namespace zerotk
