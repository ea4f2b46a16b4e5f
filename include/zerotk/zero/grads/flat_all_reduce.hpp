#pragma once
/// \file zerotk/zero/grads/flat_all_reduce.hpp
/// Stage 0's gradient path: every rank keeps the whole flat gradient buffer and all-reduces it
/// (average over ranks) bucket by bucket; the schedule (when::every_micro_step | at_boundary) is
/// flat_buffer_path.hpp's.

#include <cstddef>

#include "zerotk/zero/grads/flat_buffer_path.hpp"

namespace zerotk::zero {

/// Each bucket all-reduced in place; the whole buffer is this rank's (replicated) gradient.
struct AllReduceBuckets {
  static std::size_t accumulator_numel(const BucketLayout& l) { return l.flat_numel(); }

  template <class Ops, class G>
  static comm::Work launch(const PathContext<Ops>& c, G& g, std::size_t k) {
    using T = typename G::value_type;
    T* buf = g.bucket(k);
    return c.comm->all_reduce(buf, buf, c.layout->buckets()[k].numel, dtype_of_v<T>, comm::ReduceOp::avg);
  }

  template <class Ops, class G>
  static ReducedPiece<typename G::value_type> reduced(const PathContext<Ops>& c, G& g, std::size_t k) {
    const Bucket& b = c.layout->buckets()[k];
    return {b.flat_offset, g.bucket(k), b.numel};
  }

  template <class G>
  static OwnedGrads<typename G::value_type> owned(const G& g) {
    return {g.data(), nullptr, true};
  }
};

template <class T, class Ops, class When>
using FlatAllReduce = FlatBufferPath<T, Ops, When, AllReduceBuckets>;

}  // namespace zerotk::zero
