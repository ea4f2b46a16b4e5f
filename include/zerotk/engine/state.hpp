#pragma once
/// \file zerotk/engine/state.hpp
/// EngineState: every mutable piece of an engine that training depends on, as plain values: the
/// step counters, the loss scaler's and scheduler's states, and per flat group this rank's fp32
/// master and optimizer state. `Engine::state()` takes it at an optimizer boundary and
/// `Engine::load_state()` restores it into an engine of the same structure, world size and rank, so
/// the continued run is bitwise identical to an uninterrupted one. (16-bit parameters are not part
/// of it: they are the master rounded, re-published on load.)
///
/// Besides the master and the optimizer's state, which every rank layout can share out, a group may
/// hold state that belongs to its rank alone (RankLocalState): the error feedback of compressed
/// communication and what goes with it. It travels with state() and same-layout checkpoints; a
/// state without it (resharded, older, or cleared on purpose) restarts it from zero, which is what
/// DeepSpeed does on every load.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/rank_local.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk {

struct EngineGroupState {
  std::vector<float> master;  ///< [owned_numel] fp32, this rank's
  OptimizerState optimizer;   ///< step count, moments over the same elements
  RankLocalState rank_local;  ///< this rank's own (see above); empty when the group has none
  /// Sparsity<NofM<N, M>>: which owned elements the masks keep (1) or prune (0), once chosen; empty
  /// before, and for an engine without the policy or a group without sparse parameters.
  std::vector<std::uint8_t> sparsity_keep;
};

/// One flat group's state viewed where the engine keeps it (host-accessible memory spaces): what a
/// synchronous checkpoint save writes without copying it first. Valid until the engine steps.
struct EngineGroupView {
  std::int64_t step = 0;
  std::span<const float> master, m, v;
  bool fresh = false;                  ///< 1-bit LAMB: v_fresh and tensor_scalars are part of the state
  std::span<const float> v_fresh;      ///< 1-bit LAMB's exp_avg_sq_fresh
  std::vector<double> tensor_scalars;  ///< 1-bit LAMB's per-tensor c_f, F, k (a copy: small)
  std::span<const float> rank_local_values;    ///< the rank-local state (RankLocalState::values)
  std::span<const double> rank_local_scalars;  ///< and its scalars
  /// Sparsity's keep flags over the owned elements (EngineGroupState::sparsity_keep); empty: none.
  std::span<const std::uint8_t> sparsity_keep;
  /// Engine::state_views(): the rank-local state gathered from its parts (the one copy a synchronous
  /// save makes), which the two spans view; null when they view an EngineState's.
  std::shared_ptr<const RankLocalState> rank_local_storage;
  bool has_rank_local() const noexcept { return !rank_local_values.empty() || !rank_local_scalars.empty(); }
  /// Takes `s` into rank_local_storage and views it there.
  void own_rank_local(RankLocalState s) {
    rank_local_storage = std::make_shared<const RankLocalState>(std::move(s));
    rank_local_values = rank_local_storage->values;
    rank_local_scalars = rank_local_storage->scalars;
  }
};

struct EngineState {
  std::int64_t micro_steps = 0;
  std::int64_t global_steps = 0;
  std::int64_t skipped_steps = 0;
  LossScalerState scaler;
  std::optional<optim::SchedulerState> scheduler;
  std::vector<EngineGroupState> groups;  ///< the working-precision group, then the fp32-kept group (if any)
};

/// Views of a state's own groups.
inline std::vector<EngineGroupView> views_of(const EngineState& s) {
  std::vector<EngineGroupView> out;
  for (const EngineGroupState& g : s.groups) {
    const bool fresh = !g.optimizer.tensor_scalars.empty() || !g.optimizer.v_fresh.empty();
    out.push_back({g.optimizer.step, g.master, g.optimizer.m, g.optimizer.v, fresh, g.optimizer.v_fresh,
                   g.optimizer.tensor_scalars, g.rank_local.values, g.rank_local.scalars, g.sparsity_keep, nullptr});
  }
  return out;
}

}  // namespace zerotk
