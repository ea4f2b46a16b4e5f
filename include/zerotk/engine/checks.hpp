#pragma once
/// \file zerotk/engine/checks.hpp
/// The run-time checker: the options and the grid place against what an engine type is (CUTLASS's
/// can_implement: checked once, before anything is allocated or communicated): every part's own
/// rules (EngineOptions::problems, each naming the DeepSpeed key and the value) and ONE table of the
/// rules that tie an option or the place to the policies (kRunRules over EngineFacts and GridPlace).
/// The first problem is thrown as a config_error. The policy x policy combinations are
/// engine/compat.hpp's table.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/compat.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/placement.hpp"
#include "zerotk/monitor/slow_ranks.hpp"

namespace zerotk::engine {

/// What the options are checked against: the compile-time facts of an Engine type.
struct EngineFacts {
  DType storage = DType::fp32;       ///< the training precision's element type
  int stage = 0;
  bool reduces_at_boundary = false;  ///< when::at_boundary
  bool can_delay_update = false;     ///< the state store steps off the training thread (Offload<Cpu>)
  bool on_device = false;            ///< Device<Cuda> or Device<HostAsync>: the buffers are a device's
  bool shard_file = false;           ///< stage 3's parameter shards live in a file (OffloadParams<Nvme>)
  bool swaps = false;                ///< a swap file is read or written (Offload<Nvme>, OffloadParams<Nvme>)
  std::string offload;               ///< the Offload policy, for messages ("Offload<None>")
  /// Compressed exchanges of its own (a 1-bit optimizer, GradientCompression): over the data group alone.
  bool compressed_exchange = false;
  bool sparsity = false;  ///< Sparsity<NofM<N, M>>: masks over the master and the reduced gradients
  friend bool operator==(const EngineFacts&, const EngineFacts&) = default;
};

/// "Offload<None>": the policy in words, from its tag's name.
template <class Tag>
std::string offload_policy_name() {
  return "Offload<" + std::string(Tag::name) + ">";
}

/// The facts of the engine a Combination of policies names, in `storage` precision: what a check
/// that has no engine type yet reads (config::check_buildable runs kRunRules over them). An engine
/// type derives its own from its members (BasicEngine::facts()); tests/engine/test_grid.cpp checks
/// that the two agree.
inline EngineFacts facts_of(const Combination& k, DType storage) {
  EngineFacts f;
  f.storage = storage;
  f.stage = k.stage;
  f.reduces_at_boundary = k.reduce_at_boundary;
  f.can_delay_update = k.offload == Place::cpu;  // Offload<Cpu>'s store steps off the training thread
  f.on_device = k.on_device;
  f.shard_file = k.stage == 3 && k.param_offload == Place::nvme;
  f.swaps = f.shard_file || k.offload == Place::nvme;
  f.offload = k.offload == Place::cpu    ? offload_policy_name<Cpu>()
              : k.offload == Place::nvme ? offload_policy_name<Nvme>()
                                         : offload_policy_name<None>();
  f.compressed_exchange = k.one_bit || k.compression;
  f.sparsity = k.sparsity;
  return f;
}

/// One rule of the run-time checker: an option, or the grid place the engine is built on, against
/// the engine type's facts (the compile-time combinations are engine/compat.hpp's table). `check`
/// returns the problem, naming the DeepSpeed key and the value, or nothing. Rules that read the place
/// (`on_place`) run once it is known (check_on_place, from Engine::build, before any collective of
/// the build); the others at construction, before anything is allocated (checked_options).
struct RunRule {
  std::string_view name;
  bool on_place;
  std::optional<config_error> (*check)(const EngineOptions& o, const EngineFacts& f, const GridPlace& place);
};

namespace detail {
using Problem = std::optional<config_error>;

inline Problem delayed_update_needs_cpu_offload(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (!o.delayed_param_update || f.can_delay_update) return std::nullopt;
  return config_error(std::string("needs Offload<Cpu> (offload_optimizer.device cpu): the delayed update runs the host "
                                  "optimizer step beside the next forward and backward; this engine has ") +
                          std::string(f.offload),
                      "delayed_param_update", "true");
}
inline Problem delayed_update_not_with_shard_file(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (!o.delayed_param_update || !f.can_delay_update || !f.shard_file) return std::nullopt;
  return config_error("with OffloadParams<Nvme> is not available: the delayed update writes a step's values into the "
                      "shard file after its state has stepped, so a failed write could not be undone; use "
                      "OffloadParams<Cpu> or OffloadParams<None>",
                      "delayed_param_update", "true");
}
inline Problem delayed_update_not_with_sparsity(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (!o.delayed_param_update || !f.sparsity) return std::nullopt;
  return config_error("with Sparsity<NofM<N, M>> is not available: the delayed update publishes a step's values from "
                      "its worker thread, where the masks do not prune them yet",
                      "delayed_param_update", "true");
}
inline Problem accumulation_dtype(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (!o.grad_accum_dtype || *o.grad_accum_dtype == DType::fp32 || *o.grad_accum_dtype == f.storage) return std::nullopt;
  return config_error("must be fp32 or the training precision (" + std::string(to_string(f.storage)) + ")",
                      "data_types.grad_accum_dtype", std::string(to_string(*o.grad_accum_dtype)));
}
inline Problem fp32_accumulation_every_micro_step(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (o.grad_accum_dtype != DType::fp32 || f.storage == DType::fp32 || !f.reduces_at_boundary ||
      o.gradient_accumulation_steps <= 1) {
    return std::nullopt;
  }
  return config_error("fp32 accumulation of 16-bit gradients needs them reduced every micro-step: use "
                      "Partitioner<Stage<" + std::to_string(f.stage) + ">, when::every_micro_step> (or stage 2)",
                      "data_types.grad_accum_dtype", "fp32");
}

inline std::string built_on(const GridPlace& p) {
  return p.data_only() ? "a plain communicator (data parallel only)"
                       : "a grid of tensor " + std::to_string(p.tensor_size) + " x pipeline " + std::to_string(p.pipeline_size);
}
inline constexpr std::string_view kGridHow =
    ": build a comm::ProcessGrid with the config's shape (zerotk::grid_shape(cfg)) and the engine on it, or remove the key";
inline Problem config_tensor_size(const EngineOptions& o, const EngineFacts&, const GridPlace& p) {
  if (!o.config_grid || o.config_grid->tensor == p.tensor_size) return std::nullopt;
  const int t = o.config_grid->tensor;
  return config_error("asks for " + std::to_string(t) + " tensor-parallel ranks, but the engine is built on " + built_on(p) +
                          std::string(kGridHow),
                      "/tensor_model_parallel_size", std::to_string(t));
}
inline Problem config_pipeline_size(const EngineOptions& o, const EngineFacts&, const GridPlace& p) {
  if (!o.config_grid || o.config_grid->pipeline == p.pipeline_size) return std::nullopt;
  const int n = o.config_grid->pipeline;
  return config_error("asks for " + std::to_string(n) + " pipeline stages, but the engine is built on " + built_on(p) +
                          std::string(kGridHow),
                      "/pipeline_parallelism/num_stages", std::to_string(n));
}
inline Problem config_expert_size(const EngineOptions& o, const EngineFacts&, const GridPlace& p) {
  if (!o.config_grid || o.config_grid->expert == p.expert_size) return std::nullopt;
  const int n = o.config_grid->expert;
  return config_error("asks for " + std::to_string(n) + " expert-parallel ranks, but the engine is built on a grid of expert " +
                          std::to_string(p.expert_size) + std::string(kGridHow),
                      "/expert_parallel/autoep_size", std::to_string(n));
}
inline Problem compressed_exchange_data_only(const EngineOptions&, const EngineFacts& f, const GridPlace& p) {
  if (!f.compressed_exchange || p.data_only()) return std::nullopt;
  return config_error("compressed communication (1-bit optimizers, gradient_compression) exchanges over the data "
                      "group alone; a grid with tensor or pipeline size > 1 is not supported with it yet",
                      "tensor x pipeline", std::to_string(p.tensor_size) + " x " + std::to_string(p.pipeline_size));
}
inline std::string_view zeropp_key(const EngineOptions& o) {
  return o.stage3.quantized_weights ? "zero_optimization.zero_quantized_weights"
                                    : "zero_optimization.zero_quantized_gradients";
}
inline Problem zeropp_needs_stage3(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (f.stage == 3 || (!o.stage3.quantized_weights && !o.stage3.quantized_gradients)) return std::nullopt;
  return config_error("ZeRO++'s quantized weights and gradients need ZeRO stage 3 (stage is " + std::to_string(f.stage) + ")",
                      std::string(zeropp_key(o)), "true");
}
inline Problem zeropp_host_only(const EngineOptions& o, const EngineFacts& f, const GridPlace&) {
  if (f.stage != 3 || !f.on_device || (!o.stage3.quantized_weights && !o.stage3.quantized_gradients)) return std::nullopt;
  return config_error("ZeRO++'s quantized exchanges run on host memory only for now (the CUDA kernels in "
                      "compress/cuda/quantize.cuh are compiled but not wired into the engine)",
                      std::string(zeropp_key(o)), "true");
}
inline Problem rebalance_data_only(const EngineOptions& o, const EngineFacts&, const GridPlace& p) {
  const SlowRankOptions& s = o.communication.slow_ranks;
  if (!s.enabled || s.action != SlowRankAction::rebalance || p.data_only()) return std::nullopt;
  return config_error("rebalance moves samples between data-parallel ranks; a grid with tensor or pipeline size > 1 "
                      "is not supported with it yet",
                      "communication.slow_node_action",
                      std::to_string(p.tensor_size) + " x " + std::to_string(p.pipeline_size));
}
inline constexpr std::string_view kExpertsApart =
    "expert parameters on an expert-data group apart from the data group (a grid with expert > 1)";
inline Problem experts_expert_tensor(const EngineOptions&, const EngineFacts&, const GridPlace& p) {
  if (!p.expert_params || p.expert_tensor_size == p.tensor_size) return std::nullopt;
  return config_error("must equal the tensor size (" + std::to_string(p.tensor_size) +
                          ") for now: every tensor rank holds the same tokens, so an expert split otherwise would see "
                          "them more than once",
                      "GridShape::expert_tensor", std::to_string(p.expert_tensor_size));
}
inline Problem experts_no_swap_files(const EngineOptions&, const EngineFacts& f, const GridPlace& p) {
  if (!p.expert_params || !p.experts_apart() || !f.swaps) return std::nullopt;
  return config_error(std::string(kExpertsApart) + " are not supported with swap files (Offload<Nvme>, "
                          "OffloadParams<Nvme>) yet: the files are named by the data rank. Use Offload<Cpu>",
                      "offload_optimizer.device / offload_param.device", "nvme");
}
inline Problem experts_no_compressed_exchange(const EngineOptions&, const EngineFacts& f, const GridPlace& p) {
  if (!p.expert_params || !p.experts_apart() || !f.compressed_exchange) return std::nullopt;
  return config_error(std::string(kExpertsApart) + " are not supported with compressed communication (1-bit "
                          "optimizers, gradient_compression) yet",
                      "optimizer.type / gradient_compression", "expert " + std::to_string(p.expert_size));
}
inline Problem experts_no_zeropp(const EngineOptions& o, const EngineFacts& f, const GridPlace& p) {
  const bool hpz = f.stage == 3 && o.stage3.reshard_after_forward.group_size() > 1;
  const bool quantized = o.stage3.quantized_weights || o.stage3.quantized_gradients;
  if (!p.expert_params || !p.experts_apart() || (!hpz && !quantized)) return std::nullopt;
  return config_error(std::string(kExpertsApart) + " are not supported with ZeRO++ (hpZ, qwZ, qgZ) yet",
                      hpz ? "zero_optimization.zero_hpz_partition_size" : std::string(zeropp_key(o)),
                      hpz ? std::to_string(o.stage3.reshard_after_forward.group_size()) : "true");
}
}  // namespace detail

/// The run-time rules, in the order they are checked (the first broken one is thrown).
inline constexpr RunRule kRunRules[] = {
    {"delayed_update_needs_cpu_offload", false, &detail::delayed_update_needs_cpu_offload},
    {"delayed_update_not_with_shard_file", false, &detail::delayed_update_not_with_shard_file},
    {"delayed_update_not_with_sparsity", false, &detail::delayed_update_not_with_sparsity},
    {"accumulation_dtype", false, &detail::accumulation_dtype},
    {"fp32_accumulation_every_micro_step", false, &detail::fp32_accumulation_every_micro_step},
    {"config_tensor_size", true, &detail::config_tensor_size},
    {"config_pipeline_size", true, &detail::config_pipeline_size},
    {"config_expert_size", true, &detail::config_expert_size},
    {"compressed_exchange_data_only", true, &detail::compressed_exchange_data_only},
    {"zeropp_needs_stage3", false, &detail::zeropp_needs_stage3},
    {"zeropp_host_only", false, &detail::zeropp_host_only},
    {"rebalance_data_only", true, &detail::rebalance_data_only},
    {"experts_expert_tensor", true, &detail::experts_expert_tensor},
    {"experts_no_swap_files", true, &detail::experts_no_swap_files},
    {"experts_no_compressed_exchange", true, &detail::experts_no_compressed_exchange},
    {"experts_no_zeropp", true, &detail::experts_no_zeropp},
};

/// Every way `o` breaks a rule of `f`'s engine that needs no grid place: each part's own rules
/// (EngineOptions::problems), then kRunRules' (empty: none).
inline std::vector<config_error> option_problems(const EngineOptions& o, const EngineFacts& f) {
  std::vector<config_error> out = o.problems(f.swaps);
  for (const RunRule& r : kRunRules) {
    if (r.on_place) continue;
    if (auto p = r.check(o, f, GridPlace{})) out.push_back(std::move(*p));
  }
  return out;
}

/// Every way the engine's place breaks a rule of kRunRules (empty: none).
inline std::vector<config_error> place_problems(const EngineOptions& o, const EngineFacts& f, const GridPlace& place) {
  std::vector<config_error> out;
  for (const RunRule& r : kRunRules) {
    if (!r.on_place) continue;
    if (auto p = r.check(o, f, place)) out.push_back(std::move(*p));
  }
  return out;
}

/// Engine::build's check, once the place is known: the first problem thrown.
inline void check_on_place(const EngineOptions& o, const EngineFacts& f, const GridPlace& place) {
  std::vector<config_error> p = place_problems(o, f, place);
  if (!p.empty()) throw p.front();
}

/// Deprecated (0.2.0): the checker's rows config_tensor_size and config_pipeline_size
/// (check_on_place runs them). The model-parallel sizes a config asked for against the grid the
/// engine is built on: config_error naming the config's key when the tensor or the pipeline size differs.
[[deprecated("the checker runs this (engine::check_on_place, engine/checks.hpp)")]] inline void check_config_grid(
    std::optional<std::pair<int, int>> asked, const GridPlace& built) {
  if (!asked) return;
  EngineOptions o;
  o.config_grid = ModelOptions::ConfigGrid{asked->first, asked->second, 1};
  for (auto* rule : {&detail::config_tensor_size, &detail::config_pipeline_size}) {
    if (auto p = rule(o, EngineFacts{}, built)) throw *p;
  }
}

/// `o` with its defaults filled in (one parameter group from `optimizer` when none is given), or
/// the first problem thrown.
inline EngineOptions checked_options(EngineOptions o, const EngineFacts& f) {
  std::vector<config_error> p = option_problems(o, f);
  if (!p.empty()) throw p.front();
  if (o.groups.empty()) o.groups.push_back(ParamGroup{o.optimizer});
  return o;
}

}  // namespace zerotk::engine
