#pragma once
/// \file zerotk/engine/state_io.hpp
/// Taking and restoring the groups' part of an EngineState (engine/state.hpp): per group this
/// rank's fp32 master, the optimizer's state and the rank-local state, copied out, viewed in place
/// (a synchronous checkpoint save writes from the views), checked against an engine and restored.
/// The counters, scaler and scheduler are the engine's own (Engine::scalar_state()).

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::engine {

/// Every group's state appended to `s.groups`, the working-precision group first.
template <class Groups>
void take_group_states(const Groups& groups, EngineState& s) {
  groups.each([&](const auto& g) {
    EngineGroupState gs;
    gs.master.resize(g.store().owned_numel());
    g.store().master_to_host(gs.master.data());
    gs.optimizer = g.store().optimizer_state();
    gs.rank_local = g.rank_local();
    s.groups.push_back(std::move(gs));
  });
}

/// Every group's state where the store keeps it (host memory), without copies; valid until the
/// engine steps or loads.
template <class Groups>
std::vector<EngineGroupView> group_state_views(const Groups& groups) {
  std::vector<EngineGroupView> out;
  groups.each([&](const auto& g) {
    const auto& st = g.store();
    const auto& opt = st.optimizer();
    EngineGroupView view{opt.step_count(), std::span<const float>(st.master(), st.owned_numel()),
                         st.exp_avg(), st.exp_avg_sq(), false, {}, {}, {}, {}, {}, nullptr};
    if (std::optional<optim::ExtraView> extra = optim::extra_view(opt)) {  // 1-bit LAMB: v_f and its scalars
      view.fresh = true;
      view.v_fresh = extra->v_fresh;
      view.tensor_scalars = std::move(extra->tensor_scalars);
    }
    view.own_rank_local(g.rank_local());  // gathered from several buffers: the one copy
    out.push_back(std::move(view));
  });
  return out;
}

/// Throws (changing nothing) unless `s` fits these groups: as many groups, partitions of the same
/// size, optimizer states that fit, rank-local states of the same size or none.
template <class Groups>
void check_group_states(const Groups& groups, const EngineState& s) {
  if (s.groups.size() != groups.count()) {
    throw usage_error("state has another number of parameter groups", "Engine::load_state",
                      std::to_string(s.groups.size()) + " for " + std::to_string(groups.count()));
  }
  std::size_t i = 0;
  groups.each([&](const auto& g) {
    const EngineGroupState& gs = s.groups[i++];
    const std::size_t owned = g.store().owned_numel();
    if (gs.master.size() != owned) {
      throw usage_error("state is for a partition of another size (another model, world size or stage?)",
                        "Engine::load_state", std::to_string(gs.master.size()) + " for " + std::to_string(owned) + " elements");
    }
    optim::check_state(gs.optimizer, owned, "Engine::load_state",
                       optim::moments_v<std::remove_cvref_t<decltype(g.store().optimizer())>>);
    optim::check_extra(g.store().optimizer(), gs.optimizer, "Engine::load_state");
    if (!gs.sparsity_keep.empty() && gs.sparsity_keep.size() != owned) {
      throw usage_error("state's sparsity masks are for a partition of another size", "Engine::load_state",
                        std::to_string(gs.sparsity_keep.size()) + " flags for " + std::to_string(owned) + " elements");
    }
    if (!gs.rank_local.empty() && size_of(gs.rank_local) != g.rank_local_size()) {
      const RankLocalSize want = g.rank_local_size(), got = size_of(gs.rank_local);
      throw usage_error("state's rank-local part (error feedback) is of another size: another world size, layout or "
                        "compression? (clear it to start it from zero)",
                        "Engine::load_state",
                        std::to_string(got.values) + " values + " + std::to_string(got.scalars) + " scalars for " +
                            std::to_string(want.values) + " + " + std::to_string(want.scalars));
    }
  });
}

/// Restores a state check_group_states() accepted: optimizer, rank-local state and master; each
/// group's parameters become its master, rounded, and are published (`on_bucket(group, k)`).
template <class Groups, class OnBucket>
void load_group_states(Groups& groups, const EngineState& s, OnBucket&& on_bucket) {
  std::size_t i = 0;
  groups.each([&](auto& g) {
    const EngineGroupState& gs = s.groups[i++];
    g.store().load_optimizer_state(gs.optimizer);
    g.after_state_loaded(gs.rank_local);
    g.store().master_from_host(gs.master.data());
    g.restore_params_from_master([on_bucket, &g](std::size_t k) { on_bucket(g, k); });  // may outlive this call
  });
}

}  // namespace zerotk::engine
