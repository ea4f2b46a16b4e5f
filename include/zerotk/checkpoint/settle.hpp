#pragma once
/// \file zerotk/checkpoint/settle.hpp
/// Saves and loads read the master and the parameters as one state: an engine with a delayed
/// parameter update in flight (EngineOptions::delayed_param_update) publishes it first
/// (Engine::settle), on every rank, before the collective checks begin.

namespace zerotk::checkpoint::detail {

/// Between micro-steps nothing is settled: the caller's boundary check then reports the misuse on
/// every rank.
template <class E>
void settle(E& engine) {
  if constexpr (requires { engine.settle(); engine.at_boundary(); }) {
    if (engine.at_boundary()) engine.settle();
  }
}

}  // namespace zerotk::checkpoint::detail
