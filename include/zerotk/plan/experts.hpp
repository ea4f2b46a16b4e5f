#pragma once
/// \file zerotk/plan/experts.hpp
/// Expert parallelism in the memory planner: the per-rank bytes of an engine whose model has expert
/// parameters (docs/moe.md), and the dispatcher's all-to-all bytes per MoE layer.
///
/// The engine keeps expert parameters in a flat group of their own (engine/groups.hpp) over the
/// expert-data group, beside the dense parameters' group over the data group: each group has its
/// own bucket layout, gradient and parameter paths, pools and state store, and the engine one
/// scratch gradient (the largest parameter of either). So the plan is the dense model's plan over
/// the data ranks plus this rank's experts' plan over the expert-data ranks, with one scratch.
/// With E experts of Psi_e elements in all, expert parallel ep and expert-data edp, a rank holds
/// Psi_e / ep of them and owns 1/edp of that (stages 1-3): its fp32 master and Adam moments are
/// 12 Psi_e / (ep edp) bytes, up to the layout's padding.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/plan/choice.hpp"
#include "zerotk/plan/model.hpp"
#include "zerotk/plan/model_states.hpp"
#include "zerotk/plan/transformer.hpp"

namespace zerotk::plan {

/// What the engine refuses with experts apart from the data group (engine/checks.hpp's experts_*
/// rows), as the planner sees a choice and its settings; empty when it builds.
inline std::string expert_refusal(const Choice& c, const EngineSettings& s, bool apart) {
  if (!apart) return {};
  if (c.optimizer == OffloadTarget::nvme || c.param == OffloadTarget::nvme) {
    return "expert parameters apart from the data group are not supported with swap files (NVMe offload) yet";
  }
  if (c.stage == 3 && s.hpz_partition_size > 1) {
    return "expert parameters apart from the data group are not supported with hpZ yet";
  }
  return {};
}

/// Per-rank bytes of an engine whose model is `dense` (ZeRO over `data` ranks) plus this rank's
/// experts `experts` (ZeRO over `expert_data` ranks; expert_data = data / ep with expert_tensor =
/// tensor). `refused` says why the engine would not build it (expert_refusal).
inline MemoryPlan expert_model_state_plan(const ModelDescription& dense, const ModelDescription& experts, int data,
                                          int expert_data, const Choice& c, const EngineSettings& s) {
  if (expert_data < 1 || data < expert_data || data % expert_data != 0) {
    throw config_error("the expert-data ranks must divide the data ranks (" + std::to_string(data) + ")", "--ep",
                       std::to_string(expert_data) + " expert-data ranks");
  }
  MemoryPlan p = model_state_plan(dense, data, c, s);
  const MemoryPlan e = model_state_plan(experts, expert_data, c, s);
  for (std::size_t sp = 0; sp < kMemorySpaceCount; ++sp) {
    for (std::size_t ca = 0; ca < kMemoryCategoryCount; ++ca) p.bytes[sp][ca] += e.bytes[sp][ca];
  }
  // One scratch gradient for the engine: its largest parameter's.
  const std::size_t F = sizeof(float);
  const std::size_t scratch_dense = std::max<std::size_t>(1, dense.largest_param()) * F;
  const std::size_t scratch_experts = std::max<std::size_t>(1, experts.largest_param()) * F;
  p.at(s.compute_space, MemoryCategory::other) -= std::min(scratch_dense, scratch_experts);
  p.psi += e.psi;
  p.psi_padded += e.psi_padded;
  p.partition += e.partition;
  p.buckets += e.buckets;
  p.approximate.insert(p.approximate.end(), e.approximate.begin(), e.approximate.end());
  if (c.stage == 3 && c.param == OffloadTarget::nvme && s.param_max_in_cpu > 0) {
    p.approximate.push_back("offload_param.max_in_cpu is one budget over the dense and the expert group; this plan gives each "
                            "the whole of it (a bound)");
  }
  if (p.refused.empty()) p.refused = e.refused;
  if (p.refused.empty()) p.refused = expert_refusal(c, s, expert_data != data);
  return p;
}

/// A mixture of experts in place of the GPT shape's MLPs: `experts` per block, routed top-`top_k`,
/// held by `ep` expert ranks (each E / ep of them).
struct ExpertShape {
  std::size_t experts = 0;
  std::size_t top_k = 1;
  std::size_t ep = 1;
};

/// The GPT shape's model with each block's MLP (fc, fc_proj: weights and biases) replaced by
/// ExpertShape::experts experts of the same shape (one tensor rank's share: expert_tensor =
/// tensor), and a router [E x d] (whole on every tensor rank) after the block's other tensors:
/// `dense` holds everything but the experts, `experts` this rank's E / ep experts of each block, one
/// layer (fetch unit) per block. Activations are the dense model's (the planner's model-state
/// figures do not read them).
struct ExpertModel {
  ModelDescription dense, experts;
};
inline ExpertModel moe_gpt_model(const TransformerShape& s, const ExpertShape& e) {
  if (e.experts == 0) throw config_error("must be at least 1", "--experts", "0");
  if (e.top_k == 0 || e.top_k > e.experts) {
    throw config_error("must be in [1, --experts (" + std::to_string(e.experts) + ")]", "--top-k", std::to_string(e.top_k));
  }
  if (e.ep == 0 || e.experts % e.ep != 0) {
    throw config_error("must divide --experts (" + std::to_string(e.experts) + ")", "--ep", std::to_string(e.ep));
  }
  ExpertModel out;
  out.dense = gpt_model(s);
  for (LayerDesc& l : out.dense.layers) {
    if (!l.name.starts_with("block") || l.params.size() != 12) continue;
    LayerDesc x;
    x.name = l.name + ".experts";
    for (std::size_t i = 0; i < e.experts / e.ep; ++i) x.params.insert(x.params.end(), l.params.begin() + 8, l.params.end());
    l.params.resize(8);
    l.params.push_back(e.experts * s.hidden);  // the router
    out.experts.layers.push_back(std::move(x));
  }
  return out;
}

/// Bytes one rank sends through the dispatcher's all_to_all_v per MoE layer and micro-batch under
/// uniform routing: dispatch and combine in the forward, their two transposes in the backward,
/// each moving `tokens` x `top_k` rows of `hidden` elements of `element_bytes`, of which the
/// (ep - 1) / ep bound for other ranks leave it: 4 T k h b (ep - 1) / ep (docs/moe.md). Dropless
/// sends exactly the routed rows; DeepSpeed pads every rank's block to the largest.
inline std::uint64_t all_to_all_bytes_per_layer(std::uint64_t tokens, std::uint64_t top_k, std::uint64_t hidden,
                                                std::uint64_t element_bytes, std::uint64_t ep) {
  if (ep == 0) throw config_error("must be at least 1", "--ep", "0");
  return 4 * tokens * top_k * hidden * element_bytes * (ep - 1) / ep;
}

}  // namespace zerotk::plan
