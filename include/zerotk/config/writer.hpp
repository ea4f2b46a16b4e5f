#pragma once
/// \file zerotk/config/writer.hpp
/// Config -> DeepSpeed JSON with every value spelled out ("auto" resolved, defaults written,
/// batch triad complete). The output is itself a valid DeepSpeed config: reading it back with the
/// same world size gives the same Config, and DeepSpeed accepts it unchanged.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "zerotk/config/communication.hpp"
#include "zerotk/config/json_dom.hpp"
#include "zerotk/config/options.hpp"

namespace zerotk::config {

namespace detail {

/// A count as JSON: DeepSpeed reads them as (signed) integers, so "no limit" is written as the
/// largest int64 (what the reader reads back into the same "no limit").
inline Json count_json(std::size_t n) {
  return Json(static_cast<std::int64_t>(std::min<std::size_t>(n, std::numeric_limits<std::int64_t>::max())));
}

inline Json path_json(const std::filesystem::path& p) { return p.empty() ? Json(nullptr) : Json(p.string()); }

/// The offload_optimizer block: its device and pin_memory, and offload's NvmeOptions' swap keys.
inline Json offload_json(const OffloadOptimizerOptions& o, const offload::NvmeOptions& n) {
  Json j;
  j["device"] = to_string(o.device);
  j["nvme_path"] = path_json(n.path);
  j["buffer_count"] = count_json(n.buffer_count);
  j["pin_memory"] = o.pin_memory;
  j["pipeline_read"] = n.pipeline_read;
  j["pipeline_write"] = n.pipeline_write;
  return j;
}

/// The offload_param block: its device and pin_memory, and offload's ParamNvmeOptions' swap keys.
inline Json offload_json(const OffloadParamOptions& o, const offload::ParamNvmeOptions& n) {
  Json j;
  j["device"] = to_string(o.device);
  j["nvme_path"] = path_json(n.path);
  j["buffer_count"] = count_json(n.buffer_count);
  j["buffer_size"] = count_json(n.buffer_size);
  j["max_in_cpu"] = count_json(n.max_in_cpu);
  j["pin_memory"] = o.pin_memory;
  return j;
}

/// An optional the reader always resolves; null when a Config built in code left it unset.
template <class T>
Json value_or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

template <class W>
void warmup_json(Json& p, const W& w, double warmup_max_lr) {
  p["warmup_min_lr"] = w.warmup_min_lr;
  p["warmup_max_lr"] = warmup_max_lr;
  p["warmup_num_steps"] = w.warmup_num_steps;
  p["warmup_type"] = to_string(w.warmup_type);
}

/// `optimizer_lr` is what an unset WarmupLR warmup_max_lr means (the reader always sets it).
inline Json scheduler_json(const SchedulerOptions& s, double optimizer_lr) {
  Json j;
  j["type"] = to_string(s.kind());
  Json p = Json::object();
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, WarmupLROptions>) {
          warmup_json(p, x, x.warmup_max_lr.value_or(optimizer_lr));
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          p["total_num_steps"] = value_or_null(x.total_num_steps);
          warmup_json(p, x, x.warmup_max_lr);
        } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
          p["total_num_steps"] = value_or_null(x.total_num_steps);
          p["warmup_min_ratio"] = x.warmup_min_ratio;
          p["warmup_num_steps"] = x.warmup_num_steps;
          p["cos_min_ratio"] = x.cos_min_ratio;
          p["warmup_type"] = to_string(x.warmup_type);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          p["cycle_min_lr"] = value_or_null(x.cycle_min_lr);
          p["cycle_max_lr"] = value_or_null(x.cycle_max_lr);
          p["decay_lr_rate"] = x.decay_lr_rate;
          p["cycle_first_step_size"] = x.cycle_first_step_size;
          p["cycle_second_step_size"] = x.cycle_second_step_size.value_or(x.cycle_first_step_size);
          p["cycle_first_stair_count"] = x.cycle_first_stair_count;
          p["cycle_second_stair_count"] = x.cycle_second_stair_count.value_or(x.cycle_first_stair_count);
          p["decay_step_size"] = x.decay_step_size;
          p["cycle_momentum"] = x.cycle_momentum;
          p["cycle_min_mom"] = x.cycle_min_mom;
          p["cycle_max_mom"] = x.cycle_max_mom;
          p["decay_mom_rate"] = x.decay_mom_rate;
        } else {
          p["lr_range_test_min_lr"] = x.lr_range_test_min_lr;
          p["lr_range_test_step_size"] = x.lr_range_test_step_size;
          p["lr_range_test_step_rate"] = x.lr_range_test_step_rate;
          p["lr_range_test_staircase"] = x.lr_range_test_staircase;
        }
      },
      s.params);
  p["last_batch_iteration"] = s.last_batch_iteration;
  j["params"] = std::move(p);
  return j;
}

/// The type and exactly the `params` keys the optimizer's tag reads (policies.hpp), in the reader's order.
inline Json optimizer_json(const OptimizerBlock& o) {
  namespace keys = ::zerotk::optimizer_params;
  Json j;
  j["type"] = to_string(o.kind);
  const OptimizerOptions& h = o.params;
  Json p;
  if (o.kind.reads(keys::lr)) p["lr"] = h.lr;
  if (o.kind.reads(keys::betas)) p["betas"] = {h.beta1, h.beta2};
  if (o.kind.reads(keys::eps)) p["eps"] = h.eps;
  if (o.kind.reads(keys::weight_decay)) p["weight_decay"] = h.weight_decay;
  if (o.kind.reads(keys::bias_correction)) p["bias_correction"] = h.bias_correction;
  if (o.kind.reads(keys::adam_w_mode)) p["adam_w_mode"] = o.adam_w_mode;
  if (o.kind.reads(keys::trust_clamp)) {
    p["max_coeff"] = h.lamb_max_coeff;
    p["min_coeff"] = h.lamb_min_coeff;
  }
  if (o.kind.reads(keys::zero_one)) {
    p["var_freeze_step"] = o.zero_one.var_freeze_step;
    p["var_update_scaler"] = o.zero_one.var_update_scaler;
    p["local_step_scaler"] = o.zero_one.local_step_scaler;
    p["local_step_clipper"] = o.zero_one.local_step_clipper;
  }
  if (o.kind.reads(keys::freeze_step)) p["freeze_step"] = o.freeze_step;
  if (o.kind.reads(keys::onebit_comm)) {
    p["cuda_aware"] = o.cuda_aware;
    p["comm_backend_name"] = o.comm_backend_name;
  }
  if (o.kind.reads(keys::onebit_lamb)) {
    p["coeff_beta"] = o.lamb.coeff_beta;
    p["factor_max"] = o.lamb.factor_max;
    p["factor_min"] = o.lamb.factor_min;
    p["factor_threshold"] = o.lamb.factor_threshold;
  }
  j["params"] = std::move(p);
  return j;
}

/// DeepSpeed reads initial_scale_power as an integer; LossScalerOptions holds a double.
inline Json power_json(double power) {
  const bool integral = std::floor(power) == power && std::fabs(power) < 1e15;
  return integral ? Json(static_cast<std::int64_t>(power)) : Json(power);
}

/// The zero_optimization block.
inline Json zero_json(const ZeroOptions& z) {
  const zero::Stage3Options& s3 = z.stage3;
  Json zj;
  zj["stage"] = z.stage;
  zj["contiguous_gradients"] = z.contiguous_gradients;
  zj["reduce_scatter"] = z.reduce_scatter;
  zj["reduce_bucket_size"] = count_json(z.reduce_bucket_size);
  zj["allgather_partitions"] = z.allgather_partitions;
  zj["allgather_bucket_size"] = z.allgather_bucket_size;
  zj["overlap_comm"] = z.overlap_comm;
  zj["load_from_fp32_weights"] = z.load_from_fp32_weights;
  zj["offload_optimizer"] = offload_json(z.offload_optimizer, z.nvme);
  // offload_param means nothing below stage 3 (DeepSpeed and the reader ignore it there): leave it out.
  if (z.stage == 3) zj["offload_param"] = offload_json(z.offload_param, z.param_nvme);
  zj["sub_group_size"] = count_json(z.sub_group_size);
  zj["stage3_prefetch_bucket_size"] = count_json(s3.prefetch_bucket_size);
  zj["stage3_param_persistence_threshold"] = count_json(s3.param_persistence_threshold);
  zj["stage3_model_persistence_threshold"] = count_json(s3.model_persistence_threshold);
  zj["stage3_max_live_parameters"] = count_json(s3.max_live_parameters);
  zj["stage3_max_reuse_distance"] = count_json(s3.max_reuse_distance);
  zj["stage3_gather_16bit_weights_on_model_save"] = z.stage3_gather_16bit_weights_on_model_save;
  zj["zero_hpz_partition_size"] = std::max(1, s3.reshard_after_forward.group_size());
  zj["zero_quantized_weights"] = s3.quantized_weights;
  zj["zero_quantized_gradients"] = s3.quantized_gradients;
  zj["ignore_unused_parameters"] = z.ignore_unused_parameters;
  zj["round_robin_gradients"] = z.round_robin_gradients;
  return zj;
}

/// The activation_checkpointing block.
inline Json activation_checkpointing_json(const ActivationCheckpointingOptions& ac) {
  Json acj;
  acj["partition_activations"] = ac.partition_activations;
  acj["contiguous_memory_optimization"] = ac.contiguous_memory_optimization;
  acj["cpu_checkpointing"] = ac.cpu_checkpointing;
  acj["number_checkpoints"] = ac.number_checkpoints ? Json(*ac.number_checkpoints) : Json(nullptr);
  acj["synchronize_checkpoint_boundary"] = ac.synchronize_checkpoint_boundary;
  acj["profile"] = ac.profile;
  return acj;
}

/// The checkpoint block.
inline Json checkpoint_json(const CheckpointConfig& ck) {
  Json ckj;
  ckj["tag_validation"] = std::string(to_string(ck.tag_validation));
  ckj["load_universal"] = ck.load_universal;
  ckj["use_node_local_storage"] = ck.use_node_local_storage;
  ckj["parallel_write"]["pipeline_stage"] = ck.parallel_write_pipeline_stage;
  return ckj;
}

/// The `sparse_attention` block: the mode and the keys DeepSpeed reads in it
/// (config/sparse_attention.hpp), so the block reads back to the same layout config.
inline Json sparse_attention_json(const context::SparsityConfig& s) {
  using context::SparsityMode;
  Json j{{"mode", std::string(context::to_string(s.mode))}, {"block", s.block}};
  const bool f = s.mode == SparsityMode::fixed, v = s.mode == SparsityMode::variable, b = s.mode == SparsityMode::bigbird,
             l = s.mode == SparsityMode::bslongformer;
  if (f || v || b || l) j["different_layout_per_head"] = s.different_layout_per_head;
  if (f) j["num_local_blocks"] = s.num_local_blocks, j["num_different_global_patterns"] = s.num_different_global_patterns;
  if (f || b) j["num_global_blocks"] = s.num_global_blocks;
  if (f || v) {
    j["attention"] = s.unidirectional ? "unidirectional" : "bidirectional";
    j["horizontal_global_attention"] = s.horizontal_global_attention;
  }
  if (v || b) j["num_random_blocks"] = s.num_random_blocks;
  if (v) j["local_window_blocks"] = s.local_window_blocks;
  if (v || l) {
    j["global_block_indices"] = s.global_block_indices;
    if (s.global_block_end_indices) j["global_block_end_indices"] = *s.global_block_end_indices;
  }
  if (b || l) j["num_sliding_window_blocks"] = s.num_sliding_window_blocks;
  return j;
}

}  // namespace detail

/// The fully resolved config in DeepSpeed's layout.
inline Json to_json(const Config& c) {
  Json j;
  j["train_batch_size"] = c.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  j["gradient_clipping"] = c.gradient_clipping;
  // zerotk's own key (the seeds'); DeepSpeed's top level ignores it. Written only when it splits, so a
  // config without it reads back unchanged.
  if (c.tensor_parallel_size > 1) j["tensor_model_parallel_size"] = c.tensor_parallel_size;
  if (c.sequence_parallel_size > 1) j["sequence_parallel_size"] = c.sequence_parallel_size;
  if (c.expert_parallel_size > 1) j["expert_parallel"] = Json{{"enabled", true}, {"autoep_size", c.expert_parallel_size}};
  if (c.sparse_attention) j["sparse_attention"] = detail::sparse_attention_json(*c.sparse_attention);
  // zerotk's (the seeds') pipeline block when the layers are split; DeepSpeed's `pipeline` keys that act
  // when they are not its defaults.
  if (c.pipeline.stages > 1 || c.pipeline.schedule != PipelineConfig{}.schedule) {
    j["pipeline_parallelism"] = Json{{"num_stages", c.pipeline.stages}, {"schedule", c.pipeline.schedule}};
  }
  if (c.pipeline.partition != PipelineConfig{}.partition || c.pipeline.activation_checkpoint_interval != 0) {
    j["pipeline"] = Json{{"partition", c.pipeline.partition == PipelinePartition::uniform ? "uniform" : "parameters"},
                         {"activation_checkpoint_interval", c.pipeline.activation_checkpoint_interval}};
  }
  j["steps_per_print"] = c.steps_per_print;
  j["wall_clock_breakdown"] = c.wall_clock_breakdown;
  j["prescale_gradients"] = c.prescale_gradients;
  j["gradient_predivide_factor"] = c.gradient_predivide_factor;
  j["communication_data_type"] =
      c.communication_data_type ? Json(to_string(*c.communication_data_type)) : Json(nullptr);
  // Keys newer than the others are written only when set, so a config without them reads back unchanged.
  if (c.grad_accum_dtype) j["data_types"]["grad_accum_dtype"] = to_string(*c.grad_accum_dtype);

  Json& f = j["fp16"];
  f["enabled"] = c.fp16.enabled;
  f["loss_scale"] = c.fp16.static_scale;
  f["initial_scale_power"] = detail::power_json(c.fp16.initial_scale_power);
  f["loss_scale_window"] = c.fp16.loss_scale_window;
  f["hysteresis"] = c.fp16.hysteresis;
  f["consecutive_hysteresis"] = c.fp16.consecutive_hysteresis;
  f["min_loss_scale"] = c.fp16.min_loss_scale;
  j["bf16"]["enabled"] = c.bf16.enabled;
  const ZeroOptions& z = c.zero_optimization;
  const zero::Stage3Options& s3 = z.stage3;
  if (!c.fp16_override_modules.empty()) j["fp16_override_modules"] = c.fp16_override_modules;
  if (!s3.partitioned_module_types.empty()) j["zero_allowed_param_types"] = s3.partitioned_module_types;
  if (!s3.replicated_module_types.empty()) j["zero_force_param_types"] = s3.replicated_module_types;

  j["zero_optimization"] = detail::zero_json(z);

  Json& a = j["aio"];
  const io::AioOptions& aio = z.nvme.aio;
  a["block_size"] = detail::count_json(aio.block_size);
  a["queue_depth"] = aio.queue_depth;
  a["intra_op_parallelism"] = aio.intra_op_parallelism;
  a["single_submit"] = aio.single_submit;
  a["overlap_events"] = aio.overlap_events;

  if (c.optimizer) j["optimizer"] = detail::optimizer_json(*c.optimizer);
  if (c.scheduler) {
    j["scheduler"] = detail::scheduler_json(*c.scheduler,
                                            c.optimizer ? c.optimizer->params.lr : optim::kDefaultOptimizerLr);
  }

  Json& m = j["csv_monitor"];
  m["enabled"] = c.csv_monitor.enabled;
  m["output_path"] = c.csv_monitor.output_path;
  m["job_name"] = c.csv_monitor.job_name;

  // Only when set: a config without the block resolves to the same JSON as before the block existed.
  const GradientCompressionConfig& gc = c.gradient_compression;
  if (gc.algorithm || gc.topk_ratio != compress::GradientCompressionOptions{}.topk_ratio || gc.huffman_coding) {
    Json& g = j["gradient_compression"];
    g["algorithm"] = gc.algorithm ? Json(std::string(to_string(*gc.algorithm))) : Json(nullptr);
    g["topk_ratio"] = gc.topk_ratio;
    g["huffman_coding"] = gc.huffman_coding;
  }

  j["activation_checkpointing"] = detail::activation_checkpointing_json(c.activation_checkpointing);
  j["checkpoint"] = detail::checkpoint_json(c.checkpoint);
  if (Json cj = detail::communication_json(c.communication); !cj.is_null()) j["communication"] = std::move(cj);
  return j;
}

}  // namespace zerotk::config
