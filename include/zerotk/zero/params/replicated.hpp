#pragma once
/// \file zerotk/zero/params/replicated.hpp
/// Stage 0's parameter path: every rank holds and updates every parameter, so the optimizer writes
/// the new values in place into the flat buffer and nothing is gathered.
///
/// A parameter path owns where a group's parameters live. Its members:
///   kResident                   every bucket's values are always in place (stages 0-2), or only
///                               while fetched (stage 3, fetch_on_demand.hpp)
///   values(k)                   where bucket k's full values are (null when not resident)
///   params()                    resident paths: the flat buffer the Params are bound into
///   optimizer_out()             where the optimizer writes the new values, and whether that is
///                               owned-shaped (like the master) or the flat buffer
///   publish(on_bucket)          after the update: make every rank's parameters current; calls
///                               on_bucket(k) once bucket k's values are in params() (now or later)
///   wait(k), synchronize()      wait for bucket k's (every) publication still in flight
///   pending()                   publications in flight

#include <cstddef>
#include <vector>

#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::zero {

/// The options of a shard home that needs none (every home but the NVMe shard file's).
struct NoHomeOptions {};

/// What a parameter path is built with besides its PathContext. `HomeOptions`: what stage 3's
/// shard home is built with (its `Options`; offload/nvme_shard.hpp's names its file); the paths
/// without shards take none.
template <class HomeOptions = NoHomeOptions>
struct ParamPathOptions {
  using home_options = HomeOptions;
  /// Stages 1/2: leave the all-gather of updated values in flight after the step.
  bool overlap_param_gather = false;
  /// Stage 3: [bucket] kept gathered at all times (stage3_param_persistence_threshold).
  std::vector<char> persistent;
  HomeOptions home;
};


template <class T, class Ops>
class Replicated {
 public:
  static constexpr bool kResident = true;
  using value_type = T;
  using Options = ParamPathOptions<>;

  Replicated(const PathContext<Ops>& c, const Options&)
      : c_(c), params_(c.ops->template allocate<T>(c.layout->flat_numel(), MemoryCategory::params16, c.ledger)) {}

  T* params() { return params_.data(); }
  T* values(std::size_t k) { return params_.data() + c_.layout->buckets()[k].flat_offset; }
  /// f(const T* values) over what this rank owns of bucket k: all of it (zero/ownership.hpp, OwnsAll).
  template <class F>
  void read_owned(std::size_t k, F&& f) {
    f(static_cast<const T*>(values(k)));
  }
  OptimizerOut<T> optimizer_out() { return {params_.data(), true}; }

  template <class OnBucket>
  void publish(OnBucket&& on_bucket) {
    for (std::size_t k = c_.layout->buckets().size(); k-- > 0;) on_bucket(k);
  }
  void wait(std::size_t) {}
  void synchronize() {}
  /// The optimizer writes plain memory: nothing to commit or take back.
  void commit_update() noexcept {}
  void abort_update() noexcept {}
  std::size_t pending() const noexcept { return 0; }
  void drain_quietly() noexcept {}

 private:
  PathContext<Ops> c_;
  typename Ops::template Buffer<T> params_;  // [flat_numel]
};

}  // namespace zerotk::zero
