#pragma once
/// \file zerotk/config/engine_options.hpp
/// A resolved config's numbers as EngineOptions. The config holds each part's own options struct
/// (config/options.hpp), so this composes them, one assignment per part, the same for every engine
/// type: zerotk/engine_config.hpp's engine_options<E> adds the structure and value checks, and
/// config::check_buildable runs the engine checker's rows (engine/checks.hpp) over it.

#include "zerotk/config/options.hpp"
#include "zerotk/engine/options.hpp"

namespace zerotk::config {

/// `cfg` as EngineOptions, unchecked.
inline EngineOptions engine_options_of(const Config& cfg) {
  EngineOptions o;
  static_cast<StepOptions&>(o) = cfg;                          // gradient_accumulation_steps, clipping, accumulation dtype
  static_cast<zero::BucketOptions&>(o) = cfg.zero_optimization;     // reduce_bucket_size (elements), overlap_comm
  static_cast<offload::OffloadOptions&>(o) = cfg.zero_optimization;  // sub_group_size, nvme (+ aio), param_nvme
  o.stage3 = cfg.zero_optimization.stage3;
  o.loss_scaler = cfg.fp16;
  o.fp32_module_types = cfg.fp16_override_modules;
  o.compression = cfg.gradient_compression;
  o.communication = cfg.communication;
  o.config_grid = ModelOptions::ConfigGrid{cfg.tensor_parallel_size, cfg.pipeline.stages, cfg.expert_parallel_size};
  if (cfg.optimizer) {
    o.optimizer = cfg.optimizer->params;
    o.onebit = *cfg.optimizer;
  }
  // DeepSpeed adds micro-steps' gradients in the training precision unless told otherwise: a
  // DeepSpeed config reproduces that order (EngineOptions alone defaults to fp32; docs/engine.md).
  if (!o.grad_accum_dtype) o.grad_accum_dtype = cfg.precision();
  return o;
}

}  // namespace zerotk::config
