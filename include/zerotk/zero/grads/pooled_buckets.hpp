#pragma once
/// \file zerotk/zero/grads/pooled_buckets.hpp
/// Stage 2's gradient path: backward writes each bucket into a buffer taken from a small pool; when
/// the bucket is complete it is reduce-scattered (average over ranks) into this rank's partition of
/// reduced gradients and the buffer goes back to the pool, so a rank keeps 2 Psi/N bytes of
/// gradients plus the pool. With gradient accumulation the reduced partition is added into an
/// accumulator (fp32, or the working precision: DeepSpeed's order) after every micro-step.
///
/// The reduced partition is a named, shared buffer: after the update the optimizer writes the new
/// 16-bit values into it and the parameter path all-gathers from it (`gather_source()`), so a
/// bucket's next reduction must wait until that bucket's gather is done (engine/group.hpp,
/// `kSharedGatherSource`). Stage 3 reduces the same way, but its parameter path keeps a shard of its
/// own and takes no gather source. With qgZ (PathContext::reduce_scatter quantized, stage 3) a bucket's
/// reduce-scatter travels as int4 through the topology's levels instead (complete on return).

#include <algorithm>
#include <cstddef>
#include <vector>

#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/grads/uncompressed.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class PooledBuckets : public Uncompressed {
 public:
  using value_type = T;

  PooledBuckets(const PathContext<Ops>& c)
      : c_(c),
        part_(c.ops->template allocate<T>(c.layout->partition_numel(), MemoryCategory::grads, c.ledger)),
        acc_(c, c.layout->partition_numel()),
        slot_(c.layout->buckets().size(), -1) {
    std::size_t biggest = 0;
    for (const auto& b : c.layout->buckets()) biggest = std::max(biggest, b.numel);
    const int count = std::min<int>(c.bucket_buffers, static_cast<int>(c.layout->buckets().size()));
    for (int i = 0; i < count; ++i) {
      pool_.push_back(c.ops->template allocate<T>(biggest, MemoryCategory::comm_buffers, c.ledger));
      free_.push_back(count - 1 - i);
    }
  }

  void open(std::size_t k, bool /*first_micro_step*/) {
    if (free_.empty()) {
      if (!inflight_.empty()) {
        complete_oldest();
      } else {
        // One layer's parameters span more buckets than the pool holds: grow it (the ledger shows
        // the extra buffer under comm_buffers).
        pool_.push_back(c_.ops->template allocate<T>(pool_.empty() ? 0 : pool_.front().size(),
                                                     MemoryCategory::comm_buffers, c_.ledger));
        free_.push_back(static_cast<int>(pool_.size() - 1));
      }
    }
    slot_[k] = free_.back();
    free_.pop_back();
    c_.ops->zero(bucket_grads(k), c_.layout->buckets()[k].numel);
  }

  T* bucket_grads(std::size_t k) { return pool_[static_cast<std::size_t>(slot_[k])].data(); }

  void ready(std::size_t k) {
    const Bucket& b = c_.layout->buckets()[k];
    T* mine = part_.data() + b.part_offset;
    inflight_.push(k, c_.reduce_scatter.reduce_scatter_avg(*c_.comm, bucket_grads(k), mine, b.block));
    if (!c_.overlap_comm) {
      while (!inflight_.empty()) complete_oldest();
    }
  }

  void end_micro_step(bool /*boundary*/) {
    while (!inflight_.empty()) complete_oldest();
  }

  OwnedGrads<T> owned() const {
    if (acc_.active()) return acc_.owned();
    return {part_.data(), nullptr, true};
  }

  /// Where the optimizer writes the new 16-bit values of this rank's partition and the parameter
  /// path all-gathers from (each element's gradient is read before its output is written).
  T* gather_source() { return part_.data(); }

  void clear_accumulated() { acc_.clear(); }
  void drain_quietly() noexcept { inflight_.drain_quietly(); }

 private:
  void complete_oldest() {
    const std::size_t k = inflight_.pop_wait();
    const Bucket& b = c_.layout->buckets()[k];
    if (acc_.active()) acc_.add(b.part_offset, part_.data() + b.part_offset, b.block);
    free_.push_back(slot_[k]);
    slot_[k] = -1;
  }

  PathContext<Ops> c_;
  typename Ops::template Buffer<T> part_;   // [partition_numel]: reduced gradients, then the gather source
  Accumulator<T, Ops> acc_;                 // [partition_numel], with accumulation only
  std::vector<typename Ops::template Buffer<T>> pool_;  // [bucket_buffers][largest bucket]
  std::vector<int> free_;                   // pool slots not holding a bucket
  std::vector<int> slot_;                   // [bucket] pool slot held, or -1
  InFlight inflight_;
};

}  // namespace zerotk::zero
