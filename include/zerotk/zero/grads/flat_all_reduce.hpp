#pragma once
/// \file zerotk/zero/grads/flat_all_reduce.hpp
/// Stage 0's gradient path: every rank keeps the whole flat gradient buffer and all-reduces it
/// (average over ranks) bucket by bucket.
///
///   when::every_micro_step   each bucket is all-reduced as soon as backward completes it (overlapped),
///                            and with gradient accumulation the reduced micro-step gradients are
///                            added into an accumulator (fp32, or the working precision)
///   when::at_boundary        backward accumulates into the buffer over the micro-steps, which is
///                            all-reduced once at the boundary (DeepSpeed's stage-0 order)

#include <cstddef>

#include "zerotk/policies.hpp"
#include "zerotk/zero/grads/context.hpp"

namespace zerotk::zero {

template <class T, class Ops, class When>
class FlatAllReduce {
  static constexpr bool kEveryMicroStep = std::is_same_v<When, when::every_micro_step>;

 public:
  FlatAllReduce(const PathContext<Ops>& c) : c_(c), grads_(c) {
    if constexpr (kEveryMicroStep) acc_ = Accumulator<T, Ops>(c, c.layout->flat_numel());
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
    return {grads_.data(), nullptr, true};
  }

  void clear_accumulated() { acc_.clear(); }
  void drain_quietly() noexcept { inflight_.drain_quietly(); }

 private:
  void launch(std::size_t k) {
    T* buf = grads_.bucket(k);
    inflight_.push(k, c_.comm->all_reduce(buf, buf, c_.layout->buckets()[k].numel, dtype_of_v<T>, comm::ReduceOp::avg));
  }

  void drain() {
    while (!inflight_.empty()) {
      const std::size_t k = inflight_.pop_wait();
      if (acc_.active()) acc_.add(c_.layout->buckets()[k].flat_offset, grads_.bucket(k), c_.layout->buckets()[k].numel);
    }
  }

  PathContext<Ops> c_;
  FlatGradBuffer<T, Ops, kEveryMicroStep> grads_;
  Accumulator<T, Ops> acc_;                 // [flat_numel], every_micro_step with accumulation only
  InFlight inflight_;
};

}  // namespace zerotk::zero
