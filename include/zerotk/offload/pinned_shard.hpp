#pragma once
/// \file zerotk/offload/pinned_shard.hpp
/// PinnedShard: OffloadParams<Cpu>'s home for stage 3's parameter shard (DeepSpeed
/// `offload_param.device: cpu`). The shard (this rank's block of every bucket, [partition_numel] of
/// the working precision, or fp32 for the fp32-kept group) lives in page-locked host memory
/// (core/pinned_host_space.hpp, ledger space pinned_host, category params16; registered with the
/// device for its copies, offload/registered_host.hpp), not in the compute space. A bucket's block
/// reaches the compute space just before its all-gather:
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
/// (FlatGroup::prepare_update through FetchOnDemand::optimizer_out), where the step runs on the
/// host (Offload<Cpu>, Offload<Nvme>), so the values land where they live; so do a loaded state's
/// (restore_params_from_master). Initial values and GatherScope writes reach it through
/// FetchOnDemand's write_owned(k, f).
///
/// On a host compute space (Device<Host>) the shard is addressable (data()): the engine points into
/// it, and Offload<None>'s step writes it too. On a device (Device<Cuda>, Device<HostAsync>) the
/// device's kernels cannot address host memory, so the home is read and written by block, as a
/// swapped one is (zero/params/compute_shard.hpp): read(k, f) and write(k, f) hand f the block in
/// host memory (FetchOnDemand stages it through the compute space for the engine's kernels), and the
/// optimizer's output goes through writer(), a zero::MemoryWriter (a copy into the shard, which
/// cannot fail: the stores step in one pass). Offload<None> steps on the device and has no host
/// values to write: engine/compat.hpp refuses it with OffloadParams<Cpu> there.
///
/// Persistent buckets (`stage3_param_persistence_threshold`) keep their gathered buffer in the
/// compute space, as DeepSpeed keeps persistent parameters on the device: they are small and used
/// by every step; only their shard is offloaded (re-staged once per update, at publish). hpZ's
/// secondary shard (zero_hpz_partition_size) stays in the compute space too: it exists to make the
/// backward's gathers cheap, which host memory would undo.

#include <cstddef>
#include <cstring>

#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/offload/nvme_shard.hpp"
#include "zerotk/offload/registered_host.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/zero/concepts.hpp"
#include "zerotk/zero/params/compute_shard.hpp"

namespace zerotk::offload {

template <class T, class Ops>
class PinnedShard {
  static constexpr bool kHostCompute = Ops::Space::host_accessible;

 public:
  using Options = zero::NoHomeOptions;

  /// The optimizer's output on a device (zero::MemoryWriter): owned offsets, host values.
  class Writer {
   public:
    using value_type = T;
    static constexpr bool kInMemory = true;
    explicit Writer(PinnedShard& s) : s_(&s) {}
    void write(std::size_t at, const T* host, std::size_t n) {
      if (n) std::memcpy(s_->shard_.data() + at, host, n * sizeof(T));
    }
    void end_sub_group() noexcept {}

   private:
    PinnedShard* s_;
  };

  PinnedShard(Ops& ops, const zero::BucketLayout& layout, int /*rank*/, MemoryLedger* ledger, const Options&)
      : layout_(&layout),
        shard_(layout.partition_numel(), MemoryCategory::params16, ledger),
        registered_(ops, shard_.data(), shard_.size() * sizeof(T)),
        writer_(*this) {}
  PinnedShard(const PinnedShard&) = delete;
  PinnedShard& operator=(const PinnedShard&) = delete;

  /// The shard, for a host compute space's kernels.
  T* data() noexcept
    requires kHostCompute
  {
    return shard_.data();
  }
  /// Stages this rank's block of bucket k into its slot of the gather buffer (copy_from_host).
  const T* gather_source(Ops& ops, std::size_t k, T* slot) {
    ops.copy_from_host(block(k), slot, layout_->buckets()[k].block);
    return slot;
  }

  /// f(const T* block): block k, in host memory (a device's home).
  template <class F>
    requires(!kHostCompute)
  void read(std::size_t k, F&& f) {
    f(static_cast<const T*>(block(k)));
  }
  /// f(T* block) writes all of block k, in host memory (a device's home).
  template <class F>
    requires(!kHostCompute)
  void write(std::size_t k, F&& f) {
    f(block(k));
  }
  Writer& writer() noexcept
    requires(!kHostCompute)
  {
    return writer_;
  }
  /// The writer wrote in place: nothing to make current, nothing to drop.
  void commit() noexcept {}
  void abort() noexcept {}

 private:
  T* block(std::size_t k) noexcept { return shard_.data() + layout_->buckets()[k].part_offset; }

  const zero::BucketLayout* layout_;
  PinnedTrackedBuffer<T> shard_;
  RegisteredHost<Ops> registered_;  // with the device, for its copies (gather_source)
  Writer writer_;
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
