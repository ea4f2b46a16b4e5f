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
#include <filesystem>
#include <string>
#include <vector>

#include "zerotk/io/aio_options.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::zero {

/// OffloadParams<Nvme>: where stage 3's shard file goes and how it is read and written
/// (offload/nvme_shard.hpp); the other shard homes ignore it.
struct ShardFileOptions {
  offload::ParamNvmeOptions nvme;  ///< `offload_param`: nvme_path, buffer_count, buffer_size, max_in_cpu
  io::AioOptions aio;              ///< the `aio` block (shared with Offload<Nvme>)
  int rank = 0;                    ///< with `name`, names the file
  std::string name = "main";
};

/// What a parameter path is built with besides its PathContext.
struct ParamPathOptions {
  /// Stages 1/2: leave the all-gather of updated values in flight after the step.
  bool overlap_param_gather = false;
  /// Stage 3: [bucket] kept gathered at all times (stage3_param_persistence_threshold).
  std::vector<char> persistent;
  /// Stage 3 with OffloadParams<Nvme>: the shard file.
  ShardFileOptions shard_file;
};


template <class T, class Ops>
class Replicated {
 public:
  static constexpr bool kResident = true;

  Replicated(const PathContext<Ops>& c, const ParamPathOptions&)
      : c_(c), params_(c.ops->template allocate<T>(c.layout->flat_numel(), MemoryCategory::params16, c.ledger)) {}

  T* params() { return params_.data(); }
  T* values(std::size_t k) { return params_.data() + c_.layout->buckets()[k].flat_offset; }
  OptimizerOut<T> optimizer_out() { return {params_.data(), true}; }

  template <class OnBucket>
  void publish(OnBucket&& on_bucket) {
    for (std::size_t k = c_.layout->buckets().size(); k-- > 0;) on_bucket(k);
  }
  void wait(std::size_t) {}
  void synchronize() {}
  std::size_t pending() const noexcept { return 0; }
  void drain_quietly() noexcept {}

 private:
  PathContext<Ops> c_;
  typename Ops::template Buffer<T> params_;  // [flat_numel]
};

}  // namespace zerotk::zero
