#pragma once
/// \file zerotk/zero/grads/block_reduce_scatter.hpp
/// Stage 1's gradient path: every rank keeps the whole flat gradient buffer while backward writes
/// it, and each bucket is reduce-scattered (average over ranks) in place, so rank r's reduced
/// gradients land in its own block r of the bucket. The optimizer reads them there (no partition
/// copy: per-rank memory is exactly 4 Psi + 12 Psi/N).
///
///   when::at_boundary        backward accumulates over the micro-steps; one reduce-scatter per bucket
///                            at the boundary (DeepSpeed's stage-1 order)
///   when::every_micro_step   each bucket is reduced as soon as backward completes it, and the
///                            reduced blocks are added into a partition-shaped accumulator

#include <cstddef>

#include "zerotk/policies.hpp"
#include "zerotk/zero/grads/context.hpp"

namespace zerotk::zero {

template <class T, class Ops, class When>
class BlockReduceScatter {
  static constexpr bool kEveryMicroStep = std::is_same_v<When, when::every_micro_step>;

 public:
  BlockReduceScatter(const PathContext<Ops>& c) : c_(c), grads_(c) {
    if constexpr (kEveryMicroStep) acc_ = Accumulator<T, Ops>(c, c.layout->partition_numel());
  }

  void open(std::size_t k, bool first_micro_step) { grads_.open(k, first_micro_step); }
  T* bucket_grads(std::size_t k) { return grads_.bucket(k); }

  void ready(std::size_t k) {
    if constexpr (kEveryMicroStep) {
      launch(k);
      if (!c_.overlap_comm) drain();
    }
  }

  void end_micro_step(bool boundary) {
    if constexpr (kEveryMicroStep) {
      drain();
    } else if (boundary) {
      for (std::size_t k = c_.layout->buckets().size(); k-- > 0;) launch(k);
      drain();
    }
  }

  OwnedGrads<T> owned() const {
    if (acc_.active()) return acc_.owned();
    return {grads_.data(), nullptr, false};  // this rank's blocks, in place in the flat buffer
  }

  void clear_accumulated() { acc_.clear(); }
  void drain_quietly() noexcept { inflight_.drain_quietly(); }

 private:
  void launch(std::size_t k) {
    const Bucket& b = c_.layout->buckets()[k];
    inflight_.push(k, c_.comm->reduce_scatter(grads_.bucket(k), own_block(k), b.block, dtype_of_v<T>, comm::ReduceOp::avg));
  }
  T* own_block(std::size_t k) { return grads_.at(c_.layout->block_flat_offset(k, c_.rank())); }

  void drain() {
    while (!inflight_.empty()) {
      const std::size_t k = inflight_.pop_wait();
      if (acc_.active()) acc_.add(c_.layout->buckets()[k].part_offset, own_block(k), c_.layout->buckets()[k].block);
    }
  }

  PathContext<Ops> c_;
  FlatGradBuffer<T, Ops, kEveryMicroStep> grads_;
  Accumulator<T, Ops> acc_;                 // [partition_numel], every_micro_step with accumulation only
  InFlight inflight_;
};

}  // namespace zerotk::zero
