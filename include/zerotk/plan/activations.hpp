#pragma once
/// \file zerotk/plan/activations.hpp
/// Activation memory: which layers are checkpointed, and the peak that follows from each layer's
/// LayerActivations (plan/model.hpp).
///
/// The peak model (`activation_peak`) is one small function on purpose: it states what the GPT
/// example's layers do today and what `Recompute<L>` is expected to do, and is the one place to
/// change when Recompute lands and is measured (docs/plan.md, "Activation model").

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/plan/model.hpp"

namespace zerotk::plan {

/// Activation checkpointing: none, every checkpointable layer, or every k-th of them
/// (checkpointable layers 0, k, 2k, ... in forward order; k = 1 is `all`).
struct Checkpointing {
  enum class Kind { none, all, every };
  Kind kind = Kind::none;
  int k = 1;

  static Checkpointing none() { return {}; }
  static Checkpointing all() {
    Checkpointing c;
    c.kind = Kind::all;
    return c;
  }
  static Checkpointing every(int k) {
    if (k < 1) throw config_error("must be >= 1", "--checkpoint every:K", std::to_string(k));
    Checkpointing c;
    c.kind = k == 1 ? Kind::all : Kind::every;
    c.k = k;
    return c;
  }
  /// "none", "all", "every:K" (the GPT example's --checkpoint-activations spelling).
  std::string name() const {
    switch (kind) {
      case Kind::none: return "none";
      case Kind::all: return "all";
      case Kind::every: return "every:" + std::to_string(k);
    }
    return "none";
  }
  friend bool operator==(const Checkpointing&, const Checkpointing&) = default;
};

/// Which layers `c` checkpoints: a flag per layer.
inline std::vector<char> checkpointed_layers(const ModelDescription& m, const Checkpointing& c) {
  std::vector<char> out(m.layers.size(), 0);
  int index = 0;  // among checkpointable layers
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    if (!m.layers[i].checkpointable) continue;
    switch (c.kind) {
      case Checkpointing::Kind::none: break;
      case Checkpointing::Kind::all: out[i] = 1; break;
      case Checkpointing::Kind::every: out[i] = index % c.k == 0 ? 1 : 0; break;
    }
    ++index;
  }
  return out;
}

struct ActivationPeak {
  std::size_t kept = 0;       ///< held for the whole step
  std::size_t transient = 0;  ///< the largest extra held during one checkpointed layer's backward
  std::size_t peak() const noexcept { return kept + transient; }
};

/// The peak model (docs/plan.md):
/// - a layer that is not checkpointed keeps its forward buffers and its backward scratch for the
///   whole step (the GPT example's layers size their buffers on the first step and keep them);
/// - a checkpointed layer keeps a copy of its input and its output between forward and backward,
///   and holds its forward buffers, its scratch and the input copy only during its own backward
///   (recompute + backward), after which it frees them;
/// so peak = sum of what every layer keeps + the largest transient of one checkpointed layer.
inline ActivationPeak activation_peak(const ModelDescription& m, const std::vector<char>& checkpointed) {
  ActivationPeak p;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const LayerActivations& a = m.layers[i].activations;
    if (i < checkpointed.size() && checkpointed[i]) {
      p.kept += a.input_bytes + a.output_bytes;
      p.transient = std::max(p.transient, a.forward_bytes + a.backward_scratch_bytes + a.input_bytes);
    } else {
      p.kept += a.forward_bytes + a.backward_scratch_bytes;
    }
  }
  return p;
}

/// The user's hook for their own layers: called once per layer (index in forward order) with its
/// description; its result replaces the layer's activations.
using ActivationHook = std::function<LayerActivations(std::size_t layer, const LayerDesc&)>;

inline void apply_activation_hook(ModelDescription& m, const ActivationHook& hook) {
  for (std::size_t i = 0; i < m.layers.size(); ++i) m.layers[i].activations = hook(i, m.layers[i]);
}

}  // namespace zerotk::plan
