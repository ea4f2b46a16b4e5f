#pragma once
/// \file zerotk/zero/params/fetch_on_demand.hpp
/// Stage 3's parameter path: each rank keeps only its shard of the 16-bit parameters (block r of every
/// bucket, `partition_numel` elements) and gathers a bucket's full values into a pool buffer when a
/// layer needs them. The engine's fetch schedule (engine/fetch_sharded.hpp) decides when:
///
///   fetch(k)      start the all-gather of bucket k into a free pool buffer (no-op if resident)
///   wait(k)       the gather has arrived: the bucket's Params are bound to it (on_residency)
///   acquire(k) / release(k)   a scope's hold; a bucket nobody holds may be evicted
///   evict(k)      the buffer goes back to the pool and the bucket's Params are unbound (null data)
///
/// Persistent buckets (parameters under `stage3_param_persistence_threshold`) have a buffer of their
/// own, are gathered once after every update (publish) and never evicted.
///
/// The pool: buffers of the largest non-persistent bucket's size, created on first need and reused
/// for the life of the engine (no allocation in steady state); the ledger shows them under
/// MemoryCategory::gathered. The optimizer writes the new values into the shard in place
/// (owned-shaped), so publication only has to regather the persistent buckets: every other bucket
/// is fetched fresh by the next scope that needs it.
///
/// Where the shard lives is the `Home` parameter (compute_shard.hpp): the compute space
/// (OffloadParams<None>), page-locked host memory (offload/pinned_shard.hpp, OffloadParams<Cpu>) or
/// a file (offload/nvme_shard.hpp, OffloadParams<Nvme>); the last two first stage this rank's block
/// into its own slot of the gather buffer, then gather in place. The shard is read and written
/// through read_owned(k, f) / write_owned(k, f), which work for every home; an addressable home
/// also gives a pointer (owned_values(k)). The optimizer's output is optimizer_out() and
/// ends with commit_update() (or abort_update() when the step failed): a swapped home hands out a
/// writer there and makes its blocks current only at the commit.
///
/// qwZ (`PathContext::weight_gather` quantized): the gathers the layers' scopes start move int8 blocks
/// (compress/quantized_collectives.hpp, complete on return) and the bucket holds the dequantized
/// values, the same on every rank; fetch(k, exact = true) (Engine::gather()) and the persistent
/// buckets gather the values themselves. With hpZ the secondary slice keeps what the world's gather
/// gave, so the backward computes with the forward's weights.
///
/// hpZ (`PathContext::group_comm` set, zero/params/secondary_shard.hpp): a bucket gathered over the
/// world also refreshes this rank's secondary slice, and while that slice is current the next gather
/// of the bucket (the backward's) runs on the group communicator instead. Every accessor through
/// which the shard can be written marks the slices stale.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/params/compute_shard.hpp"
#include "zerotk/zero/params/replicated.hpp"
#include "zerotk/zero/params/secondary_shard.hpp"

namespace zerotk::zero {

template <class T, class Ops, class Home = ComputeShard<T, Ops>>
class FetchOnDemand {
 public:
  /// Buckets live only while fetched: a parameter has no values outside its layer's scopes.
  static constexpr bool kResident = false;
  using value_type = T;
  using home_type = Home;
  using Options = ParamPathOptions<typename Home::Options>;

  FetchOnDemand(const PathContext<Ops>& c, const Options& o)
      : c_(c),
        shard_(*c.ops, *c.layout, c.rank(), c.ledger, o.home),
        state_(c.layout->buckets().size()),
        secondary_quantized_(c.layout->buckets().size(), 0) {
    const auto buckets = c.layout->buckets();
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      if (k < o.persistent.size() && o.persistent[k]) {
        state_[k].persistent = true;
        state_[k].own = static_cast<int>(persistent_.size());
        persistent_.push_back(c.ops->template allocate<T>(buckets[k].numel, MemoryCategory::gathered, c.ledger));
      } else {
        slot_numel_ = std::max(slot_numel_, buckets[k].numel);
      }
    }
    if (c.group_comm) secondary_.emplace(*c.layout, *c.ops, *c.group_comm, c.ledger, o.persistent);
  }

  /// Called with (k, values) when bucket k's gathered values become usable, and (k, nullptr) when it
  /// is evicted. The engine's bindings point the bucket's Params there.
  void on_residency(std::function<void(std::size_t, T*)> f) { on_residency_ = std::move(f); }

  /// Whether the home is memory the engine can point into (else it is read and written by block).
  static constexpr bool kAddressable = requires(Home& h) { h.data(); };

  /// This rank's block of bucket k, at `buckets()[k].part_offset` of the shard (addressable homes).
  /// (It may be written through: the secondary slice it covers goes stale.)
  T* owned_values(std::size_t k) noexcept
    requires kAddressable
  {
    if (secondary_) secondary_->invalidate(k);
    return shard_.data() + c_.layout->buckets()[k].part_offset;
  }
  /// f(const T* block): this rank's block of bucket k (b.block elements), in the compute space (a
  /// swapped home: in its staging, read from the file; on a device, copied on into device staging).
  template <class F>
  void read_owned(std::size_t k, F&& f) {
    if constexpr (kAddressable) {
      f(static_cast<const T*>(shard_.data() + c_.layout->buckets()[k].part_offset));
    } else if constexpr (Ops::Space::host_accessible) {
      shard_.read(k, std::forward<F>(f));
    } else {
      shard_.read(k, [&](const T* host) {
        T* block = device_staging();
        c_.ops->copy_from_host(host, block, c_.layout->buckets()[k].block);
        f(static_cast<const T*>(block));
      });
    }
  }
  /// f(T* block) writes all of this rank's block of bucket k; then it is the shard's (a swapped
  /// home: f writes its staging, which then goes to the file; on a device, f writes device staging,
  /// copied to the home's block).
  template <class F>
  void write_owned(std::size_t k, F&& f) {
    if (secondary_) secondary_->invalidate(k);
    if constexpr (kAddressable) {
      f(shard_.data() + c_.layout->buckets()[k].part_offset);
    } else if constexpr (Ops::Space::host_accessible) {
      shard_.write(k, std::forward<F>(f));
    } else {
      T* block = device_staging();
      f(block);
      shard_.write(k, [&](T* host) { c_.ops->copy_to_host(block, host, c_.layout->buckets()[k].block); });
    }
  }
  /// Where the optimizer writes (owned-shaped): the shard itself, or a swapped home's writer.
  auto optimizer_out() {
    if (secondary_) secondary_->invalidate();
    if constexpr (kAddressable) {
      return OptimizerOut<T>{shard_.data(), true};
    } else {
      return OptimizerOut<typename Home::Writer>{&shard_.writer(), true};
    }
  }
  /// The optimizer's output is complete (a swapped home makes it current) or abandoned.
  void commit_update() {
    if constexpr (!kAddressable) shard_.commit();
  }
  void abort_update() noexcept {
    if constexpr (!kAddressable) shard_.abort();
  }
  /// hpZ: the secondary shard, if this path keeps one.
  const SecondaryShard<T, Ops>* secondary() const noexcept { return secondary_ ? &*secondary_ : nullptr; }

  bool resident(std::size_t k) const noexcept { return state_[k].own >= 0 && !state_[k].stale; }
  int holds(std::size_t k) const noexcept { return state_[k].holds; }
  bool persistent(std::size_t k) const noexcept { return state_[k].persistent; }
  /// Bucket k's gathered values (after wait(k)), or null when it is not resident.
  T* values(std::size_t k) noexcept { return resident(k) ? buffer(k) : nullptr; }
  /// Elements of the non-persistent buckets resident now (in pool buffers).
  std::size_t live_numel() const noexcept { return live_numel_; }
  /// Elements of the resident buckets some scope holds (the rest is prefetched or kept for reuse).
  std::size_t held_numel() const noexcept { return held_numel_; }

  /// Homes that read a block ahead of its fetch (offload/nvme_shard.hpp's read-ahead).
  static constexpr bool kStagesAhead = requires(Home& h, std::span<const std::size_t> next) { h.stage_ahead(next); };
  /// How many blocks the home can read ahead (0: none).
  std::size_t stage_capacity() const noexcept {
    if constexpr (kStagesAhead) {
      return shard_.stage_capacity();
    } else {
      return 0;
    }
  }
  /// Whether fetching bucket k now would read its block from the home's file: not resident or in
  /// flight, not persistent (regathered at publish), not due from hpZ's secondary shard, not kept in
  /// host memory by the home (max_in_cpu).
  bool reads_home(std::size_t k) const noexcept {
    if (resident(k) || state_[k].persistent || (secondary_ && secondary_->current(k))) return false;
    if constexpr (kStagesAhead) {
      return shard_.reads_file(k);
    } else {
      return true;
    }
  }
  /// The buckets the fetch schedule expects next (nearest first): the home reads their blocks ahead.
  void stage_ahead(std::span<const std::size_t> next) {
    if constexpr (kStagesAhead) shard_.stage_ahead(next);
  }
  /// The home itself (tests and statistics).
  const Home& home() const noexcept { return shard_; }

  /// Starts gathering bucket k unless it is resident or in flight. `exact`: the values must be the
  /// shards' own (Engine::gather() scopes), never qwZ's dequantized ones; a bucket resident with
  /// those is gathered again.
  void fetch(std::size_t k, bool exact = false) {
    State& s = state_[k];
    if (resident(k) && exact && s.quantized) {
      if (s.holds > 0) {
        throw usage_error("a gather scope needs the exact values of a bucket a layer scope holds quantized (qwZ); "
                          "close the layer's scopes first",
                          "FetchOnDemand", std::to_string(k));
      }
      evict(k);
    }
    if (resident(k)) return;
    exact_ = exact;
    if (s.persistent) {  // its own buffer: gathered on first use and again after every update
      s.stale = false;
      try {
        start_gather(k);
      } catch (...) {
        s.stale = true;  // (a shard read that failed): the buffer does not hold the values
        throw;
      }
      return;
    }
    if (free_.empty()) {
      pool_.push_back(c_.ops->template allocate<T>(slot_numel_, MemoryCategory::gathered, c_.ledger));
      free_.push_back(static_cast<int>(pool_.size() - 1));
    }
    s.own = free_.back();
    s.stale = false;
    free_.pop_back();
    live_numel_ += c_.layout->buckets()[k].numel;
    try {
      start_gather(k);
    } catch (...) {  // nothing was started: the bucket is not resident, the buffer goes back
      free_.push_back(std::exchange(s.own, -1));
      live_numel_ -= c_.layout->buckets()[k].numel;
      throw;
    }
  }

  /// Waits for bucket k's gather if it is in flight; then its Params see the values.
  void wait(std::size_t k) {
    State& s = state_[k];
    if (!s.gathering) return;
    s.gathering = false;
    --pending_;
    s.work.wait();
    if (s.from_world && secondary_) {
      secondary_->keep(k, buffer(k));
      secondary_quantized_[k] = s.quantized;  // its slice holds what the gather gave
    }
    if (on_residency_) on_residency_(k, buffer(k));
  }

  void acquire(std::size_t k, bool exact = false) {
    fetch(k, exact);
    if (state_[k].holds++ == 0 && !state_[k].persistent) held_numel_ += c_.layout->buckets()[k].numel;
    wait(k);
  }
  void release(std::size_t k) {
    State& s = state_[k];
    if (s.holds <= 0) throw usage_error("bucket released more often than acquired", "FetchOnDemand", std::to_string(k));
    if (--s.holds == 0 && !s.persistent) held_numel_ -= c_.layout->buckets()[k].numel;
  }

  /// Returns bucket k's buffer to the pool (a no-op for persistent buckets and for held ones).
  void evict(std::size_t k) {
    State& s = state_[k];
    if (s.persistent || s.holds > 0 || s.own < 0) return;
    if (s.gathering) wait(k);  // the buffer is being written: it can only go back once complete
    free_.push_back(s.own);
    s.own = -1;
    live_numel_ -= c_.layout->buckets()[k].numel;
    if (on_residency_) on_residency_(k, nullptr);
  }

  /// After the update the shard holds new values: every non-persistent bucket still resident is
  /// stale and evicted; persistent buckets are gathered again.
  template <class OnBucket>
  void publish(OnBucket&& on_bucket) {
    synchronize();
    if (secondary_) secondary_->invalidate();
    for (std::size_t k = 0; k < state_.size(); ++k) {
      if (!state_[k].persistent) evict(k);
    }
    for (std::size_t k = state_.size(); k-- > 0;) {
      if (state_[k].persistent) {
        state_[k].stale = true;
        fetch(k);
      }
    }
    for (std::size_t k = state_.size(); k-- > 0;) {
      if (state_[k].persistent) {
        wait(k);
        on_bucket(k);
      }
    }
  }

  void synchronize() {
    if (pending_ == 0) return;
    for (std::size_t k = state_.size(); k-- > 0;) wait(k);
  }
  std::size_t pending() const noexcept { return pending_; }
  void drain_quietly() noexcept {
    for (State& s : state_) {
      if (!s.gathering) continue;
      try {
        s.work.wait();
      } catch (...) {
      }
      s.gathering = false;
    }
    pending_ = 0;
  }

 private:
  struct State {
    comm::Work work;
    int own = -1;          ///< pool buffer (or persistent buffer) index, -1: not resident
    int holds = 0;         ///< open scopes holding the bucket
    bool gathering = false;
    bool persistent = false;
    bool stale = true;     ///< persistent buckets: the buffer does not hold the shards' current values
    bool from_world = false;  ///< the gather in flight reads the primary shards (hpZ: refresh the slice)
    bool quantized = false;   ///< the values are qwZ's dequantized ones
  };

  T* buffer(std::size_t k) noexcept {
    const State& s = state_[k];
    if (s.own < 0) return nullptr;
    return (s.persistent ? persistent_ : pool_)[static_cast<std::size_t>(s.own)].data();
  }

  void start_gather(std::size_t k) {
    const Bucket& b = c_.layout->buckets()[k];
    State& s = state_[k];
    const bool from_secondary = secondary_ && secondary_->current(k) && !(exact_ && secondary_quantized_[k]);
    s.from_world = !from_secondary;
    if (s.from_world) {
      T* out = buffer(k);
      T* slot = out + static_cast<std::size_t>(c_.rank()) * b.block;  // in place when the home stages
      const T* send = shard_.gather_source(*c_.ops, k, slot);
      // qwZ: the layers' gathers as int8 blocks (complete on return); gather scopes and persistent
      // buckets exact.
      s.quantized = c_.weight_gather.quantized() && !exact_ && !s.persistent;
      const WeightGather gather = s.quantized ? c_.weight_gather : WeightGather{};
      // (void): nvcc takes the Work& an assignment returns for a discarded [[nodiscard]] Work.
      (void)(s.work = gather.all_gather(*c_.comm, send, out, b.block, quantized_scratch_));
    } else {
      s.quantized = secondary_quantized_[k];
      (void)(s.work = secondary_->gather(k, buffer(k)));
    }
    s.gathering = true;
    ++pending_;
  }

  /// A device's staging of one block between a host home and the compute space's kernels (the
  /// largest block; made on first use: initial values, load_state, GatherScope writes). Its copies
  /// are ordered on the compute stream, and a copy from or to the host waits for what came before,
  /// so one buffer serves every block.
  T* device_staging() {
    if (!staging_) {
      std::size_t n = 0;
      for (const Bucket& b : c_.layout->buckets()) n = std::max(n, b.block);
      staging_.emplace(c_.ops->template allocate<T>(n, MemoryCategory::other, c_.ledger));
    }
    return staging_->data();
  }

  PathContext<Ops> c_;
  Home shard_;                                               // [partition_numel], where Home keeps it
  std::optional<typename Ops::template Buffer<T>> staging_;  // a device's staging of a host home's block
  std::vector<typename Ops::template Buffer<T>> pool_;       // [pool buffers][slot_numel_]
  std::vector<typename Ops::template Buffer<T>> persistent_; // [persistent buckets][bucket numel]
  std::vector<int> free_;                                    // pool buffers holding no bucket
  std::vector<State> state_;                                 // [bucket]
  std::function<void(std::size_t, T*)> on_residency_;
  std::optional<SecondaryShard<T, Ops>> secondary_;          // hpZ only
  std::size_t slot_numel_ = 0, live_numel_ = 0, held_numel_ = 0, pending_ = 0;
  std::vector<std::uint8_t> quantized_scratch_;  // qwZ: the W int8 records of one gather
  std::vector<char> secondary_quantized_;        // [bucket] hpZ: the slice came from a qwZ gather
  bool exact_ = false;                           // the fetch being started needs exact values
};

}  // namespace zerotk::zero
