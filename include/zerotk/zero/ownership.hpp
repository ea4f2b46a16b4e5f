#pragma once
/// \file zerotk/zero/ownership.hpp
/// What one rank owns of a flat group: the elements its optimizer steps, its fp32 master and state
/// cover, and a checkpoint's fragment table lists. A Partitioner selects one (zero/partitioner.hpp):
///
///   OwnsAll     stage 0: every element; the owned buffer is the flat buffer itself
///   OwnsBlocks  stages 1-3: block r of every bucket, laid end to end as the partition
///               ([partition_numel]: block r of bucket K-1, ..., block r of bucket 0)
///
/// Both answer the same questions, so the engine's group never asks which stage it is:
///   numel(layout)                       elements of the owned buffer
///   fragments(layout, rank)             every piece of a parameter the rank owns, owned-buffer order
///   segments(layout, rank, where)       the optimizer's pieces: offsets into the owned buffer, and
///                                       into the flat buffer where gradients or output live there
///   norm_offset(layout, k, rank, owned_shaped)   where bucket k's share of the norm starts
///   for_each_block(layout, f)           f(k, owned_offset, numel): what the rank owns of bucket k
///                                       and where it sits in the owned buffer (the parameter
///                                       paths' read_owned(k, f) hands out the same elements)
///   reduce_tensor_sums(comm, sums, n)   per-tensor partial sums (LAMB's norms) over the ranks a
///                                       tensor is spread over: none for OwnsAll, all for OwnsBlocks

#include <cstddef>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::zero {

/// Where the optimizer's gradients and output are read and written: owned-shaped (like the master)
/// or in the flat buffer (stage 1 reads and writes its blocks in place).
struct SegmentPlaces {
  bool grads_flat = false;
  bool out_flat = false;
};

struct OwnsAll {
  /// Every rank holds every tensor whole: its sums are already complete.
  template <class Comm>
  static void reduce_tensor_sums(Comm&, double*, std::size_t) noexcept {}

  static std::size_t numel(const BucketLayout& l) noexcept { return l.flat_numel(); }
  static std::vector<Fragment> fragments(const BucketLayout& l, int rank) { return l.fragments(rank, false); }
  /// Every parameter whole, in flat coordinates (the owned buffer is the flat buffer).
  static std::vector<kernels::Segment> segments(const BucketLayout& l, int /*rank*/, SegmentPlaces) {
    std::vector<kernels::Segment> out;
    for (const auto& s : l.flat_segments()) out.push_back(kernels::Segment{s.offset, s.numel, s.group, s.tensor});
    return out;
  }
  /// Every rank holds the reduced gradients whole; each adds up its own block of every bucket, so
  /// over all ranks the norm sees every element once.
  static std::size_t norm_offset(const BucketLayout& l, std::size_t k, int rank, bool /*owned_shaped*/) noexcept {
    return l.block_flat_offset(k, rank);
  }
  template <class F>
  static void for_each_block(const BucketLayout& l, F&& f) {
    for (std::size_t k = 0; k < l.buckets().size(); ++k) f(k, l.buckets()[k].flat_offset, l.buckets()[k].numel);
  }
};

struct OwnsBlocks {
  /// A tensor's elements are spread over the ranks' blocks: sum its partials over all of them.
  template <class Comm>
  static void reduce_tensor_sums(Comm& comm, double* sums, std::size_t n) {
    if (n > 0) comm.all_reduce(sums, sums, n, DType::fp64, comm::ReduceOp::sum).wait();
  }

  static std::size_t numel(const BucketLayout& l) noexcept { return l.partition_numel(); }
  static std::vector<Fragment> fragments(const BucketLayout& l, int rank) { return l.fragments(rank, true); }
  /// The pieces of rank r's blocks, bucket K-1 first (partition order); where the gradients or the
  /// output live in the flat buffer (stage 1 in place), their offsets are flat ones.
  static std::vector<kernels::Segment> segments(const BucketLayout& l, int rank, SegmentPlaces where) {
    std::vector<kernels::Segment> out;
    for (std::size_t k = l.buckets().size(); k-- > 0;) {
      const auto part = l.block_segments(k, rank, true);
      const auto flat = l.block_segments(k, rank, false);
      for (std::size_t i = 0; i < part.size(); ++i) {
        kernels::Segment seg{part[i].offset, part[i].numel, part[i].group, part[i].tensor};
        if (where.grads_flat) seg.grad_offset = flat[i].offset;
        if (where.out_flat) seg.out_offset = flat[i].offset;
        out.push_back(seg);
      }
    }
    return out;
  }
  static std::size_t norm_offset(const BucketLayout& l, std::size_t k, int rank, bool owned_shaped) noexcept {
    return owned_shaped ? l.buckets()[k].part_offset : l.block_flat_offset(k, rank);
  }
  template <class F>
  static void for_each_block(const BucketLayout& l, F&& f) {
    for (std::size_t k = 0; k < l.buckets().size(); ++k) f(k, l.buckets()[k].part_offset, l.buckets()[k].block);
  }
};

}  // namespace zerotk::zero
