#pragma once
/// \file zerotk/plan/pipeline.hpp
/// A model split into pipeline stages, as the planner sees one stage: the layers of that stage (each
/// rank's engine holds its stage's parameters only: model states / (tensor x pipeline) / data), cut by
/// pipeline::partition_uniform or partition_balanced over the layers' parameter counts (the GPT
/// example's `pipeline.partition` "uniform" or "parameters"). A parameterless last layer named "loss"
/// (plan::gpt_model's) goes with the last stage.
///
///   const auto bounds = plan::stage_bounds(model, 4, plan::StagePartition::parameters);
///   for (int s = 0; s < 4; ++s) plan::evaluate(plan::stage_model(model, bounds, s), data, choice, settings, budget);
///
/// Activations are the stage's layers' own, one micro-batch's, as the example's layers keep them: a
/// schedule keeps more micro-batches in flight (pipeline::simulate's peak_live), whose saved stage
/// inputs the trainer holds besides (docs/plan.md).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/partition.hpp"
#include "zerotk/plan/model.hpp"

namespace zerotk::plan {

enum class StagePartition : std::uint8_t { parameters, uniform };

namespace detail {
/// Layers that a partition cuts: all but a trailing parameterless "loss".
inline std::size_t cut_layers(const ModelDescription& m) {
  const bool loss = !m.layers.empty() && m.layers.back().name == "loss" && m.layers.back().params.empty();
  return m.layers.size() - (loss ? 1 : 0);
}
}  // namespace detail

/// The `parts` + 1 layer bounds of a pipeline of `parts` (virtual) stages. config_error when there
/// are fewer layers than stages.
inline std::vector<std::size_t> stage_bounds(const ModelDescription& m, int parts, StagePartition how) {
  const std::size_t n = detail::cut_layers(m);
  if (parts < 1 || static_cast<std::size_t>(parts) > n) {
    throw config_error("every pipeline stage needs at least one layer", "--pp",
                       std::to_string(parts) + " stages, " + std::to_string(n) + " layers");
  }
  if (how == StagePartition::uniform) return pipeline::partition_uniform(n, parts);
  std::vector<std::uint64_t> costs;
  for (std::size_t i = 0; i < n; ++i) costs.push_back(m.layers[i].numel());
  return pipeline::partition_balanced(costs, parts);
}

/// Stage `stage`'s layers (the last stage also takes the trailing loss layer).
inline ModelDescription stage_model(const ModelDescription& m, std::span<const std::size_t> bounds, int stage) {
  if (stage < 0 || static_cast<std::size_t>(stage) + 1 >= bounds.size()) {
    throw config_error("no such pipeline stage", "plan::stage_model", std::to_string(stage));
  }
  ModelDescription out;
  const auto s = static_cast<std::size_t>(stage);
  for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) out.layers.push_back(m.layers[i]);
  if (s + 2 == bounds.size()) {
    for (std::size_t i = bounds[s + 1]; i < m.layers.size(); ++i) out.layers.push_back(m.layers[i]);
  }
  return out;
}

}  // namespace zerotk::plan
