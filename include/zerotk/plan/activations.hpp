#pragma once
/// \file zerotk/plan/activations.hpp
/// Activation memory: which layers are checkpointed, and the peak that follows from each layer's
/// LayerActivations (plan/model.hpp).
///
/// The peak model (`activation_peak`) replays what `Recompute<L>` and the GPT example's layers hold
/// at each point of a step (docs/plan.md, "Activation model"); tests/examples/test_gpt_plan.cpp
/// checks it against the ledger.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/plan/model.hpp"

namespace zerotk::plan {

/// Activation checkpointing: none, every checkpointable layer, or every k-th of them
/// (checkpointable layers 0, k, 2k, ... in forward order; k = 1 is `all`).
struct CheckpointChoice {
  enum class Kind { none, all, every };
  Kind kind = Kind::none;
  int k = 1;

  static CheckpointChoice none() { return {}; }
  static CheckpointChoice all() {
    CheckpointChoice c;
    c.kind = Kind::all;
    return c;
  }
  static CheckpointChoice every(int k) {
    if (k < 1) throw config_error("must be >= 1", "--checkpoint every:K", std::to_string(k));
    CheckpointChoice c;
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
  friend bool operator==(const CheckpointChoice&, const CheckpointChoice&) = default;
};

/// Which layers `c` checkpoints: a flag per layer.
inline std::vector<char> checkpointed_layers(const ModelDescription& m, const CheckpointChoice& c) {
  std::vector<char> out(m.layers.size(), 0);
  int index = 0;  // among checkpointable layers
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    if (!m.layers[i].checkpointable) continue;
    switch (c.kind) {
      case CheckpointChoice::Kind::none: break;
      case CheckpointChoice::Kind::all: out[i] = 1; break;
      case CheckpointChoice::Kind::every: out[i] = index % c.k == 0 ? 1 : 0; break;
    }
    ++index;
  }
  return out;
}

struct ActivationPeak {
  std::size_t kept = 0;       ///< held at the end of the forward (what the backward starts from)
  std::size_t transient = 0;  ///< the largest extra over `kept` at any point of the step
  std::size_t peak() const noexcept { return kept + transient; }
};

/// The peak, from the rules zerotk::Recompute<L> and the GPT example's layers follow
/// (activation/recompute.hpp), replayed over two steps (the second is the steady state):
/// - a layer that is not checkpointed keeps forward + scratch for the whole step (the example's
///   layers size their buffers on the first step and keep them);
/// - a checkpointed layer keeps its input: taken over from the checkpointed layer before it (which
///   then holds nothing of it), or copied when the layer before is not checkpointed. It keeps a copy of
///   its output until the next checkpointed layer takes it over, or until its own backward when the
///   next layer is not checkpointed. Its forward buffers exist only while it runs forward;
/// - its backward holds forward + scratch (recompute, then backward) and a copy of the input
///   gradient, drops the output first, frees the buffers and the saved input after, and the gradient
///   the checkpointed layer above gave it; its own gradient copy lives until the checkpointed layer
///   below has used it, or until its next forward.
inline ActivationPeak activation_peak(const ModelDescription& m, const std::vector<char>& checkpointed) {
  const std::size_t n = m.layers.size();
  auto ck = [&](std::size_t i) { return i < checkpointed.size() && checkpointed[i] != 0; };
  std::vector<std::size_t> saved(n, 0), output(n, 0), grad(n, 0);
  std::size_t plain = 0;  // what the plain layers hold (after their first forward/backward)
  // sum(saved) + sum(output) + sum(grad), kept up to date by set() so that what is held is known
  // at every point of the replay without a pass over the layers: the replay is O(layers), and the
  // sum is the very integer a re-summation would give (unsigned arithmetic is exact modulo 2^64).
  std::size_t checkpointed_held = 0;
  auto set = [&](std::vector<std::size_t>& v, std::size_t i, std::size_t bytes) {
    checkpointed_held = checkpointed_held - v[i] + bytes;
    v[i] = bytes;
  };
  std::size_t peak = 0, kept = 0;
  auto held = [&] { return plain + checkpointed_held; };
  auto at = [&](std::size_t extra) { peak = std::max(peak, held() + extra); };
  for (int step = 0; step < 2; ++step) {
    plain = 0;  // the first step's plain layers grow as they run; from then on they hold all
    for (std::size_t i = 0; i < n; ++i) {
      if (!ck(i) && step > 0) plain += m.layers[i].activations.total();
    }
    for (std::size_t i = 0; i < n; ++i) {  // forward
      const LayerActivations& a = m.layers[i].activations;
      if (!ck(i)) {
        if (step == 0) plain += a.forward_bytes;
        at(0);
        continue;
      }
      set(grad, i, 0);
      const bool chained = i > 0 && ck(i - 1) && output[i - 1] != 0;
      if (chained) {
        set(saved, i, output[i - 1]);
        set(output, i - 1, 0);
      } else {
        set(saved, i, a.input_bytes);
      }
      at(a.forward_bytes + a.output_bytes);  // the layer's buffers and the output copy
      set(output, i, a.output_bytes);
    }
    if (step == 1) kept = held();
    for (std::size_t i = n; i-- > 0;) {  // backward
      const LayerActivations& a = m.layers[i].activations;
      if (!ck(i)) {
        if (step == 0) plain += a.backward_scratch_bytes;
        at(0);
        continue;
      }
      set(output, i, 0);
      at(a.total() + a.input_bytes);  // recompute + backward, then the gradient copy
      set(saved, i, 0);
      if (i + 1 < n && ck(i + 1)) set(grad, i + 1, 0);
      set(grad, i, a.input_bytes);
      at(0);
    }
  }
  ActivationPeak p;
  p.kept = kept;
  p.transient = peak - std::min(peak, kept);
  return p;
}

/// The user's hook for their own layers: called once per layer (index in forward order) with its
/// description; its result replaces the layer's activations.
using ActivationHook = std::function<LayerActivations(std::size_t layer, const LayerDesc&)>;

inline void apply_activation_hook(ModelDescription& m, const ActivationHook& hook) {
  for (std::size_t i = 0; i < m.layers.size(); ++i) m.layers[i].activations = hook(i, m.layers[i]);
}

}  // namespace zerotk::plan
