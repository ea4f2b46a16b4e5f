#pragma once
/// \file zerotk/engine/fetch_resident.hpp
/// ResidentFetch: the fetch schedule of stages 0-2, where every parameter is always in place. A
/// scope only waits for the all-gathers of its own buckets still in flight from the last update
/// (`overlap_param_gather`); nothing is recorded, released or checked (engine/fetch.hpp).

#include <cstdint>

#include "zerotk/core/error.hpp"
#include "zerotk/engine/fetch.hpp"

namespace zerotk::engine {

template <class Context>
class ResidentFetch {
  using Bindings = typename Context::bindings_type;

 public:
  explicit ResidentFetch(const Context& c) : bindings_(c.bindings) {}

  void before(const ModuleEntry& m, Phase) {
    bindings_->wait_values(m.own);
    bindings_->wait_values(m.external);
  }
  void after(const ModuleEntry&, Phase) {}
  void hold(const ModuleEntry& m) { before(m, Phase::forward); }
  void unhold(const ModuleEntry&) {}
  void end_micro_step(std::int64_t) {}
  [[noreturn]] void rethrow_with_order(const comm_error& x) const { throw x; }

 private:
  Bindings* bindings_;
};

}  // namespace zerotk::engine
