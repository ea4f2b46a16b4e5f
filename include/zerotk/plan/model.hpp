#pragma once
/// \file zerotk/plan/model.hpp
/// What the memory planner knows about a model: its layers in forward order, each a ZeRO-3 fetch
/// unit with the element counts of its parameters (in the order the layer visits them), and the
/// activation bytes each layer holds (plan/activations.hpp).
///
/// The parameter counts are per tensor, not per layer, because zerotk's layout packs whole tensors
/// into buckets (zero/layout.hpp): where buckets end, and so how much padding there is, depends on
/// the tensor sizes. A layer given as one count is one tensor.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::plan {

/// Activation bytes of one layer for one micro-batch (see docs/plan.md for how they are used).
struct LayerActivations {
  std::size_t forward_bytes = 0;           ///< kept from the layer's forward to its backward (its output included)
  std::size_t backward_scratch_bytes = 0;  ///< buffers its backward writes (gradients w.r.t. activations)
  std::size_t input_bytes = 0;             ///< the layer's input (what Recompute keeps a copy of)
  std::size_t output_bytes = 0;            ///< the layer's output (what the next layer reads)

  std::size_t total() const noexcept { return forward_bytes + backward_scratch_bytes; }
  friend bool operator==(const LayerActivations&, const LayerActivations&) = default;
};

/// One layer: a fetch unit at stage 3.
struct LayerDesc {
  std::string name;
  std::vector<std::size_t> params;  ///< element count of each parameter tensor, visitation order
  LayerActivations activations;
  /// Whether activation checkpointing may wrap this layer (the GPT example: the blocks).
  bool checkpointable = false;

  std::size_t numel() const noexcept {
    std::size_t n = 0;
    for (std::size_t p : params) n += p;
    return n;
  }
};

/// A model as the planner sees it.
struct ModelDescription {
  std::vector<LayerDesc> layers;

  std::size_t total_params() const noexcept {
    std::size_t n = 0;
    for (const auto& l : layers) n += l.numel();
    return n;
  }
  /// Parameters of the largest layer (DeepSpeed's `largest_layer_params`).
  std::size_t largest_layer_params() const noexcept {
    std::size_t n = 0;
    for (const auto& l : layers) n = std::max(n, l.numel());
    return n;
  }
  /// Elements of the largest single tensor (the engine's scratch gradient).
  std::size_t largest_param() const noexcept {
    std::size_t n = 0;
    for (const auto& l : layers)
      for (std::size_t p : l.params) n = std::max(n, p);
    return n;
  }
  std::size_t param_count() const noexcept {
    std::size_t n = 0;
    for (const auto& l : layers) n += l.params.size();
    return n;
  }
  bool has_activations() const noexcept {
    for (const auto& l : layers)
      if (l.activations.total() > 0) return true;
    return false;
  }
};

/// A model given as one parameter count per layer: each layer one tensor and one fetch unit, no
/// activations (a planner run then reports model states only).
inline ModelDescription from_layer_counts(std::span<const std::size_t> counts) {
  if (counts.empty()) throw config_error("needs at least one layer", "--layers-params", "[]");
  ModelDescription m;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    LayerDesc l;
    l.name = "layer" + std::to_string(i);
    l.params.push_back(counts[i]);
    m.layers.push_back(std::move(l));
  }
  return m;
}

/// A model known only by its total parameter count (the ZeRO paper's analysis, DeepSpeed's
/// estimators): one layer holding one tensor. Its padding is that of a single bucket.
inline ModelDescription from_total(std::size_t total_params) {
  const std::size_t counts[] = {total_params};
  return from_layer_counts(counts);
}

}  // namespace zerotk::plan
