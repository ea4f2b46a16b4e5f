#pragma once
/// \file zerotk/engine/scopes.hpp
/// The scopes the trainer brackets its layers with (Engine::forward, backward, gather). Each is a
/// guard: its destructor tells the engine the layer is done (give the buckets back, start the
/// reductions of complete buckets, keep a gather scope's writes), also while an exception unwinds
/// (then the first error is kept and the engine's bookkeeping is put back). The engine is `E`,
/// whose `close_scope(m, phase)`, `end_backward(m, t0)` and `end_gather(m, rank)` they call.

#include <optional>

#include "zerotk/engine/fetch.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/report.hpp"

namespace zerotk::engine {

template <class E>
class [[nodiscard]] ForwardScope {
 public:
  ~ForwardScope() noexcept(false) { e_->end_forward(m_, t0_); }
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  friend E;
  ForwardScope(E* e, ModuleId m, zerotk::detail::Clock::time_point t0) : e_(e), m_(m), t0_(t0) {}
  E* e_;
  ModuleId m_;
  zerotk::detail::Clock::time_point t0_;
};

template <class E>
class [[nodiscard]] BackwardScope {
 public:
  ~BackwardScope() noexcept(false) { e_->end_backward(m_, t0_); }
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

 private:
  friend E;
  BackwardScope(E* e, ModuleId m) : e_(e), m_(m), t0_(zerotk::detail::Clock::now()) {}
  E* e_;
  ModuleId m_;
  zerotk::detail::Clock::time_point t0_;
};

/// Engine::gather's scope: the module's parameters hold their full values until it closes.
template <class E>
class [[nodiscard]] GatherScope {
 public:
  ~GatherScope() noexcept(false) { e_->end_gather(m_, modifier_rank_); }
  GatherScope(const GatherScope&) = delete;
  GatherScope& operator=(const GatherScope&) = delete;

 private:
  friend E;
  GatherScope(E* e, ModuleId m, std::optional<int> modifier_rank) : e_(e), m_(m), modifier_rank_(modifier_rank) {}
  E* e_;
  ModuleId m_;
  std::optional<int> modifier_rank_;
};

}  // namespace zerotk::engine
