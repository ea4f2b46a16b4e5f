#pragma once
/// \file zerotk/zero/grads/flat_buffer_path.hpp
/// The gradient path of stages 0 and 1: every rank keeps the whole flat gradient buffer that backward
/// writes, and each bucket is reduced (average over ranks) by a `Reduction`, which is what tells the
/// stages apart (flat_all_reduce.hpp: all-reduce the bucket; block_reduce_scatter.hpp: reduce-scatter
/// it into this rank's block). When the buckets are reduced is the schedule:
///
///   when::every_micro_step   each bucket is reduced as soon as backward completes it (overlapped), and
///                            with gradient accumulation the reduced pieces are added into an
///                            accumulator (fp32, or the working precision)
///   when::at_boundary        backward accumulates into the buffer over the micro-steps, which is
///                            reduced once at the boundary (DeepSpeed's order for stages 0 and 1)
///
/// A Reduction provides, for gradients `g` (a FlatGradBuffer) and bucket k:
///   accumulator_numel(layout)     the accumulator's extent (the flat buffer, or the partition)
///   launch(c, g, k)               the collective, returning its Work
///   reduced(c, g, k)              {accumulator offset, data, numel} of what this rank keeps of bucket k
///   owned(g)                      OwnedGrads over the buffer when nothing was accumulated

#include <cstddef>
#include <type_traits>

#include "zerotk/policies.hpp"
#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/grads/uncompressed.hpp"

namespace zerotk::zero {

/// What a rank keeps of one reduced bucket: where it goes in the accumulator, and its values.
template <class T>
struct ReducedPiece {
  std::size_t acc_offset;
  const T* data;
  std::size_t numel;
};

template <class T, class Ops, class When, class Reduction>
class FlatBufferPath : public Uncompressed {
  static constexpr bool kEveryMicroStep = std::is_same_v<When, when::every_micro_step>;

 public:
  using value_type = T;

  FlatBufferPath(const PathContext<Ops>& c) : c_(c), grads_(c) {
    if constexpr (kEveryMicroStep) acc_ = Accumulator<T, Ops>(c, Reduction::accumulator_numel(*c.layout));
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
    return Reduction::owned(grads_);
  }

  void clear_accumulated() { acc_.clear(); }
  void drain_quietly() noexcept { inflight_.drain_quietly(); }

 private:
  void launch(std::size_t k) { inflight_.push(k, Reduction::launch(c_, grads_, k)); }

  void drain() {
    while (!inflight_.empty()) {
      const std::size_t k = inflight_.pop_wait();
      if (acc_.active()) {
        const ReducedPiece<T> p = Reduction::reduced(c_, grads_, k);
        acc_.add(p.acc_offset, p.data, p.numel);
      }
    }
  }

  PathContext<Ops> c_;
  FlatGradBuffer<T, Ops, kEveryMicroStep> grads_;
  Accumulator<T, Ops> acc_;  // every_micro_step with accumulation only
  InFlight inflight_;
};

}  // namespace zerotk::zero
