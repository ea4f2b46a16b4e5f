#pragma once
/// \file zerotk/zero/params/compute_shard.hpp
/// ComputeShard: where stage 3 keeps this rank's parameter shard when parameters are not offloaded
/// (OffloadParams<None>): in the compute space, the all-gather's send buffer as it is.
///
/// A shard home is what FetchOnDemand (fetch_on_demand.hpp) keeps this rank's shard in (block r of
/// every bucket, [partition_numel] of T at each bucket's part_offset). It is built from
/// (ops, layout, rank, ledger, its Options) and records itself in the ledger (params16, in its
/// space). Every home has
///   gather_source(ops, k, slot)   the send buffer of bucket k's all-gather; `slot` is this rank's
///                                 block of the compute-space buffer the gather fills. A home whose
///                                 shard the communicator cannot read stages the block into `slot`
///                                 and returns `slot` (an in-place all-gather); this one returns
///                                 the block in place.
/// and is one of two kinds:
///   addressable   data(): the shard is memory the engine reads and writes through pointers
///                 (this home, and offload/pinned_shard.hpp's for OffloadParams<Cpu>);
///   swapped       read(k, f), write(k, f) for one bucket's block (f sees it in the home's staging),
///                 and writer(), commit(), abort() for the optimizer's output
///                 (offload/nvme_shard.hpp, OffloadParams<Nvme>).

#include <cstddef>

#include "zerotk/core/memory.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/params/replicated.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class ComputeShard {
 public:
  using Options = NoHomeOptions;

  ComputeShard(Ops& ops, const BucketLayout& layout, int /*rank*/, MemoryLedger* ledger, const Options&)
      : layout_(&layout), shard_(ops.template allocate<T>(layout.partition_numel(), MemoryCategory::params16, ledger)) {}

  T* data() noexcept { return shard_.data(); }
  /// The shard lives where the gather reads it: no copy before a fetch.
  const T* gather_source(Ops&, std::size_t k, T* /*slot*/) noexcept { return shard_.data() + layout_->buckets()[k].part_offset; }

 private:
  const BucketLayout* layout_;
  typename Ops::template Buffer<T> shard_;
};

}  // namespace zerotk::zero
