#pragma once
/// \file zerotk/engine/state_api.hpp
/// An engine's state as a value (engine/state.hpp): taken at an optimizer boundary, viewed in place
/// for a synchronous checkpoint save, restored into an engine of the same structure. Engine<...>
/// derives from StateAccess<Engine> (CRTP), which reads its parts as its friend; the groups' part
/// is engine/state_io.hpp's.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/engine/state_io.hpp"

namespace zerotk::engine {

template <class E>
class StateAccess {
 public:
  /// Everything training depends on (engine/state.hpp), taken at an optimizer boundary.
  EngineState state() const;

  /// The counters, loss scaler and scheduler of state(), without the per-group buffers.
  EngineState scalar_state() const;

  /// The groups of state() viewed in place, without copies (host-accessible spaces): valid until the
  /// engine steps or loads. A synchronous checkpoint save writes from these.
  std::vector<EngineGroupView> state_views() const
    requires E::ops_type::Space::host_accessible && E::kStateInHostMemory;

  /// Restores a state taken from an engine of the same structure on the same rank of the same world
  /// size, at a boundary; the parameters become the restored master, rounded and published.
  void load_state(const EngineState& s);

 private:
  const E& e() const noexcept { return static_cast<const E&>(*this); }
  E& m() noexcept { return static_cast<E&>(*this); }
};

// Out of class, so that `extern template class StateAccess<BasicEngine<...>>;` (zerotk/engines.hpp)
// keeps them out of a trainer's translation unit.
template <class E>
EngineState StateAccess<E>::state() const {
  EngineState s = scalar_state();
  take_group_states(e().groups_, s);
  std::size_t i = 0;
  e().groups_.each([&](const auto& g) {
    const std::span<const std::uint8_t> keep = e().sparse_.keep(g);
    s.groups[i++].sparsity_keep.assign(keep.begin(), keep.end());
  });
  return s;
}

template <class E>
EngineState StateAccess<E>::scalar_state() const {
  e().require_boundary("state");
  e().require_settled("state");
  EngineState s;
  s.micro_steps = e().counters_.micro_steps;
  s.global_steps = e().counters_.global_steps;
  s.skipped_steps = e().counters_.skipped_steps;
  s.scaler = e().scaler_.state();
  s.scheduler = e().schedule_.state();
  return s;
}

template <class E>
std::vector<EngineGroupView> StateAccess<E>::state_views() const
  requires E::ops_type::Space::host_accessible && E::kStateInHostMemory
{
  e().require_boundary("state_views");
  e().require_settled("state_views");
  std::vector<EngineGroupView> views = group_state_views(e().groups_);
  std::size_t i = 0;
  e().groups_.each([&](const auto& g) { views[i++].sparsity_keep = e().sparse_.keep(g); });
  return views;
}

template <class E>
void StateAccess<E>::load_state(const EngineState& s) {
  m().require_boundary("load_state");
  m().groups_.supersede_update();
  check_group_states(m().groups_, s);
  if (s.scheduler.has_value() != m().schedule_.has_scheduler()) {
    throw usage_error(s.scheduler ? "state has a scheduler's state, and this engine has no scheduler (set_scheduler first)"
                                  : "state has no scheduler's state, and this engine has a scheduler",
                      "Engine::load_state");
  }
  std::size_t i = 0;
  m().groups_.each([&](auto& g) { m().sparse_.load(g, s.groups[i++].sparsity_keep); });
  m().sparse_.loaded();
  load_group_states(m().groups_, s, [&b = *m().bindings_](auto& g, std::size_t k) { b.on_bucket_published(g, k); });
  m().scaler_.load_state(s.scaler);
  if (s.scheduler) m().schedule_.load_state(*s.scheduler);
  m().schedule_.apply(m().groups_);
  m().counters_.micro_steps = s.micro_steps;
  m().counters_.global_steps = s.global_steps;
  m().counters_.skipped_steps = s.skipped_steps;
  m().synchronize();
}

}  // namespace zerotk::engine
