#pragma once
/// \file zerotk/zero/params/bucket_gather.hpp
/// The parameter path of stages 1 and 2: every rank holds the whole flat parameter buffer for
/// forward and backward but updates only its own block of each bucket; after the update each
/// bucket's blocks are all-gathered, in forward order (the first layer's bucket first), so that with
/// `overlap_param_gather` the next forward can start as soon as its own buckets have arrived.
///
/// The source of the gather is the gradient path's choice: stage 1 updates its blocks in place in
/// the flat buffer (`Source::flat_in_place`), stage 2 writes them into its reduced-gradient
/// partition (`Source::partition`, the shared buffer of PooledBuckets::gather_source()).

#include <cstddef>
#include <functional>
#include <vector>

#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/params/replicated.hpp"

namespace zerotk::zero {

template <class T, class Ops>
class BucketGather {
 public:
  static constexpr bool kResident = true;
  using value_type = T;
  using Options = ParamPathOptions<>;

  BucketGather(const PathContext<Ops>& c, const Options& o)
      : c_(c),
        params_(c.ops->template allocate<T>(c.layout->flat_numel(), MemoryCategory::params16, c.ledger)),
        inflight_(c.layout->buckets().size()),
        gathering_(c.layout->buckets().size(), 0),
        overlap_(o.overlap_param_gather) {}

  T* params() { return params_.data(); }
  T* values(std::size_t k) { return params_.data() + c_.layout->buckets()[k].flat_offset; }
  /// This rank's block of bucket k, where the fp32 master is initialised from.
  T* owned_values(std::size_t k) { return params_.data() + c_.layout->block_flat_offset(k, c_.rank()); }
  /// f(const T* block) over owned_values(k) (the form every partitioned path has).
  template <class F>
  void read_owned(std::size_t k, F&& f) {
    f(static_cast<const T*>(owned_values(k)));
  }

  /// Stage 1: in place, this rank's blocks of the flat buffer. Stage 2 gathers from its own
  /// partition buffer instead (set_partition_source).
  OptimizerOut<T> optimizer_out() { return source_ ? OptimizerOut<T>{source_, true} : OptimizerOut<T>{params_.data(), false}; }
  void set_partition_source(T* partition) { source_ = partition; }

  template <class OnBucket>
  void publish(OnBucket&& on_bucket) {
    on_bucket_ = on_bucket;
    const auto buckets = c_.layout->buckets();
    for (std::size_t k = buckets.size(); k-- > 0;) {
      const Bucket& b = buckets[k];
      const T* send = source_ ? source_ + b.part_offset : params_.data() + c_.layout->block_flat_offset(k, c_.rank());
      // (void): nvcc warns that the assignment's Work& result is discarded; the Work itself is kept.
      static_cast<void>(inflight_[k] = c_.comm->all_gather(send, params_.data() + b.flat_offset, b.block, dtype_of_v<T>));
      gathering_[k] = 1;
      ++pending_;
    }
    if (!overlap_) synchronize();
  }

  void wait(std::size_t k) {
    if (!gathering_[k]) return;
    gathering_[k] = 0;
    --pending_;
    inflight_[k].wait();
    if (on_bucket_) on_bucket_(k);
  }
  void synchronize() {
    if (pending_ == 0) return;
    for (std::size_t k = gathering_.size(); k-- > 0;) wait(k);
  }
  /// The optimizer writes plain memory: nothing to commit or take back.
  void commit_update() noexcept {}
  void abort_update() noexcept {}
  std::size_t pending() const noexcept { return pending_; }
  void drain_quietly() noexcept {
    for (auto& w : inflight_) {
      try {
        w.wait();
      } catch (...) {
      }
    }
  }

 private:
  PathContext<Ops> c_;
  typename Ops::template Buffer<T> params_;  // [flat_numel]
  std::vector<comm::Work> inflight_;         // [bucket]
  std::vector<char> gathering_;              // [bucket] gather in flight
  std::function<void(std::size_t)> on_bucket_;
  T* source_ = nullptr;
  std::size_t pending_ = 0;
  bool overlap_ = false;
};

}  // namespace zerotk::zero
