#pragma once
/// \file zerotk/zero/grads/block_reduce_scatter.hpp
/// Stage 1's gradient path: every rank keeps the whole flat gradient buffer while backward writes
/// it, and each bucket is reduce-scattered (average over ranks) in place, so rank r's reduced
/// gradients land in its own block r of the bucket. The optimizer reads them there (no partition
/// copy: per-rank memory is exactly 4 Psi + 12 Psi/N). The schedule is flat_buffer_path.hpp's
/// (at_boundary: DeepSpeed's stage-1 order; every_micro_step: the reduced blocks are added into a
/// partition-shaped accumulator).

#include <cstddef>

#include "zerotk/zero/grads/flat_buffer_path.hpp"

namespace zerotk::zero {

/// Each bucket reduce-scattered into this rank's block of it.
struct ScatterBucketsToBlocks {
  static std::size_t accumulator_numel(const BucketLayout& l) { return l.partition_numel(); }

  template <class Ops, class G>
  static comm::Work launch(const PathContext<Ops>& c, G& g, std::size_t k) {
    using T = typename G::value_type;
    const Bucket& b = c.layout->buckets()[k];
    return c.comm->reduce_scatter(g.bucket(k), own_block(c, g, k), b.block, dtype_of_v<T>, comm::ReduceOp::avg);
  }

  template <class Ops, class G>
  static ReducedPiece<typename G::value_type> reduced(const PathContext<Ops>& c, G& g, std::size_t k) {
    const Bucket& b = c.layout->buckets()[k];
    return {b.part_offset, own_block(c, g, k), b.block};
  }

  /// This rank's blocks, in place in the flat buffer.
  template <class G>
  static OwnedGrads<typename G::value_type> owned(const G& g) {
    return {g.data(), nullptr, false};
  }

 private:
  template <class Ops, class G>
  static typename G::value_type* own_block(const PathContext<Ops>& c, G& g, std::size_t k) {
    return g.at(c.layout->block_flat_offset(k, c.rank()));
  }
};

template <class T, class Ops, class When>
using BlockReduceScatter = FlatBufferPath<T, Ops, When, ScatterBucketsToBlocks>;

}  // namespace zerotk::zero
