#pragma once
/// \file zerotk/engine_config.hpp
/// From a resolved DeepSpeed config (zerotk/config/) to an Engine: the structure check, the run-time
/// options and the LR scheduler.
///
///   auto cfg = zerotk::config::load_file("ds_config.json", {.world_size = W});
///   using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
///                            zerotk::Precision<zerotk::fp16>>;
///   E engine(comm, model, zerotk::engine_options<E>(cfg));   // throws if cfg asks for another structure
///   if (auto s = zerotk::lr_scheduler(cfg)) engine.set_scheduler(*s);

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/optim/schedulers.hpp"

namespace zerotk {

/// The numbers of `cfg` as EngineOptions for engine type E. Throws one config_error listing every
/// way `cfg` asks for a structure E was not compiled with, or a setting this version cannot honour.
template <class E>
EngineOptions engine_options(const config::Config& cfg) {
  std::vector<config_error> problems = config::check_structure<E>(cfg);
  // What no engine of this version can run (stage 3, offload, 1-bit optimizers, prescaling, ...):
  // the one table in config/structure.hpp.
  for (config_error& e : config::check_buildable(cfg)) problems.push_back(std::move(e));
  // A Config may be built in code, so the narrowing conversions below are checked here too.
  using S = typename E::storage_type;
  if (cfg.zero_optimization.offload_optimizer.device == config::OffloadDevice::nvme) {
    const config::AioOptions& a = cfg.aio;
    if (a.block_size % 4096 != 0 || a.block_size > (std::int64_t{1} << 30)) {
      problems.emplace_back("must be a multiple of 4096 bytes up to 1 GiB (O_DIRECT alignment)", "/aio/block_size",
                            std::to_string(a.block_size));
    }
    if (a.queue_depth > 4096) problems.emplace_back("must be <= 4096", "/aio/queue_depth", std::to_string(a.queue_depth));
    if (a.intra_op_parallelism > 64) {
      problems.emplace_back("must be <= 64", "/aio/intra_op_parallelism", std::to_string(a.intra_op_parallelism));
    }
  }
  const std::int64_t bucket = cfg.zero_optimization.reduce_bucket_size;  // elements, as in DeepSpeed
  if (bucket < 1) {
    problems.emplace_back("must be >= 1 (elements per bucket)", "/zero_optimization/reduce_bucket_size",
                          std::to_string(bucket));
  } else if (static_cast<std::uint64_t>(bucket) > std::numeric_limits<std::size_t>::max() / sizeof(S)) {
    problems.emplace_back("is too large: elements * " + std::to_string(sizeof(S)) + " bytes overflows a byte count",
                          "/zero_optimization/reduce_bucket_size", std::to_string(bucket));
  }
  if (cfg.zero_optimization.sub_group_size < 1) {
    problems.emplace_back("must be >= 1 (elements)", "/zero_optimization/sub_group_size",
                          std::to_string(cfg.zero_optimization.sub_group_size));
  }
  if (cfg.gradient_accumulation_steps < 1 || cfg.gradient_accumulation_steps > std::numeric_limits<int>::max()) {
    problems.emplace_back("must be an integer in [1, " + std::to_string(std::numeric_limits<int>::max()) + "]",
                          "/gradient_accumulation_steps", std::to_string(cfg.gradient_accumulation_steps));
  }
  if (cfg.optimizer) {
    for (const optim::OptionProblem& p : optim::problems(cfg.optimizer->params)) {
      const std::string key(config::optimizer_param_key(p.field));
      const std::string rule = key == p.field ? p.rule : std::string(p.field) + " " + p.rule;
      problems.emplace_back(rule, "/optimizer/params/" + key, optim::detail::double_text(p.value));
    }
  }
  // A Config may be built in code: the reader's (0, 1] check again (NaN fails both comparisons).
  if (const double r = cfg.gradient_compression.topk_ratio; !(r > 0.0 && r <= 1.0)) {
    problems.emplace_back("must be a finite number in (0, 1]", "/gradient_compression/topk_ratio",
                          config::detail::num_text(r));
  }
  if (!problems.empty()) throw config::summarize(problems);

  EngineOptions o;
  o.bucket_bytes = static_cast<std::size_t>(bucket) * sizeof(S);
  o.gradient_accumulation_steps = static_cast<int>(cfg.gradient_accumulation_steps);
  o.gradient_clipping = cfg.gradient_clipping;
  o.overlap_comm = cfg.zero_optimization.overlap_comm;
  if (cfg.optimizer) {
    o.optimizer = cfg.optimizer->params;
    o.onebit.freeze_step = cfg.optimizer->freeze_step;  // OneBitAdam's; the reader checked it >= 0
    o.onebit.zero_one = cfg.optimizer->zero_one;        // ZeroOneAdam's; checked again when the engine is built
    o.onebit.lamb = {cfg.optimizer->coeff_beta, cfg.optimizer->factor_max, cfg.optimizer->factor_min,
                     cfg.optimizer->factor_threshold};  // OneBitLamb's
  }
  // The fp16 block is the scaler's own options plus `enabled` (config/options.hpp).
  o.loss_scaler = static_cast<const LossScalerOptions&>(cfg.fp16);
  // DeepSpeed adds micro-steps' gradients in the training precision unless told otherwise: a
  // DeepSpeed config reproduces that order (EngineOptions alone defaults to fp32; docs/engine.md).
  o.grad_accum_dtype = cfg.data_types.grad_accum_dtype.value_or(cfg.precision());
  o.fp32_module_types = cfg.fp16_override_modules;
  o.sub_group_size = static_cast<std::size_t>(cfg.zero_optimization.sub_group_size);  // reader: >= 1
  // stage3_* keys (elements; the reader checked them >= 0 and resolved "auto" from the hidden size).
  const config::ZeroOptions& z = cfg.zero_optimization;
  o.stage3.prefetch_bucket_size = static_cast<std::size_t>(z.stage3_prefetch_bucket_size);
  o.stage3.param_persistence_threshold = static_cast<std::size_t>(z.stage3_param_persistence_threshold);
  o.stage3.model_persistence_threshold = static_cast<std::size_t>(z.stage3_model_persistence_threshold);
  o.stage3.max_live_parameters = static_cast<std::size_t>(z.stage3_max_live_parameters);
  o.stage3.max_reuse_distance = static_cast<std::size_t>(z.stage3_max_reuse_distance);
  o.stage3.partitioned_module_types = cfg.zero_allowed_param_types;
  o.stage3.replicated_module_types = cfg.zero_force_param_types;
  // zero_hpz_partition_size (reader: >= 1, 1 below stage 3): FSDP2's reshard_after_forward = g.
  if (z.zero_hpz_partition_size > 1) {
    o.stage3.reshard_after_forward = ReshardAfterForward::group(static_cast<int>(z.zero_hpz_partition_size));
  }
  // Offload<Nvme>: offload_optimizer's swap keys and the aio block (values the reader checked >= 1;
  // the alignment and ranges the I/O layer needs were checked above).
  o.nvme.path = z.offload_optimizer.nvme_path;
  o.param_nvme.path = z.offload_param.nvme_path;  // OffloadParams<Nvme> (same aio block)
  o.param_nvme.buffer_count = static_cast<std::size_t>(z.offload_param.buffer_count);
  o.param_nvme.buffer_size = static_cast<std::size_t>(z.offload_param.buffer_size);
  o.param_nvme.max_in_cpu = static_cast<std::size_t>(z.offload_param.max_in_cpu);
  o.nvme.buffer_count = static_cast<std::size_t>(z.offload_optimizer.buffer_count);
  o.nvme.pipeline_read = z.offload_optimizer.pipeline_read;
  o.nvme.pipeline_write = z.offload_optimizer.pipeline_write;
  o.nvme.aio.block_size = static_cast<std::size_t>(cfg.aio.block_size);
  o.nvme.aio.queue_depth = static_cast<int>(cfg.aio.queue_depth);
  o.nvme.aio.intra_op_parallelism = static_cast<int>(cfg.aio.intra_op_parallelism);
  o.nvme.aio.single_submit = cfg.aio.single_submit;
  o.nvme.aio.overlap_events = cfg.aio.overlap_events;
  // The algorithm is E's GradientCompression tag (check_structure matched it); these are its knobs,
  // copied even for GradientCompression<None>, which reads neither.
  o.compression.topk_ratio = cfg.gradient_compression.topk_ratio;
  o.compression.huffman_coding = cfg.gradient_compression.huffman_coding;
  return o;
}

/// The scheduler of `cfg`, if it has one, at iteration -1 (the engine steps it).
inline std::optional<LrScheduler> lr_scheduler(const config::Config& cfg) {
  std::optional<LrScheduler> s;
  if (cfg.scheduler) {
    s.emplace(cfg.scheduler->params, cfg.optimizer ? cfg.optimizer->params.lr : optim::kDefaultOptimizerLr);
  }
  return s;
}

}  // namespace zerotk
