#pragma once
/// \file zerotk/zero/params/compute_shard.hpp
/// ComputeShard: where stage 3 keeps this rank's parameter shard when parameters are not offloaded
/// (OffloadParams<None>): in the compute space, the all-gather's send buffer as it is.
///
/// A shard home is what FetchOnDemand (fetch_on_demand.hpp) asks two things of:
///   Buffer                            the shard's storage type ([partition_numel] of T)
///   allocate(ops, n, ledger)          the shard, recorded in the ledger as params16 in its space
///   gather_source(ops, block, slot, n)  the send buffer of a bucket's all-gather: `block` is this
///                                     rank's n elements in the shard, `slot` this rank's block of
///                                     the compute-space buffer the gather fills. A home whose shard
///                                     the communicator cannot read stages `block` into `slot` and
///                                     returns `slot` (an in-place all-gather); this one returns
///                                     `block`.
/// The other home is offload/pinned_shard.hpp (OffloadParams<Cpu>).

#include <cstddef>

#include "zerotk/core/memory.hpp"

namespace zerotk::zero {

template <class T, class Ops>
struct ComputeShard {
  using Buffer = typename Ops::template Buffer<T>;
  /// The shard lives where the gather reads it: no copy before a fetch.
  static constexpr bool kStaged = false;

  static Buffer allocate(Ops& ops, std::size_t n, MemoryLedger* ledger) {
    return ops.template allocate<T>(n, MemoryCategory::params16, ledger);
  }
  static const T* gather_source(Ops&, const T* block, T* /*slot*/, std::size_t /*n*/) noexcept { return block; }
};

}  // namespace zerotk::zero
