#pragma once
/// \file zerotk/engine/fetch_resident.hpp
/// ResidentFetch: the fetch schedule of stages 0-2, where every parameter is always in place. A
/// scope only waits for the all-gathers of its own buckets still in flight from the last update
/// (`overlap_param_gather`); nothing is recorded, released or checked (engine/fetch.hpp).

#include <cstdint>
#include <optional>

#include "zerotk/core/error.hpp"
#include "zerotk/engine/fetch.hpp"

namespace zerotk::engine {

template <class Context>
class ResidentFetch {
 public:
  explicit ResidentFetch(const Context& c) : c_(c) {}

  /// Stages 0-2 have no fetch units, partition every module's parameters and gather nothing per
  /// layer (no hpZ): the stage-3 options do not apply.
  static auto unit_rule(const Stage3Options&) {
    return [](const ParamEntry&) -> std::optional<FetchUnit> { return std::nullopt; };
  }
  static void registry_rules(ParamRegistry::Rules&, const Stage3Options&) noexcept {}
  static int hpz_group_size(const Stage3Options&) noexcept { return 1; }

  /// A scope's cost when nothing is in flight (every step without overlap_param_gather): two loads.
  void before(const ModuleEntry& m, Phase) {
    if (c_.groups->pending_publications() == 0) return;
    c_.bindings->wait_values(m.own);
    c_.bindings->wait_values(m.external);
  }
  void after(const ModuleEntry&, Phase) {}
  void hold(const ModuleEntry& m) { before(m, Phase::forward); }
  void unhold(const ModuleEntry&) {}
  void end_micro_step(std::int64_t) {}
  void ready_next() {}
  [[noreturn]] void rethrow_with_order(const comm_error& x) const { throw x; }

 private:
  Context c_;
};

}  // namespace zerotk::engine
