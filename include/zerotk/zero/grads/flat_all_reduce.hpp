#pragma once
/// \file zerotk/zero/grads/flat_all_reduce.hpp
/// Stage 0's gradient path: every rank keeps the whole flat gradient buffer and all-reduces it
/// (average over ranks) bucket by bucket; the schedule (when::every_micro_step | at_boundary) is
/// flat_buffer_path.hpp's. With a 1-bit optimizer in its compressed phase the all-reduce is off
/// (PathContext::local_gradients) and each rank keeps its own gradients.

#include <cstddef>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/zero/grads/flat_buffer_path.hpp"

namespace zerotk::zero {

/// Each bucket all-reduced in place; the whole buffer is this rank's (replicated) gradient.
struct AllReduceBuckets {
  static std::size_t accumulator_numel(const BucketLayout& l) { return l.flat_numel(); }

  /// The bucket's all-reduce; none while a 1-bit optimizer keeps the gradients local (its bytes
  /// are counted as skipped).
  template <class Ops, class G>
  static comm::Work launch(const PathContext<Ops>& c, G& g, std::size_t k) {
    using T = typename G::value_type;
    T* buf = g.bucket(k);
    const std::size_t n = c.layout->buckets()[k].numel;
    if (c.local_gradients != nullptr && c.local_gradients->on) {
      c.local_gradients->skipped_wire_bytes += comm::ring_wire_bytes(comm::OpKind::all_reduce, n * sizeof(T), c.world());
      return comm::Work{};
    }
    return c.comm->all_reduce(buf, buf, n, dtype_of_v<T>, comm::ReduceOp::avg);
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
