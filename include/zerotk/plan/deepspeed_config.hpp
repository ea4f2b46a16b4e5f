#pragma once
/// \file zerotk/plan/deepspeed_config.hpp
/// A planned configuration as a DeepSpeed config (config/writer.hpp's layout), ready for
/// zerotk-config, the GPT example's --config, or DeepSpeed itself. Needs nlohmann-json.

#include <cstdint>

#include "zerotk/config/options.hpp"
#include "zerotk/config/writer.hpp"
#include "zerotk/plan/choice.hpp"

namespace zerotk::plan {

/// The config for `c` on `world` data-parallel ranks, each data replica `tensor` ranks (written as
/// tensor_model_parallel_size when above 1). Activation checkpointing has no per-layer key in
/// DeepSpeed's JSON: the number of checkpointed layers goes to `activation_checkpointing.number_checkpoints`
/// and the choice itself to the GPT example's --checkpoint-activations flag (docs/plan.md).
inline config::Config deepspeed_config(const Choice& c, const EngineSettings& s, int world, std::int64_t micro_batch,
                                       std::int64_t checkpointed_layers, const std::string& nvme_path = "/local_nvme",
                                       int tensor = 1) {
  config::Config cfg;
  cfg.world_size = world * tensor;
  cfg.tensor_parallel_size = tensor;
  cfg.data_parallel_size = world;
  cfg.train_micro_batch_size_per_gpu = micro_batch;
  cfg.gradient_accumulation_steps = s.gradient_accumulation_steps;
  cfg.train_batch_size = micro_batch * s.gradient_accumulation_steps * world;
  cfg.fp16.enabled = c.precision == DType::fp16;
  cfg.bf16.enabled = c.precision == DType::bf16;
  config::ZeroOptions& z = cfg.zero_optimization;
  z.stage = c.stage;
  z.overlap_comm = c.stage == 3;
  z.reduce_bucket_size = s.bucket_numel(c.precision == DType::fp32 ? 4 : 2);
  z.sub_group_size = s.sub_group_size;
  z.offload_optimizer.device = to_config(c.optimizer);
  if (c.optimizer == OffloadTarget::nvme) z.nvme.path = nvme_path;
  z.nvme.buffer_count = s.optimizer_buffer_count;
  z.offload_param.device = to_config(c.param);
  if (c.param == OffloadTarget::nvme) z.param_nvme.path = nvme_path;
  z.param_nvme.buffer_count = s.param_buffer_count;
  z.param_nvme.buffer_size = s.param_buffer_size;
  z.param_nvme.max_in_cpu = s.param_max_in_cpu;
  z.nvme.pipeline_read = s.optimizer_pipeline_read;
  z.nvme.pipeline_write = s.optimizer_pipeline_write;
  z.stage3.prefetch_bucket_size = s.prefetch_bucket_size;
  z.stage3.param_persistence_threshold = s.param_persistence_threshold;
  z.stage3.max_live_parameters = s.max_live_parameters;
  z.stage3.max_reuse_distance = s.max_reuse_distance;
  if (s.hpz_partition_size > 1) z.stage3.reshard_after_forward = zero::ReshardAfterForward::group(s.hpz_partition_size);
  if (!s.grad_accum_fp32 || s.gradient_accumulation_steps > 1) {
    cfg.grad_accum_dtype = s.grad_accum_fp32 ? DType::fp32 : c.precision;
  }
  if (checkpointed_layers > 0) cfg.activation_checkpointing.number_checkpoints = checkpointed_layers;
  return cfg;
}

inline config::Json deepspeed_config_json(const Choice& c, const EngineSettings& s, int world, std::int64_t micro_batch,
                                          std::int64_t checkpointed_layers, int tensor = 1) {
  return config::to_json(deepspeed_config(c, s, world, micro_batch, checkpointed_layers, "/local_nvme", tensor));
}

}  // namespace zerotk::plan
