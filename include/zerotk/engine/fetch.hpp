#pragma once
/// \file zerotk/engine/fetch.hpp
/// What the engine's scopes call to have a layer's parameter values in place: a fetch schedule.
/// Stages 0-2 keep every value resident (engine/fetch_resident.hpp); stage 3 gathers shards on
/// demand, prefetches by a recorded order and checks that order across ranks
/// (engine/fetch_sharded.hpp). Members:
///   before(m, phase)   a layer's forward or backward scope opens: its parameters (own and
///                      external) hold their values when this returns
///   after(m, phase)    the scope closed
///   hold(m), unhold(m) a gather scope (Engine::gather) outside the layer order
///   end_micro_step(n)  step(): the micro-step's sequence of scopes is complete
///   ready_next()       step() returned normally: the next micro-step's first scopes come next
///   rethrow_with_order(e)  a collective of the micro-step failed: e, with what the schedule knows

#include <cstdint>
#include <optional>

#include "zerotk/engine/options.hpp"
#include "zerotk/engine/registry.hpp"

namespace zerotk::engine {

/// Which scope a fetch serves.
enum class Phase : std::uint8_t { forward, backward };

/// Stage 3's fetch unit of one parameter: the unit key (a bucket never spans two) and whether it
/// stays gathered. The schedules' `unit_rule(options)` gives it (none below stage 3), and with
/// `registry_rules(rules, options)` and `hpz_group_size(options)` says what else of the stage-3
/// options the engine acts on, so the engine itself never asks which stage it runs.
struct FetchUnit {
  std::uint32_t key = 0;
  bool persistent = false;
};

/// What a fetch schedule is built from (each takes what it needs).
template <class Bindings, class Groups, class Comm>
struct FetchContext {
  Bindings* bindings = nullptr;
  ParamRegistry* registry = nullptr;
  Groups* groups = nullptr;  ///< engine/groups.hpp
  Comm* comm = nullptr;
  Stage3Options options;
};

}  // namespace zerotk::engine
