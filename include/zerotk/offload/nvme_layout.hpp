#pragma once
/// \file zerotk/offload/nvme_layout.hpp
/// The sizes the NVMe homes derive from their options, in one place: the homes (offload/nvme.hpp,
/// offload/nvme_shard.hpp) build with them and the planner (plan/model_states.hpp) predicts with
/// them. Blocks and buffers are padded with io::direct_round.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>

#include "zerotk/core/error.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::offload {

/// Offload<Nvme>: the pinned swap buffers (each one sub-group's master, m and v): `buffer_count`,
/// raised to what the pipelining needs (1, +1 for pipeline_read, +1 for pipeline_write), never more
/// than the sub-groups (which then never share a buffer).
inline std::size_t swap_buffer_count(std::size_t buffer_count, bool pipeline_read, bool pipeline_write,
                                     std::size_t sub_groups) noexcept {
  const std::size_t needed = 1 + (pipeline_read ? 1 : 0) + (pipeline_write ? 1 : 0);
  return std::min(std::max(buffer_count, needed), sub_groups);
}

/// OffloadParams<Nvme>: how many leading buckets' blocks fit whole in `max_in_cpu` elements (they
/// are kept in host memory too; DeepSpeed's rule for its `max_in_cpu`).
inline std::size_t blocks_in_cpu(const zero::BucketLayout& l, std::size_t max_in_cpu) noexcept {
  std::size_t k = 0, sum = 0;
  for (; k < l.buckets().size() && l.buckets()[k].block <= max_in_cpu - sum; ++k) sum += l.buckets()[k].block;
  return k;
}

/// The elements those blocks hold: what they take of the `max_in_cpu` budget.
inline std::size_t elements_in_cpu(const zero::BucketLayout& l, std::size_t max_in_cpu) noexcept {
  std::size_t sum = 0;
  for (std::size_t k = 0, n = blocks_in_cpu(l, max_in_cpu); k < n; ++k) sum += l.buckets()[k].block;
  return sum;
}

/// OffloadParams<Nvme>: the error its home raises when `buffer_size` (elements) cannot hold the
/// largest block of layout `l` (every staging buffer holds one whole block), or none. The planner
/// asks the same question, so it never offers a configuration the engine refuses.
inline std::optional<config_error> param_buffer_size_error(const zero::BucketLayout& l, std::size_t buffer_size) {
  std::size_t largest = 0;
  for (const zero::Bucket& b : l.buckets()) largest = std::max(largest, b.block);
  if (largest <= buffer_size) return std::nullopt;
  return config_error("smaller than the largest parameter block this rank swaps (" + std::to_string(largest) +
                          " elements: a stage 3 bucket divided by the world size); raise it or make the buckets "
                          "smaller (reduce_bucket_size)",
                      "zero_optimization.offload_param.buffer_size", std::to_string(buffer_size));
}

}  // namespace zerotk::offload
