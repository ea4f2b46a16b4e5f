#pragma once
/// \file zerotk/zero/layout.hpp
/// Where every parameter element lives: the flat buffer, its buckets, and each rank's partition.
///
/// Parameters are flattened in the order the Module visits them. They are grouped into buckets by
/// walking that order BACKWARDS (backward produces gradients last-layer first, so bucket 0 fills
/// first). A bucket holds whole parameters up to the bucket size; a parameter larger than a bucket
/// gets a bucket of its own; with fetch units (stage 3) a bucket never holds two units' parameters. Each bucket is padded to a multiple of 2W elements (DeepSpeed's
/// alignment) and cut into W equal blocks: rank r owns block r of every bucket.
///
/// Why per-bucket partitions (DeepSpeed cuts the whole flat buffer into W pieces instead): a bucket is
/// then exactly the layout an equal-block reduce-scatter and all-gather expect, so every bucket is one
/// collective with no per-owner pieces, and the per-rank volume is the ideal (W-1)/W of the bucket.
/// With one bucket covering the model the two layouts coincide.
///
///   flat:      [ bucket K-1 | ... | bucket 1 | bucket 0 ]      (memory order = visitation order)
///   bucket k:  [ block 0 | block 1 | ... | block W-1 ]         (each `block` elements)
///   partition of rank r: [ block r of bucket K-1 | ... | block r of bucket 0 ]   (Psi_pad / W elements)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::zero {

/// A parameter's place in the flat buffer.
struct ParamSlot {
  std::size_t flat_offset = 0;
  std::size_t numel = 0;
  std::uint32_t bucket = 0;
  std::uint32_t group = 0;  ///< optimizer parameter group
};

struct Bucket {
  std::size_t flat_offset = 0;    ///< first element in the flat buffer
  std::size_t numel = 0;          ///< padded size, a multiple of 2W
  std::size_t used = 0;           ///< elements that belong to parameters (the rest is padding)
  std::size_t block = 0;          ///< numel / W: elements each rank owns
  std::size_t part_offset = 0;    ///< where this bucket's block sits in every rank's partition
  std::vector<std::uint32_t> params;  ///< parameter indices, visitation order
};

/// One contiguous piece of a rank's partition that belongs to one parameter tensor: the layout's
/// own record. The optimizer kernels take kernels::Segment (kernels/tensor_list.hpp), which adds
/// where the piece's gradient and working copy sit when they are not at `offset`; the ownership
/// rules (zero/ownership.hpp) make those from these.
struct PartitionSegment {
  std::size_t offset;   ///< into the rank's partition (or the flat buffer when the rank owns everything)
  std::size_t numel;
  std::uint32_t group;
  std::uint32_t tensor;
};

/// A piece of one parameter that a rank owns: elements [param_offset, param_offset + numel) of
/// parameter `param` (index in the layout) sit at `owned_offset` of the rank's owned buffer (its
/// partition, or the whole flat buffer when the rank owns everything). The checkpoint's fragment
/// table is made of these, which is what lets a checkpoint load on another world size or stage.
struct Fragment {
  std::uint32_t param = 0;
  std::size_t param_offset = 0;
  std::size_t numel = 0;
  std::size_t owned_offset = 0;
  friend bool operator==(const Fragment&, const Fragment&) = default;
};

class BucketLayout {
 public:
  BucketLayout() = default;

  /// `numels[i]` is parameter i's element count (visitation order), `groups[i]` its optimizer group.
  /// `bucket_numel` is the bucket capacity in elements (>= 1). `units` (empty, or one per parameter):
  /// a bucket never holds parameters of two units (stage 3 fetches whole buckets, so a unit's
  /// buckets are exactly what its layer needs); consecutive parameters of one unit share a key.
  BucketLayout(std::span<const std::size_t> numels, std::span<const std::uint32_t> groups, int world,
               std::size_t bucket_numel, std::span<const std::uint32_t> units = {})
      : world_(world) {
    if (world < 1) throw usage_error("world size must be >= 1", "BucketLayout", std::to_string(world));
    if (bucket_numel == 0) throw usage_error("bucket size must be >= 1 element", "BucketLayout", "0");
    if (groups.size() != numels.size()) throw usage_error("one group per parameter expected", "BucketLayout");
    if (!units.empty() && units.size() != numels.size()) throw usage_error("one unit per parameter expected", "BucketLayout");
    const std::size_t align = 2 * static_cast<std::size_t>(world);
    params_.resize(numels.size());

    // Bucket membership, walking parameters backwards.
    std::vector<std::vector<std::uint32_t>> members;  // readiness order
    std::size_t fill = 0;
    for (std::size_t j = numels.size(); j-- > 0;) {
      const std::size_t n = numels[j];
      const bool new_unit = !units.empty() && !members.empty() && units[j] != units[members.back().back()];
      if (members.empty() || new_unit || (fill > 0 && fill + n > bucket_numel)) {
        members.emplace_back();
        fill = 0;
      }
      members.back().push_back(static_cast<std::uint32_t>(j));
      fill += n;
    }

    // Memory order: last bucket first, so the flat buffer follows visitation order.
    buckets_.resize(members.size());
    std::size_t offset = 0, part = 0;
    for (std::size_t k = members.size(); k-- > 0;) {
      Bucket& b = buckets_[k];
      std::reverse(members[k].begin(), members[k].end());
      b.params = std::move(members[k]);
      b.flat_offset = offset;
      for (std::uint32_t i : b.params) {
        params_[i] = ParamSlot{offset + b.used, numels[i], static_cast<std::uint32_t>(k), groups[i]};
        b.used += numels[i];
      }
      b.numel = (b.used + align - 1) / align * align;
      if (b.numel == 0) b.numel = align;  // a bucket of empty tensors still takes part in collectives
      b.block = b.numel / static_cast<std::size_t>(world);
      b.part_offset = part;
      offset += b.numel;
      part += b.block;
    }
    flat_numel_ = offset;
    partition_numel_ = part;
  }

  int world() const noexcept { return world_; }
  std::size_t flat_numel() const noexcept { return flat_numel_; }
  std::size_t partition_numel() const noexcept { return partition_numel_; }
  std::size_t param_count() const noexcept { return params_.size(); }
  const ParamSlot& param(std::size_t i) const noexcept { return params_[i]; }
  std::span<const Bucket> buckets() const noexcept { return buckets_; }
  std::size_t used_numel() const noexcept {
    std::size_t n = 0;
    for (const auto& b : buckets_) n += b.used;
    return n;
  }

  /// First flat element of rank r's block in bucket k.
  std::size_t block_flat_offset(std::size_t k, int rank) const noexcept {
    return buckets_[k].flat_offset + static_cast<std::size_t>(rank) * buckets_[k].block;
  }

  /// Pieces of parameters inside rank r's block of bucket k, with offsets into the rank's partition
  /// (`partition_coordinates`) or into the flat buffer.
  std::vector<PartitionSegment> block_segments(std::size_t k, int rank, bool partition_coordinates) const {
    std::vector<PartitionSegment> out;
    const Bucket& b = buckets_[k];
    const std::size_t lo = block_flat_offset(k, rank), hi = lo + b.block;
    for (std::uint32_t i : b.params) {
      const ParamSlot& p = params_[i];
      const std::size_t s = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.numel);
      if (s >= e) continue;
      const std::size_t off = partition_coordinates ? b.part_offset + (s - lo) : s;
      out.push_back(PartitionSegment{off, e - s, p.group, i});
    }
    return out;
  }

  /// All segments of rank r over every bucket, partition coordinates.
  std::vector<PartitionSegment> partition_segments(int rank) const {
    std::vector<PartitionSegment> out;
    for (std::size_t k = buckets_.size(); k-- > 0;) {
      auto s = block_segments(k, rank, true);
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }

  /// What rank r owns, parameter piece by piece, in owned-buffer order: its partition (`partitioned`)
  /// or, when every rank owns the whole flat buffer (stage 0), every parameter whole.
  std::vector<Fragment> fragments(int rank, bool partitioned) const {
    std::vector<Fragment> out;
    if (!partitioned) {
      for (const Bucket* b = buckets_.data() + buckets_.size(); b-- != buckets_.data();) {
        for (std::uint32_t i : b->params) {
          if (params_[i].numel) out.push_back({i, 0, params_[i].numel, params_[i].flat_offset});
        }
      }
      return out;
    }
    for (std::size_t k = buckets_.size(); k-- > 0;) {
      const std::size_t lo = block_flat_offset(k, rank);
      for (const PartitionSegment& s : block_segments(k, rank, true)) {
        const std::size_t flat = lo + (s.offset - buckets_[k].part_offset);
        out.push_back({s.tensor, flat - params_[s.tensor].flat_offset, s.numel, s.offset});
      }
    }
    return out;
  }

  /// Every parameter as one segment in flat coordinates (a rank that owns everything: stage 0).
  std::vector<PartitionSegment> flat_segments() const {
    std::vector<PartitionSegment> out;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].numel) out.push_back({params_[i].flat_offset, params_[i].numel, params_[i].group, static_cast<std::uint32_t>(i)});
    }
    return out;
  }

 private:
  int world_ = 1;
  std::vector<ParamSlot> params_;
  std::vector<Bucket> buckets_;  // readiness order
  std::size_t flat_numel_ = 0, partition_numel_ = 0;
};

}  // namespace zerotk::zero
