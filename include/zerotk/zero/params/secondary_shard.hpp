#pragma once
/// \file zerotk/zero/params/secondary_shard.hpp
/// ZeRO++ hpZ (hierarchical partitioning, `zero_hpz_partition_size` g > 1): a second, coarser shard
/// of the working-precision parameters, kept besides stage 3's primary one so that a layer's
/// backward gathers its buckets inside a group of g consecutive ranks instead of over all W.
///
///   groups:  ranks [0, g) | [g, 2g) | ... (W / g of them); member j = rank % g
///   bucket k (numel elements, a multiple of 2W, so of g):  [ slice 0 | slice 1 | ... | slice g-1 ]
///   member j keeps slice j of every non-persistent bucket:  numel / g elements each,
///   store of rank r:  [ slice j of bucket 0 | slice j of bucket 1 | ... ]   (S Psi_pad / g bytes)
///
/// A bucket gathered over the world (the primary shards) leaves its full values in a pool buffer;
/// `keep(k, values)` copies the member's slice out of them, and from then on `gather(k, out)` can
/// rebuild the bucket with an all-gather on the group communicator alone. The copy is current
/// until the shard's values change (the optimizer's update, a `gather` scope that keeps writes, a
/// restored checkpoint): FetchOnDemand calls `invalidate` on every path that can write its shard,
/// so the next gather of the bucket goes over the world again and refreshes it. Every rank sees the
/// same gathers and the same writes, so every rank makes the same choice and the collectives match.
///
/// Memory: one buffer of S Psi_pad / g bytes for the life of the engine (the ledger's
/// MemoryCategory::secondary). With g = W the slices are the primary blocks themselves: a
/// redundant copy whose gathers run on a communicator over the whole world.

#include <cstddef>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class SecondaryShard {
 public:
  /// `group` is this rank's group communicator (size g, rank = member index); `persistent[k]`:
  /// bucket k stays gathered at all times and needs no secondary slice.
  SecondaryShard(const BucketLayout& layout, Ops& ops, device::OrderedCommunicator<Ops>& group, MemoryLedger* ledger,
                 const std::vector<char>& persistent)
      : layout_(&layout), ops_(&ops), group_(&group), offset_(layout.buckets().size(), kNone),
        current_(layout.buckets().size(), 0) {
    const auto g = static_cast<std::size_t>(group.size());
    std::size_t n = 0;
    for (std::size_t k = 0; k < layout.buckets().size(); ++k) {
      if (k < persistent.size() && persistent[k]) continue;
      offset_[k] = n;
      n += layout.buckets()[k].numel / g;  // numel is a multiple of 2W, W a multiple of g
    }
    store_ = ops.template allocate<T>(n, MemoryCategory::secondary, ledger);
  }

  /// Whether bucket k's slice holds the shard's current values (a group gather can rebuild it).
  bool current(std::size_t k) const noexcept { return current_[k] != 0; }
  /// Elements of one bucket's slice on this rank.
  std::size_t slice_numel(std::size_t k) const noexcept {
    return layout_->buckets()[k].numel / static_cast<std::size_t>(group_->size());
  }
  /// Elements of the whole store: Psi_pad / g over the non-persistent buckets.
  std::size_t numel() const noexcept { return store_.size(); }

  /// Bucket k's full values (gathered over the world) are in `values`: keep this member's slice.
  void keep(std::size_t k, const T* values) {
    if (offset_[k] == kNone) return;
    const std::size_t n = slice_numel(k);
    ops_->copy(values + static_cast<std::size_t>(group_->rank()) * n, store_.data() + offset_[k], n);
    current_[k] = 1;
  }

  /// Starts rebuilding bucket k into `out` (numel elements) from the group's slices. Needs current(k).
  [[nodiscard]] comm::Work gather(std::size_t k, T* out) {
    return group_->all_gather(store_.data() + offset_[k], out, slice_numel(k), dtype_of_v<T>);
  }

  /// The shard's values of bucket k (or of every bucket) changed: the slices are stale.
  void invalidate(std::size_t k) noexcept { current_[k] = 0; }
  void invalidate() noexcept {
    for (char& c : current_) c = 0;
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  const BucketLayout* layout_;
  Ops* ops_;
  device::OrderedCommunicator<Ops>* group_;
  typename Ops::template Buffer<T> store_;  // [sum over non-persistent buckets of numel / g]
  std::vector<std::size_t> offset_;         // [bucket] where its slice starts in store_, kNone: persistent
  std::vector<char> current_;               // [bucket] the slice holds the shard's current values
};

}  // namespace zerotk::zero
