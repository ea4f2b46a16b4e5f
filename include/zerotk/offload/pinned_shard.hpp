#pragma once
/// \file zerotk/offload/pinned_shard.hpp
/// PinnedShard: OffloadParams<Cpu>'s home for stage 3's parameter shard (DeepSpeed
/// `offload_param.device: cpu`). The shard (this rank's block of every bucket, [partition_numel] of
/// the working precision, or fp32 for the fp32-kept group) lives in page-locked host memory
/// (core/pinned_host_space.hpp, ledger space pinned_host, category params16), not in the compute
/// space. A bucket's block reaches the compute space just before its all-gather:
///
///   fetch(k):  shard[block of k] (pinned) -> this rank's block of k's gather buffer   (copy_from_host)
///              all-gather in place into the gather buffer                              (the communicator)
///
/// so no staging buffer of its own is needed: the gather buffer (the pool, or a persistent bucket's
/// buffer) is the staging, and the compute space holds only the gathered buckets. The in-place form
/// (send == recv + rank * n) is one every communicator accepts (comm/communicator.hpp); NCCL gathers
/// in place the same way.
///
/// Writes to the shard: the optimizer writes the updated values straight into it
/// (FlatGroup::prepare_update through FetchOnDemand::optimizer_out): with Offload<Cpu> the step
/// already runs on the host, so the values land where they live; with Offload<None> the step's
/// output goes from the compute space to host memory, which on Device<Host> is the same kind of
/// store. Initial values, load_state and GatherScope writes reach the shard through host copies.
/// Each of these is host-to-host on Device<Host>, the only device where engine/compat.hpp allows
/// OffloadParams<Cpu> today; a CUDA compute space needs device -> host copies for them (not done
/// yet).
///
/// Persistent buckets (`stage3_param_persistence_threshold`) keep their gathered buffer in the
/// compute space, as DeepSpeed keeps persistent parameters on the device: they are small and used
/// by every step; only their shard is offloaded (re-staged once per update, at publish). hpZ's
/// secondary shard (zero_hpz_partition_size) stays in the compute space too: it exists to make the
/// backward's gathers cheap, which host memory would undo.

#include <cstddef>

#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/offload/nvme_shard.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/zero/concepts.hpp"
#include "zerotk/zero/params/compute_shard.hpp"

namespace zerotk::offload {

template <class T, class Ops>
class PinnedShard {
 public:
  using Options = zero::NoHomeOptions;

  PinnedShard(Ops&, const zero::BucketLayout& layout, int /*rank*/, MemoryLedger* ledger, const Options&)
      : layout_(&layout), shard_(layout.partition_numel(), MemoryCategory::params16, ledger) {}

  T* data() noexcept { return shard_.data(); }
  /// Stages this rank's block of bucket k into its slot of the gather buffer (copy_from_host).
  const T* gather_source(Ops& ops, std::size_t k, T* slot) {
    const zero::Bucket& b = layout_->buckets()[k];
    ops.copy_from_host(shard_.data() + b.part_offset, slot, b.block);
    return slot;
  }

 private:
  const zero::BucketLayout* layout_;
  PinnedTrackedBuffer<T> shard_;
};

/// ShardHomeOf<Tag>: the shard home an OffloadParams<Tag> policy selects (the tag picks a type).
///   OffloadParams<None>  zero::ComputeShard   the compute space
///   OffloadParams<Cpu>   PinnedShard          page-locked host memory
///   OffloadParams<Nvme>  NvmeShard            a file on disk (offload/nvme_shard.hpp)
template <class Tag>
struct ShardHomeOf {
  static_assert(dependent_false<Tag>, "offload::ShardHomeOf: no shard home for this OffloadParams tag");
};
template <>
struct ShardHomeOf<None> {
  template <class T, class Ops>
  using type = zero::ComputeShard<T, Ops>;
};
template <>
struct ShardHomeOf<Cpu> {
  template <class T, class Ops>
  using type = PinnedShard<T, Ops>;
};
template <>
struct ShardHomeOf<Nvme> {
  template <class T, class Ops>
  using type = NvmeShard<T, Ops>;
};

namespace detail {
template <class H, class T, class Ops>
struct checked_home {
  static_assert(zero::check_shard_home_v<H, T, Ops>);
  using type = H;
};
}  // namespace detail

/// The shard home OffloadParams<Tag> selects for elements T, checked against zero::ShardHome
/// (zero/concepts.hpp) here, where the tag picks it.
template <class Tag, class T, class Ops>
using shard_home_t = typename detail::checked_home<typename ShardHomeOf<Tag>::template type<T, Ops>, T, Ops>::type;

}  // namespace zerotk::offload
