#pragma once
/// \file zerotk/plan/search.hpp
/// Every configuration of the grid stage x offload x precision x checkpointing, evaluated against
/// a per-rank budget, and the cheapest one that fits.
///
/// "Cheapest" is the least extra work per step, compared in this order (docs/plan.md):
///   1. precision: bf16, then fp16 (loss scaling may skip steps), then fp32 (twice the bytes moved)
///   2. offload: none, then cpu, then nvme, for the optimizer and the parameters together
///      (cost none 0, cpu 1, nvme 3 each; ties: optimizer offload before parameter offload);
///   3. stage: lower first (stage 3 moves 3 Psi per step instead of 2 Psi);
///   4. activation checkpointing: none, then every:K for larger K first (fewer layers recomputed),
///      then all.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/config/structure.hpp"
#include "zerotk/plan/activations.hpp"
#include "zerotk/plan/choice.hpp"
#include "zerotk/plan/model.hpp"
#include "zerotk/plan/model_states.hpp"

namespace zerotk::plan {

/// Per-rank memory available. Host covers pageable and pinned host memory; disk is not bounded.
struct Budget {
  std::size_t device_bytes = 0;
  std::size_t host_bytes = 0;
};

struct Evaluation {
  Choice choice;
  MemoryPlan memory;         ///< model states, buffers and activations (category activations)
  ActivationPeak activations;
  bool fits = false;
  std::size_t device() const noexcept { return memory.space_total(MemorySpace::device); }
  std::size_t host() const noexcept {
    return memory.space_total(MemorySpace::host) + memory.space_total(MemorySpace::pinned_host);
  }
};

namespace detail {
inline Evaluation evaluation_of(const Choice& c, MemoryPlan memory, const ActivationPeak& activations,
                                const EngineSettings& s, const Budget& budget) {
  Evaluation e;
  e.choice = c;
  e.memory = std::move(memory);
  e.activations = activations;
  if (activations.peak() > detail::kMaxPlanBytes) {
    throw config_error("too large to plan: more than 2^60 bytes", "activations", std::to_string(activations.peak()));
  }
  e.memory.at(s.compute_space, MemoryCategory::activations) += e.activations.peak();
  e.fits = e.memory.refused.empty() && e.device() <= budget.device_bytes && e.host() <= budget.host_bytes;
  return e;
}
}  // namespace detail

/// One configuration: the engine's allocations plus the activation peak in the compute space.
inline Evaluation evaluate(const ModelDescription& m, int world, const Choice& c, const EngineSettings& s,
                           const Budget& budget) {
  MemoryPlan memory = model_state_plan(m, world, c, s);
  return detail::evaluation_of(c, std::move(memory), activation_peak(m, checkpointed_layers(m, c.checkpointing)), s,
                               budget);
}

/// Whether this zerotk builds an engine for `c`. DeepSpeed accepts every valid() choice; the
/// config reader's own table (config::check_buildable) refuses some, and the grid offers none of
/// those.
inline bool buildable(const Choice& c) {
  config::Config cfg;
  cfg.zero_optimization.stage = c.stage;
  cfg.zero_optimization.offload_optimizer.device = to_config(c.optimizer);
  cfg.zero_optimization.offload_param.device = to_config(c.param);
  cfg.fp16.enabled = c.precision == DType::fp16;
  cfg.bf16.enabled = c.precision == DType::bf16;
  return config::check_buildable(cfg).empty();
}

/// The grid the planner walks.
struct Grid {
  std::vector<int> stages = {0, 1, 2, 3};
  std::vector<OffloadTarget> optimizer_offload = {OffloadTarget::none, OffloadTarget::cpu, OffloadTarget::nvme};
  std::vector<OffloadTarget> param_offload = {OffloadTarget::none, OffloadTarget::cpu, OffloadTarget::nvme};
  std::vector<DType> precisions = {DType::bf16, DType::fp16, DType::fp32};
  std::vector<CheckpointChoice> checkpointing = {CheckpointChoice::none(), CheckpointChoice::every(2), CheckpointChoice::all()};

  std::vector<Choice> choices(const ModelDescription& m) const {
    bool any_checkpointable = false;
    for (const auto& l : m.layers) any_checkpointable = any_checkpointable || l.checkpointable;
    std::vector<Choice> out;
    for (DType p : precisions)
      for (int st : stages)
        for (OffloadTarget o : optimizer_offload)
          for (OffloadTarget q : param_offload)
            for (const CheckpointChoice& ck : checkpointing) {
              Choice c;
              c.stage = st;
              c.optimizer = o;
              c.param = q;
              c.precision = p;
              c.checkpointing = ck;
              if (!c.valid() || !buildable(c)) continue;
              if (!any_checkpointable && ck.kind != CheckpointChoice::Kind::none) continue;
              out.push_back(c);
            }
    return out;
  }
};

namespace detail {
inline int offload_cost(OffloadTarget t) { return t == OffloadTarget::none ? 0 : t == OffloadTarget::cpu ? 1 : 3; }
inline int precision_rank(DType t) { return t == DType::bf16 ? 0 : t == DType::fp16 ? 1 : 2; }
/// Fraction of checkpointable layers recomputed, as a sortable number: none 0, every:K 1/K, all 1.
inline double recompute_rank(const CheckpointChoice& c) {
  switch (c.kind) {
    case CheckpointChoice::Kind::none: return 0.0;
    case CheckpointChoice::Kind::every: return 1.0 / c.k;
    case CheckpointChoice::Kind::all: return 1.0;
  }
  return 0.0;
}
}  // namespace detail

/// The cost order of the file comment: true when a is cheaper than b.
inline bool cheaper(const Choice& a, const Choice& b) {
  auto key = [](const Choice& c) {
    return std::make_tuple(detail::precision_rank(c.precision),
                           detail::offload_cost(c.optimizer) + detail::offload_cost(c.param),
                           detail::offload_cost(c.param), c.stage, detail::recompute_rank(c.checkpointing));
  };
  return key(a) < key(b);
}

/// Every configuration of the grid, in cost order; each the same Evaluation evaluate() gives.
///
/// Linear in the model's parameters and layers: the grid has up to a hundred configurations but
/// only four layouts (stage 3 or not, by element size) and three checkpointing choices, so the
/// layout facts and the activation peaks are computed once each and shared, not once per
/// configuration (which made a 100,000-layer model take minutes).
inline std::vector<Evaluation> plan_all(const ModelDescription& m, int world, const EngineSettings& s,
                                        const Budget& budget, const Grid& grid = {}) {
  struct Facts {
    bool stage3;
    std::size_t element_bytes;
    LayoutFacts facts;
  };
  std::vector<Facts> layouts;
  std::vector<std::pair<CheckpointChoice, ActivationPeak>> peaks;
  std::vector<Evaluation> out;
  for (const Choice& c : grid.choices(m)) {
    const bool stage3 = c.stage == 3;
    const std::size_t bytes = detail::bytes_of(c.precision);
    auto f = std::find_if(layouts.begin(), layouts.end(),
                          [&](const Facts& x) { return x.stage3 == stage3 && x.element_bytes == bytes; });
    if (f == layouts.end()) f = layouts.insert(layouts.end(), Facts{stage3, bytes, layout_facts(m, world, c, s)});
    auto a = std::find_if(peaks.begin(), peaks.end(), [&](const auto& x) { return x.first == c.checkpointing; });
    if (a == peaks.end()) {
      a = peaks.insert(peaks.end(), {c.checkpointing, activation_peak(m, checkpointed_layers(m, c.checkpointing))});
    }
    out.push_back(detail::evaluation_of(c, model_state_plan(f->facts, c, s), a->second, s, budget));
  }
  // Cheapest first, ties in the grid's order (std::sort over indices with the index as tie-break:
  // std::stable_sort's temporary buffer is deprecated API in libstdc++, which clang reports).
  std::vector<std::size_t> order(out.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (cheaper(out[a].choice, out[b].choice)) return true;
    if (cheaper(out[b].choice, out[a].choice)) return false;
    return a < b;
  });
  std::vector<Evaluation> sorted;
  sorted.reserve(out.size());
  for (std::size_t i : order) sorted.push_back(std::move(out[i]));
  return sorted;
}

/// The cheapest configuration that fits, if any.
inline std::optional<Evaluation> cheapest_fit(const std::vector<Evaluation>& all) {
  for (const Evaluation& e : all)
    if (e.fits) return e;
  return std::nullopt;
}

}  // namespace zerotk::plan
