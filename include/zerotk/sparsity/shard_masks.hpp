#pragma once
/// \file zerotk/sparsity/shard_masks.hpp
/// ShardMasks: the N:M masks of one flat group over what one rank owns of it (zero/ownership.hpp),
/// never over the whole model. One keep flag per owned element (1 byte; 1 for every element of a
/// parameter that is not sparse, and for padding).
///
/// Choosing needs whole groups of M, and a ZeRO block boundary may cut a group: the rank owning its
/// first elements and the one owning its last both need all M values. choose() therefore all-gathers
/// every rank's block edges (the first and last M-1 master values of its block of each bucket:
/// 2 (M-1) floats per bucket per rank), from which every rank reads the values of a cut group that
/// other ranks own. A group's elements outside a rank's block lie within M-1 elements of that block's
/// edges, so in the last M-1 of a block before it or the first M-1 of a block after it, even when
/// blocks are shorter than M-1 (a group then spans three or more blocks): the edges always hold
/// them. Every rank evaluates a cut group from the same M
/// values with the same rule (sparsity/nm.hpp), so the ranks' masks agree where they meet. A rank
/// that owns everything (stage 0) exchanges nothing.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/sparsity/nm.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::sparsity {

class ShardMasks {
 public:
  ShardMasks() = default;

  /// `sparse[i]`: whether parameter i of `layout` is masked (its element count a multiple of m).
  /// `fragments`: what `rank` owns, in owned-buffer coordinates (Own::fragments); `owned_numel` the
  /// owned buffer's length; `owns_all`: the rank owns every element (stage 0). The flags are
  /// allocated here (MemoryCategory::other of `ledger`), all 1 until choose() or load().
  ShardMasks(int n, int m, const zero::BucketLayout& layout, std::vector<zero::Fragment> fragments,
             std::vector<char> sparse, std::size_t owned_numel, int rank, bool owns_all, MemoryLedger* ledger)
      : n_(n), m_(m), rank_(rank), owns_all_(owns_all), layout_(&layout), fragments_(std::move(fragments)),
        sparse_(std::move(sparse)), keep_(owned_numel, MemoryCategory::other, ledger) {
    if (sparse_.size() != layout.param_count()) {
      throw usage_error("one sparse flag per parameter expected", "sparsity::ShardMasks",
                        std::to_string(sparse_.size()) + " flags for " + std::to_string(layout.param_count()));
    }
    for (std::size_t i = 0; i < sparse_.size(); ++i) {
      if (sparse_[i] && layout.param(i).numel % static_cast<std::size_t>(m) != 0) {
        throw usage_error("a sparse parameter's element count must be a multiple of M", "sparsity::ShardMasks",
                          "parameter " + std::to_string(i) + ": " + std::to_string(layout.param(i).numel) +
                              " elements, M " + std::to_string(m));
      }
      any_ = any_ || sparse_[i] != 0;
    }
    std::fill(keep_.begin(), keep_.end(), std::uint8_t{1});
  }

  /// Whether any parameter of the group is sparse.
  bool active() const noexcept { return any_; }
  /// Whether the masks have been chosen (or loaded): from then on zero_pruned() prunes.
  bool chosen() const noexcept { return chosen_; }
  /// The keep flags over the owned buffer (1: kept).
  std::span<const std::uint8_t> keep() const noexcept { return {keep_.data(), keep_.size()}; }
  /// Owned elements the masks prune.
  std::size_t pruned() const noexcept {
    return static_cast<std::size_t>(std::count(keep_.begin(), keep_.end(), std::uint8_t{0}));
  }

  /// Chooses the masks from `master` (the owned buffer in fp32). Collective over `comm` (the group's
  /// data communicator) unless the rank owns everything.
  template <class Comm>
  void choose(const float* master, Comm& comm) {
    const std::size_t h = static_cast<std::size_t>(m_ - 1);
    const auto buckets = layout_->buckets();
    std::vector<float> edges;  // [world][bucket][2h]: first h, then last h values of each block
    if (!owns_all_) {
      std::vector<float> mine(buckets.size() * 2 * h, 0.0f);
      for (std::size_t k = 0; k < buckets.size(); ++k) {
        const zero::Bucket& b = buckets[k];
        for (std::size_t i = 0; i < h && i < b.block; ++i) mine[k * 2 * h + i] = master[b.part_offset + i];
        for (std::size_t i = 0; i < h; ++i) {
          if (b.block + i >= h) mine[k * 2 * h + h + i] = master[b.part_offset + b.block + i - h];
        }
      }
      edges.resize(mine.size() * static_cast<std::size_t>(layout_->world()));
      comm.all_gather(mine.data(), edges.data(), mine.size(), DType::fp32).wait();
    }
    const auto value_at = [&](std::size_t k, std::size_t flat) -> float {
      const zero::Bucket& b = buckets[k];
      const std::size_t at = flat - b.flat_offset, owner = at / b.block, pos = at % b.block;
      if (owns_all_) return master[flat];
      if (owner == static_cast<std::size_t>(rank_)) return master[b.part_offset + pos];
      const float* e = edges.data() + (owner * buckets.size() + k) * 2 * h;
      if (pos < h) return e[pos];
      if (pos + h >= b.block) return e[h + pos + h - b.block];
      throw usage_error("a cut group's value is in no block edge (a layout whose groups span more than two blocks' edges)",
                        "sparsity::ShardMasks::choose", "bucket " + std::to_string(k));
    };
    std::fill(keep_.begin(), keep_.end(), std::uint8_t{1});
    const std::size_t m = static_cast<std::size_t>(m_);
    float v[32];
    for (const zero::Fragment& f : fragments_) {
      if (!sparse_[f.param]) continue;
      const zero::ParamSlot& slot = layout_->param(f.param);
      for (std::size_t g = f.param_offset / m * m; g < f.param_offset + f.numel; g += m) {
        for (std::size_t j = 0; j < m; ++j) {
          const std::size_t p = g + j;
          v[j] = p >= f.param_offset && p < f.param_offset + f.numel ? master[f.owned_offset + (p - f.param_offset)]
                                                                     : value_at(slot.bucket, slot.flat_offset + p);
        }
        const std::uint32_t bits = keep_bits(v, n_, m_);
        for (std::size_t j = 0; j < m; ++j) {
          const std::size_t p = g + j;
          if (p >= f.param_offset && p < f.param_offset + f.numel) {
            keep_[f.owned_offset + (p - f.param_offset)] = static_cast<std::uint8_t>((bits >> j) & 1u);
          }
        }
      }
    }
    chosen_ = true;
  }

  /// Restores flags saved from keep() by an engine of the same layout and rank.
  void load(std::span<const std::uint8_t> keep) {
    if (keep.size() != keep_.size()) {
      throw usage_error("the saved sparsity masks are for another owned size", "sparsity::ShardMasks::load",
                        std::to_string(keep.size()) + " flags, this rank owns " + std::to_string(keep_.size()));
    }
    std::copy(keep.begin(), keep.end(), keep_.begin());
    chosen_ = true;
  }

  /// Back to no masks (a state taken before they were chosen).
  void reset() {
    std::fill(keep_.begin(), keep_.end(), std::uint8_t{1});
    chosen_ = false;
  }

  /// base[at(s) + j] := 0 for every pruned owned element j of each optimizer segment s (offset: the
  /// owned buffer's; at: where the segment's values sit in `base`, Segment::grad_at or out_at).
  template <class T, class At>
  void zero_pruned(T* base, std::span<const kernels::Segment> segments, At at) const {
    if (!chosen_) return;
    const T zero = from_float<T>(0.0f);
    for (const kernels::Segment& s : segments) {
      if (!sparse_[s.tensor]) continue;
      T* out = base + at(s);
      const std::uint8_t* keep = keep_.data() + s.offset;
      for (std::size_t j = 0; j < s.numel; ++j) {
        if (keep[j] == 0) out[j] = zero;
      }
    }
  }

 private:
  int n_ = 2, m_ = 4, rank_ = 0;
  bool owns_all_ = true, any_ = false, chosen_ = false;
  const zero::BucketLayout* layout_ = nullptr;
  std::vector<zero::Fragment> fragments_;
  std::vector<char> sparse_;
  TrackedBuffer<std::uint8_t> keep_;
};

}  // namespace zerotk::sparsity
